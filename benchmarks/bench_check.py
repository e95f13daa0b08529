"""What `torch-neuronx check` costs the job it watches: training steps with the probe on and off, side by side.

Each round starts two child processes, one with ``TORCH_NEURONX_CHECK_DIR``
set (the probe installed at import, as the checker launches jobs) and one
without (the order alternates). Each child trains a tiny decoder LM
(torch_neuronx.testing.models.TinyLM) on the neuron device and times its
steps after warm-up; the figure is the median step time. A second pair times
a forward of many small modules (the probe's global module hooks fire on
each call) to give the per-module-call cost. On a shared, loaded host the
medians drift between children, so two steadier figures come with them: the
median of each round's on/off ratio (its two children ran back to back), and
the time the probe's own step-end work takes inside the job (timed around
it), as a share of the step.

    python benchmarks/bench_check.py [--rounds 5] [--steps 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from torch_neuronx.testing.bench import report

CHILD = """
import sys, time, torch
from torch_neuronx.testing.models import TinyLM, lm_batch
steps = int(sys.argv[1])
probe_s = [0.0]
if "torch_neuronx.tools.check.probe" in sys.modules:
    from torch_neuronx.tools.check import probe as _p
    _active, _end = _p.active(), _p.active().end_step
    def _timed(*a, **k):
        t0 = time.perf_counter(); _end(*a, **k); probe_s[0] += time.perf_counter() - t0
    _active.end_step = _timed
torch.manual_seed(0)
model = TinyLM(dim=128, layers=2).to("neuron")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ids = lm_batch(8, 64).to("neuron")
times = []
for i in range(steps + 3):
    t0 = time.perf_counter()
    loss = torch.nn.functional.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
    opt.zero_grad(); loss.backward(); opt.step()
    times.append(time.perf_counter() - t0)
deep = torch.nn.Sequential(*[torch.nn.Identity() for _ in range(200)])
x = torch.ones(1, device="neuron")
calls = []
for i in range(30):
    t0 = time.perf_counter(); deep(x); calls.append((time.perf_counter() - t0) / 201)
print(sorted(times[3:])[len(times[3:]) // 2], sorted(calls[5:])[len(calls[5:]) // 2], probe_s[0] / (steps + 3))
"""


def child(steps: int, probe: bool) -> tuple[float, float, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_NEURONX_CHECK")}
    with tempfile.TemporaryDirectory() as d:
        if probe:
            env["TORCH_NEURONX_CHECK_DIR"] = d
        out = subprocess.run([sys.executable, "-c", CHILD, str(steps)], env=env, capture_output=True, text=True,
                             check=True)
    step, call, probe_step = map(float, out.stdout.split()[-3:])
    return step, call, probe_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    on: list[tuple[float, float, float]] = []
    off: list[tuple[float, float, float]] = []
    for r in range(args.rounds):
        for probe in ((True, False) if r % 2 == 0 else (False, True)):
            (on if probe else off).append(child(args.steps, probe))
    step_on, step_off = (statistics.median(s for s, _, _ in x) for x in (on, off))
    call_on, call_off = (statistics.median(c for _, c, _ in x) for x in (on, off))
    paired = statistics.median(a[0] / b[0] for a, b in zip(on, off, strict=True))  # each round's pair, adjacent
    probe_step = statistics.median(p for _, _, p in on)  # the probe's own work at each step's end, in the job
    report({"step_ms_probe_off": round(step_off * 1e3, 2), "step_ms_probe_on": round(step_on * 1e3, 2),
            "step_ratio_on_off": round(step_on / step_off, 3), "step_ratio_paired_median": round(paired, 3),
            "probe_ms_per_step": round(probe_step * 1e3, 3),
            "probe_share_of_step": round(probe_step / step_off, 4),
            "module_call_us_probe_off": round(call_off * 1e6, 2), "module_call_us_probe_on": round(call_on * 1e6, 2),
            "rounds": args.rounds, "steps": args.steps}, args.json)


if __name__ == "__main__":
    main()
