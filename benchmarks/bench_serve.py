"""How long `torch-neuronx plan --serve` takes for an 8B and a 70B model, imports included.

The target: under 10 s wall per plan on an idle 2-core machine. Each variant is a fresh process, timed from start
to exit, in alternating rounds beside a bare `python -c "import torch, torch_neuronx"` (the floor every CLI call
pays); the figures are medians and the ratio to that floor. Each plan searches every even TP degree of a
trn1.32xlarge over a 2,000-request traffic file with 4 buckets per phase.

    python benchmarks/bench_serve.py [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from torch_neuronx.testing.bench import medians, report
from torch_neuronx.testing.plan import LLAMA3_8B, LLAMA31_70B


def wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return time.perf_counter() - start


def traffic(path: Path, n: int = 2000) -> Path:
    rng = random.Random(0)
    pairs = [[rng.choice([rng.randint(30, 300), rng.randint(800, 4000)]), rng.randint(20, 500)] for _ in range(n)]
    path.write_text(json.dumps(pairs))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        lengths = traffic(tmp / "traffic.json")
        variants: dict[str, list[str]] = {"import floor": [sys.executable, "-c", "import torch, torch_neuronx"]}
        for name, config in (("8B", LLAMA3_8B), ("70B", LLAMA31_70B)):
            (tmp / name).mkdir()
            (tmp / name / "config.json").write_text(json.dumps(config))
            variants[f"plan --serve {name}"] = [sys.executable, "-m", "torch_neuronx.tools.cli", "plan",
                                                str(tmp / name), "--serve", "--instance", "trn1.32xlarge",
                                                "--lengths", str(lengths), "--batch", "4"]
        samples: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(args.rounds):
            for name, argv in variants.items():
                samples[name].append(wall(argv))
    med = medians(samples)
    floor = med["import floor"]
    result: dict[str, Any] = {k: {"seconds": round(v, 2), "over_import_floor": round(v / floor, 2)}
                              for k, v in med.items()}
    report(result, args.json)


if __name__ == "__main__":
    main()
