"""The caching allocator, side by side with CPU in one run: elementwise ops by size, an alloc/free pair,
eager training steps of a small LM (static shapes, variable lengths, padded to 128), and fragmentation.

Each case alternates CPU and neuron rounds and reports the ratio of medians
(neuron / CPU). Targets (issue "Device memory as on Trainium"): elementwise
1 KiB-16 MiB <= 1.0x (the cache spares the page faults CPU's malloc pays),
training steps <= 1.05x; the peak reserved / peak allocated ratio of the
variable-length run measures fragmentation. The getters case times
``memory_allocated()`` (one statistic, read directly) against reading it out
of ``memory_stats()`` (the whole dictionary), the way it was read before.

    python benchmarks/bench_memory.py [--quick] [--json out.json]
"""

from __future__ import annotations

from collections.abc import Callable

import torch

import torch_neuronx  # noqa: F401
from torch_neuronx.testing.bench import arguments, parse, report, side_by_side
from torch_neuronx.testing.models import TinyLM, lm_batch

KIB = 1 << 10


def elementwise_cases(quick: bool) -> dict[str, dict[str, float]]:
    results = {}
    for nbytes in (KIB, 16 * KIB, 256 * KIB, 1 << 20, 4 << 20, 16 << 20):
        n = nbytes // 4
        cpu, dev = torch.randn(n), torch.randn(n, device="neuron")
        inner = max(4, min(2000, (64 << 20) // nbytes))
        c, d = side_by_side(lambda cpu=cpu: cpu * 2.0, lambda dev=dev: dev * 2.0, inner // (4 if quick else 1),
                            5 if quick else 15)
        results[f"x * 2.0, {nbytes // KIB} KiB"] = {"cpu_us": c * 1e6, "neuron_us": d * 1e6, "ratio": d / c}
    return results


def alloc_free(quick: bool) -> dict[str, float]:
    """One torch.empty + free of 64 KiB: the allocator's own cost (CPU's malloc is the reference)."""
    c, d = side_by_side(lambda: torch.empty(16 * KIB), lambda: torch.empty(16 * KIB, device="neuron"),
                        2000 if quick else 20000, 5 if quick else 15)
    return {"cpu_us": c * 1e6, "neuron_us": d * 1e6, "ratio": d / c}


def lm_step(device: str, lengths: Callable[[int], int], batch: int, pad_to: int | None) -> Callable[[], None]:
    torch.manual_seed(0)
    model = TinyLM(vocab=512, dim=128, heads=4, layers=2).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step_no = [0]

    def step() -> None:
        length = lengths(step_no[0])
        if pad_to:
            length = -(-length // pad_to) * pad_to
        step_no[0] += 1
        ids = lm_batch(batch, length + 1, 512, seed=step_no[0]).to(device)
        loss = torch.nn.functional.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def training_cases(quick: bool) -> dict[str, dict[str, float]]:
    variable = [37, 201, 64, 150, 99, 256, 12, 180, 77, 230, 128, 45]
    cases = {
        "static 8x128": (lambda i: 128, None),
        "variable lengths": (lambda i: variable[i % len(variable)], None),
        "padded to 128": (lambda i: variable[i % len(variable)], 128),
    }
    results = {}
    for name, (lengths, pad_to) in cases.items():
        c, d = side_by_side(lm_step("cpu", lengths, 8, pad_to), lm_step("neuron", lengths, 8, pad_to),
                            2 if quick else 6, 3 if quick else 9)
        results[name] = {"cpu_ms": c * 1e3, "neuron_ms": d * 1e3, "ratio": d / c}
    return results


def fragmentation(quick: bool) -> dict[str, float]:
    """Peak reserved / peak allocated over a variable-length training run."""
    variable = [37, 201, 64, 150, 99, 256, 12, 180, 77, 230, 128, 45]
    torch.neuron.empty_cache()
    torch.neuron.reset_peak_memory_stats()
    step = lm_step("neuron", lambda i: variable[i % len(variable)], 8, None)
    for _ in range(12 if quick else 48):
        step()
    s = torch.neuron.memory_stats()
    return {"peak_allocated_mib": s["allocated_bytes.all.peak"] / 2**20,
            "peak_reserved_mib": s["reserved_bytes.all.peak"] / 2**20,
            "reserved_over_allocated": s["reserved_bytes.all.peak"] / s["allocated_bytes.all.peak"]}


def getters(quick: bool) -> dict[str, float]:
    """Microseconds per call of the single-value getter against the full statistics dictionary."""
    from torch_neuronx.testing.bench import interleaved, medians

    keep = [torch.ones(n, device="neuron") for n in (10, 5000, 1 << 20)]
    m = medians(interleaved({
        "memory_stats": lambda: torch.neuron.memory_stats()["allocated_bytes.all.current"],
        "memory_allocated": torch.neuron.memory_allocated,
        "max_memory_reserved": torch.neuron.max_memory_reserved,
    }, 5 if quick else 15, 200 if quick else 2000))
    del keep
    return {"memory_stats_us": m["memory_stats"] * 1e6, "memory_allocated_us": m["memory_allocated"] * 1e6,
            "max_memory_reserved_us": m["max_memory_reserved"] * 1e6,
            "speedup": m["memory_stats"] / m["memory_allocated"]}


def main() -> None:
    args = parse(arguments(__doc__))
    results = {"elementwise": elementwise_cases(args.quick), "alloc_free_64KiB": alloc_free(args.quick),
               "training": training_cases(args.quick), "fragmentation": fragmentation(args.quick),
               "getters": getters(args.quick)}
    report(results, args.json)


if __name__ == "__main__":
    main()
