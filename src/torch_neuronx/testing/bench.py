"""Timing for the benchmarks: side by side in one run, as ratios, because these machines are shared and noisy.

Variants are timed in alternating rounds (the order rotates each round), so
the machine's noise hits every variant alike; medians are reported, and the
ratio of medians is the figure that goes into the docs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable


def timed(fn: Callable[[], object], inner: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds per call of `fn`, over `inner` calls: wall time, or with ``clock=time.thread_time`` this thread's
    CPU time (which a busy machine's waits for a core do not inflate: steadier for single-threaded work)."""
    t0 = clock()
    for _ in range(inner):
        fn()
    return (clock() - t0) / inner


def interleaved(steps: dict[str, Callable[[], object]], rounds: int, inner: int,
                warmup: int = 2, clock: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:
    """Seconds per call of each step, one sample per round, the steps' order rotating round by round."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    names = list(steps)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            samples[name].append(timed(steps[name], inner, clock))
    return samples


def medians(samples: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in samples.items()}


def side_by_side(cpu: Callable[[], object], dev: Callable[[], object], inner: int, reps: int,
                 clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """Median seconds per call of a CPU and a neuron variant, timed in alternating rounds."""
    m = medians(interleaved({"cpu": cpu, "neuron": dev}, reps, inner, warmup=1, clock=clock))
    return m["cpu"], m["neuron"]


def report(results: object, json_path: str | None, show: bool = True) -> None:
    """A benchmark's results: printed as JSON (unless the benchmark prints its own table), and written to
    ``--json`` when given."""
    import json

    if show:
        print(json.dumps(results, indent=2))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=2)


def arguments(doc: str) -> argparse.ArgumentParser:
    """A benchmark's command line with the options they share: --quick (a smoke run), --threads (intra-op
    threads on both sides, 1 by default: steadier figures) and --json (also write the results there)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads on both sides")
    parser.add_argument("--json", help="also write the results here")
    return parser


def parse(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Parse the command line and apply --threads."""
    import torch

    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    return args
