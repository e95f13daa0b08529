"""Eager neuron vs CPU, side by side in one run: per-op overhead, compute-bound ops, a training step.

Each case alternates CPU and neuron repetitions and reports the ratio of
medians (neuron / CPU), so the machine's noise hits both sides alike. Small ops
also get the ratio of CPU time (this thread's), which a busy machine's waits
for a core do not inflate.
Targets (issue 2): small ops <= 1.5x, compute-bound ops <= 1.03x, training step <= 1.05x.

    python benchmarks/bench_eager.py [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch

import torch_neuronx  # noqa: F401
from torch_neuronx.testing.bench import side_by_side as compare
from torch_neuronx.testing.models import DecoderBlock


def training_step(device: str, dim: int) -> Callable[[], object]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(DecoderBlock(dim), DecoderBlock(dim), torch.nn.Linear(dim, 512)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(8, 128, dim, device=device)
    y = torch.randint(0, 512, (8, 128), device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()

    return step


def cases(quick: bool) -> list[tuple[str, str, Callable[[], object], Callable[[], object], int, int]]:
    a, b = torch.randn(16), torch.randn(16)
    da, db = a.neuron(), b.neuron()
    m = torch.randn(64, 64)
    dm = m.neuron()
    idx = torch.tensor([1, 5, 9])
    didx = idx.neuron()
    n = 512 if quick else 1024
    A, B = torch.randn(n, n), torch.randn(n, n)
    dA, dB = A.neuron(), B.neuron()
    x, w = torch.randn(8, 64, 56, 56), torch.randn(64, 64, 3, 3)
    dx, dw = x.neuron(), w.neuron()
    small_inner, reps = (500, 7) if quick else (3000, 11)
    out = [
        ("small", "add (16 elements)", lambda: torch.add(a, b), lambda: torch.add(da, db), small_inner, reps),
        ("small", "mul_ in place (16)", lambda: a.mul_(1.0), lambda: da.mul_(1.0), small_inner, reps),
        ("small", "view + transpose", lambda: m.view(32, 128).t(), lambda: dm.view(32, 128).t(), small_inner, reps),
        ("small", "index with tensor", lambda: m[idx], lambda: dm[didx], small_inner, reps),
        ("compute", f"mm {n}x{n}", lambda: torch.mm(A, B), lambda: torch.mm(dA, dB), 3 if quick else 5, reps),
        ("compute", "conv2d 8x64x56x56, 3x3",
         lambda: torch.nn.functional.conv2d(x, w, padding=1), lambda: torch.nn.functional.conv2d(dx, dw, padding=1),
         2 if quick else 3, reps),
    ]
    dim = 128 if quick else 256
    out.append(("train", f"transformer training step (2 layers, d={dim}, 8x128 tokens)",
                training_step("cpu", dim), training_step("neuron", dim), 1 if quick else 2, reps))
    return out


TARGETS = {"small": 1.5, "compute": 1.03, "train": 1.05}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repetitions")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rows = []
    print(f"{'case':<58} {'cpu':>10} {'neuron':>10} {'ratio':>7} {'cpu-time':>9} {'target':>7}")
    for kind, name, cpu, dev, inner, reps in cases(args.quick):
        c, d = compare(cpu, dev, inner, reps)
        ratio = d / c
        # small ops run on one thread: their CPU-time ratio is the same cost without a busy machine's waits
        cpu_ratio = None
        if kind == "small":
            tc, td = compare(cpu, dev, inner, reps, clock=time.thread_time)
            cpu_ratio = td / tc
        unit, scale = ("us", 1e6) if c < 1e-3 else ("ms", 1e3)
        shown = f"{cpu_ratio:>8.2f}x" if cpu_ratio else f"{'':>9}"
        print(f"{name:<58} {c * scale:>8.2f}{unit} {d * scale:>8.2f}{unit} {ratio:>6.2f}x {shown} "
              f"{TARGETS[kind]:>6.2f}x")
        rows.append({"kind": kind, "case": name, "cpu_s": c, "neuron_s": d, "ratio": ratio,
                     "cpu_time_ratio": cpu_ratio, "target": TARGETS[kind]})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "threads": torch.get_num_threads(), "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()
