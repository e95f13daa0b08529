"""A threaded stress run of the device allocator and its diagnostics.

Allocation from several threads while another toggles memory history, takes
snapshots and churns streams: the mix that once corrupted the heap (the
history ring was swapped without a lock while allocations wrote it). The run
ends by checking that the statistics agree with the snapshot and with each
other. CI runs it for a few seconds (tests/testing/test_memory_stress.py);
``python -m torch_neuronx.testing.memory_stress --seconds 60`` is the long form.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from typing import Any

import torch

MIB = 1 << 20


def _allocate(stop: threading.Event, seed: int, counts: list[int], errors: list[BaseException]) -> None:
    rng = random.Random(seed)
    streams = [torch.neuron.Stream() for _ in range(3)]
    live: list[torch.Tensor] = []
    try:
        while not stop.is_set():
            for _ in range(50):
                if live and rng.random() < 0.45:
                    live.pop(rng.randrange(len(live)))
                    continue
                n = rng.choice([1, 100, 4096, 70_000, 300_000, MIB // 4 + 3, 3 * MIB // 4])
                if rng.random() < 0.3:
                    with torch.neuron.stream(rng.choice(streams)):
                        live.append(torch.empty(n, device="neuron") + 1.0)  # op results: kernel blocks adopted
                else:
                    live.append(torch.ones(n, device="neuron"))
                if len(live) > 40:
                    live.clear()
            if rng.random() < 0.1:
                streams[rng.randrange(len(streams))] = torch.neuron.Stream()  # stream churn
            counts[seed] += 1
    except BaseException as e:  # noqa: BLE001 - reported by the caller
        errors.append(e)


def _diagnose(stop: threading.Event, counts: list[int], errors: list[BaseException]) -> None:
    rng = random.Random(1234)
    modes: list[dict[str, Any]] = [
        {"enabled": "all", "max_entries": 64},
        {"enabled": "all", "max_entries": 5000, "clear_history": True},
        {"enabled": "state"},
        {"enabled": "all", "context": "alloc", "stacks": "python", "skip_actions": ["free_requested"]},
        {"enabled": None},
    ]
    try:
        while not stop.is_set():
            torch.neuron.memory._record_memory_history(**rng.choice(modes))
            if rng.random() < 0.5:
                torch.neuron.memory._snapshot()
            else:
                torch.neuron.memory_stats()
                torch.neuron.memory_allocated()
            counts[-1] += 1
    except BaseException as e:  # noqa: BLE001 - reported by the caller
        errors.append(e)
    finally:
        torch.neuron.memory._record_memory_history(None)


def check_consistent() -> list[str]:
    """Disagreements between the statistics and the snapshot of core 0 (empty when consistent)."""
    problems = []
    stats = torch.neuron.memory_stats(0)
    segments = [s for s in torch.neuron.memory_snapshot() if s["device"] == 0]
    reserved = sum(s["total_size"] for s in segments)
    allocated = sum(b["size"] for s in segments for b in s["blocks"] if b["state"] == "active_allocated")
    if reserved != stats["reserved_bytes.all.current"]:
        problems.append(f"reserved: snapshot {reserved} vs stats {stats['reserved_bytes.all.current']}")
    if allocated != stats["allocated_bytes.all.current"]:
        problems.append(f"allocated: snapshot {allocated} vs stats {stats['allocated_bytes.all.current']}")
    if torch.neuron.memory_allocated(0) != stats["allocated_bytes.all.current"]:
        problems.append("memory_allocated() differs from memory_stats()")
    for s in segments:
        if sum(b["size"] for b in s["blocks"]) != s["total_size"]:
            problems.append(f"segment {s['address']:#x}: blocks do not add up to its size")
    for pool in ("small_pool", "large_pool"):
        if stats[f"allocated_bytes.{pool}.current"] > stats[f"reserved_bytes.{pool}.current"]:
            problems.append(f"{pool}: more allocated than reserved")
    return problems


def run(seconds: float, threads: int = 4) -> dict[str, Any]:
    """Stress for `seconds`; returns the iteration counts and any problems found."""
    baseline = torch.neuron.memory_allocated(0)
    stop = threading.Event()
    counts = [0] * (threads + 1)
    errors: list[BaseException] = []
    workers = [threading.Thread(target=_allocate, args=(stop, i, counts, errors)) for i in range(threads)]
    workers.append(threading.Thread(target=_diagnose, args=(stop, counts, errors)))
    for w in workers:
        w.start()
    deadline = time.monotonic() + seconds
    # Run for the time asked, and at least until every thread has made progress (a loaded machine starts slowly).
    while time.monotonic() < deadline or min(counts) < 2:
        if errors:
            break
        time.sleep(0.05)
    stop.set()
    for w in workers:
        w.join()
    torch.neuron.synchronize()
    problems = [f"{type(e).__name__}: {e}" for e in errors] + check_consistent()
    if torch.neuron.memory_allocated(0) != baseline:  # every thread's tensors are gone: so is their memory
        problems.append(f"allocated {torch.neuron.memory_allocated(0)} bytes after the run, {baseline} before")
    return {"iterations": counts, "problems": problems}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.threads < 1:
        parser.error("--seconds must be positive and --threads at least 1")
    result = run(args.seconds, args.threads)
    print(f"iterations per thread {result['iterations'][:-1]}, diagnostics {result['iterations'][-1]}")
    for p in result["problems"]:
        print("problem:", p)
    print("consistent" if not result["problems"] else "INCONSISTENT")
    return 0 if not result["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
