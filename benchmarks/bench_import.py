"""What the plugin adds to ``import torch``: fresh interpreters, with and without autoload, side by side.

Each round starts one interpreter that imports torch with the plugin
autoloaded and one with ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` (the order
alternates), timing the import inside the child. ``import torch`` itself
varies by tens of milliseconds from run to run, so the plugin's own cost is
measured where it is exact: the second child, after ``import torch``, times
``import torch_neuronx`` (which does all the registration autoload would).
Both children also time their first device tensor (the device initialising:
reading the machine, configuring the cores).

    python benchmarks/bench_import.py [--rounds 15] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

from torch_neuronx.testing.bench import report  # the parent only; children time the imports

CHILD = """
import time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import torch_neuronx
t2 = time.perf_counter()
x = torch.zeros(1, device="neuron")
t3 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2)
"""


def _run(autoload: bool) -> tuple[float, float, float]:
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "1" if autoload else "0"}
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
    import_torch, import_plugin, first_tensor = map(float, out.stdout.split())
    return import_torch, import_plugin, first_tensor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    with_plugin, without, plugin, first = [], [], [], []
    for r in range(args.rounds):
        for autoload in ((True, False) if r % 2 == 0 else (False, True)):
            import_torch, import_plugin, first_tensor = _run(autoload)
            (with_plugin if autoload else without).append(import_torch)
            first.append(first_tensor)
            if not autoload:
                plugin.append(import_plugin)
    ms = lambda values: round(statistics.median(values) * 1e3, 1)  # noqa: E731
    results = {
        "import_torch_ms": ms(without),
        "import_torch_with_autoload_ms": ms(with_plugin),
        "import_torch_neuronx_ms": ms(plugin),
        "first_device_tensor_ms": ms(first),
        "rounds": args.rounds,
    }
    report(results, args.json)


if __name__ == "__main__":
    main()
