"""The shared process runner (torch_neuronx.testing.workers): results, crashes, hangs and stalls, and deadlines."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from torch_neuronx.testing.workers import WorkerPool, run_processes

WORKER = r"""
import os, sys, time
from torch_neuronx.testing.workers import serve

def handle(task, emit):
    kind = task["kind"]
    print("stray output must not break the protocol")
    if kind == "square":
        emit({"step": 1})
        return task["x"] ** 2
    if kind == "raise":
        raise ValueError("bad task")
    if kind == "crash":
        emit({"step": "before the crash"})
        os.abort()
    if kind == "hang":
        emit({"step": "then silence"})
        time.sleep(600)
    if kind == "slow":
        for i in range(6):
            emit({"tick": i})
            time.sleep(0.5)
        return "done"
serve(handle)
"""


def test_pool_results_errors_crashes_and_hangs() -> None:
    with WorkerPool([sys.executable, "-c", WORKER], stall_timeout=3.0) as pool:  # 3 s of silence while working
        events: list[dict] = []
        ok = pool.run({"kind": "square", "x": 7}, timeout=60, on_event=events.append)
        assert ok.ok and ok.value == 49 and events == [{"step": 1}]
        err = pool.run({"kind": "raise"}, timeout=60)
        assert err.status == "error" and "ValueError: bad task" in err.message
        assert pool.run({"kind": "square", "x": 3}, timeout=60).value == 9  # the same worker goes on
        crash = pool.run({"kind": "crash"}, timeout=60)
        assert crash.status == "crash" and "SIGABRT" in crash.message
        assert crash.events == [{"step": "before the crash"}]
        assert "Fatal Python error" in crash.stderr_tail  # faulthandler's dump comes back
        # A fresh worker (after the crash) takes its time to start on a busy machine: the stall clock starts
        # when it takes the task, so only a worker that went silent while working is a stall; a task timeout
        # far above the stall timeout shows which of the two fired.
        hang = pool.run({"kind": "hang"}, timeout=300)
        assert hang.status == "stall" and hang.events == [{"step": "then silence"}]
        # Progress keeps a task alive past the stall timeout; its own timeout still holds.
        assert pool.run({"kind": "slow"}, timeout=60).value == "done"
        late = pool.run({"kind": "hang"}, timeout=2.0)
        assert late.status == "timeout"
        assert pool.run({"kind": "square", "x": 2}, timeout=60).value == 4  # a fresh worker after each loss
        assert pool.restarts == 3


def test_run_processes_kills_at_the_deadline(tmp_path: Path) -> None:
    quick = ([sys.executable, "-c", "print('hi')"], {})
    stuck = ([sys.executable, "-c", "import time; time.sleep(600)"], {"EXTRA": "1"})
    start = time.monotonic()
    a, b = run_processes([quick, stuck], tmp_path, timeout=20)  # room for `quick` to start on a busy machine
    assert time.monotonic() - start < 300  # killed at the deadline, not after its 600 s sleep
    assert a.rc == 0 and a.out.strip() == "hi" and not a.timed_out
    assert b.timed_out and b.rc != 0


def test_a_slow_worker_start_is_not_a_stall() -> None:
    """On a loaded machine a fresh worker can take longer to start than the stall timeout (issue 20)."""
    slow_start = "import time; time.sleep(4)\n" + WORKER
    with WorkerPool([sys.executable, "-c", slow_start], stall_timeout=1.0) as pool:
        assert pool.run({"kind": "square", "x": 5}, timeout=120).value == 25
        assert pool.restarts == 0


def test_a_task_without_a_deadline_still_detects_a_stall() -> None:
    """timeout=inf is what the conformance run passes: no deadline, but a stall still ends the task."""
    with WorkerPool([sys.executable, "-c", WORKER], stall_timeout=3.0) as pool:
        assert pool.run({"kind": "square", "x": 4}, timeout=float("inf")).value == 16
        assert pool.run({"kind": "hang"}, timeout=float("inf")).status == "stall"
