"""What torch.profiler costs per op on the neuron device: profiler off, profile(CPU), profile(CPU + PrivateUse1).

A small elementwise op (``x * 2.0``) is timed on neuron tensors and, as the
reference, on CPU tensors, in alternating rounds (the order rotating) so the
machine's noise hits every variant alike; each variant's figure is the median
per-op time, and the ratios are against "profiler off" for the same tensors.
A profiling session is opened around each round's timed calls (its start and
stop are not timed, and a few untimed calls warm it up).

Two phases, because Kineto keeps configuring the device profiler for every
session once a PrivateUse1 session has run (it declines the CPU-only ones; see
docs/profiling.md): the first phase times
off vs profile(CPU) before any PrivateUse1 session in this process; the
second times all three variants after one.

    python benchmarks/bench_profiler.py [--quick] [--json out.json]
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

import torch_neuronx  # noqa: F401
from torch_neuronx.testing.bench import arguments, medians, parse, report, timed

KIB = 1 << 10
VARIANTS: dict[str, Callable[[], contextlib.AbstractContextManager[object]]] = {
    "off": contextlib.nullcontext,
    "cpu": lambda: profile(activities=[ProfilerActivity.CPU]),
    "cpu+device": lambda: profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]),
}


def rounds(
    op: Callable[[], object], variants: list[str], inner: int, reps: int, warmup: int = 5
) -> dict[str, list[float]]:
    """Seconds per op under each variant, one sample per round, the variants' order rotating."""
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(reps):
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        for name in order:
            with VARIANTS[name]():
                for _ in range(warmup):
                    op()
                samples[name].append(timed(op, inner))
    return samples


def case(x: torch.Tensor, variants: list[str], inner: int, reps: int) -> dict[str, float]:
    m = medians(rounds(lambda: x * 2.0, variants, inner, reps))
    out = {f"{name}_us": m[name] * 1e6 for name in variants}
    for name in variants[1:]:
        out[f"{name}/off"] = m[name] / m["off"]
    return out


def main() -> None:
    args = parse(arguments(__doc__))
    inner, reps = (300, 5) if args.quick else (2000, 15)
    sizes = {"1 KiB": KIB // 4, "1 MiB": (1 << 20) // 4}
    tensors = {
        (device, label): torch.randn(n, device=device) for device in ("neuron", "cpu") for label, n in sizes.items()
    }
    results: dict[str, dict[str, dict[str, float]]] = {"before a PrivateUse1 session": {}, "after": {}}
    calls = {"1 KiB": inner, "1 MiB": inner // 8}
    for (device, label), x in tensors.items():  # phase 1: no PrivateUse1 session has run yet
        name = f"{device} x * 2.0, {label}"
        results["before a PrivateUse1 session"][name] = case(x, ["off", "cpu"], calls[label], reps)
    for (device, label), x in tensors.items():
        name = f"{device} x * 2.0, {label}"
        results["after"][name] = case(x, ["off", "cpu", "cpu+device"], calls[label], reps)
    report(results, args.json)


if __name__ == "__main__":
    main()
