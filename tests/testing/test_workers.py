"""The shared process runner (torch_neuronx.testing.workers): results, crashes, hangs and stalls, deadlines, and
nothing left running after a signal or a failure (issue 30)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

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


def test_a_rank_stopped_because_a_peer_failed_is_not_a_timeout_and_the_failure_names_the_peer(
        tmp_path: Path) -> None:
    # the CI failure this pins: one rank exited with an error, fail_fast stopped the others, and the planner
    # blamed rank 0 ("timed out", with a warning as its last line) instead of the rank that failed
    from torch_neuronx.tools.plan.layouts import Layout
    from torch_neuronx.tools.plan.measure import _failure

    waiting = ([sys.executable, "-c", "import sys, time; print('warming up', file=sys.stderr); time.sleep(600)"], {})
    failing = ([sys.executable, "-c", "import sys, time; time.sleep(0.5); sys.exit('rank 1: the real error')"], {})
    start = time.monotonic()
    procs = run_processes([waiting, failing, waiting], tmp_path, timeout=300, fail_fast=True)
    assert time.monotonic() - start < 200  # stopped at once, not at the deadline
    assert [(p.timed_out, p.stopped) for p in procs] == [(False, True), (False, False), (False, True)]
    line = _failure(Layout(tp=1, pp=1, fsdp=3, dp=1), procs)
    assert "rank 1 exited 1 (rank 1: the real error)" in line, line
    assert "timed out" not in line, line
    Path(line.rsplit("its log: ", 1)[1]).unlink()


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


# ------------------------------------------------------------------ issue 30.3: nothing outlives the starter
DRIVER = r"""
import sys, tempfile
from pathlib import Path
from torch_neuronx.runtime import processes
from torch_neuronx.testing.workers import run_processes

WORKER = ("import os, subprocess, sys, time\n"
          "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
          "open(os.environ['READY'], 'w').close()\n"
          "if os.environ['FAIL']: raise RuntimeError('planted failure in a worker')\n"
          "time.sleep(600)\n")
try:
    with processes.guarded(), tempfile.TemporaryDirectory(prefix="neuron_plan_") as tmp:
        cmds = [([sys.executable, "-c", WORKER], {"READY": f"{tmp}/ready{i}", "FAIL": "1" if sys.argv[1] == "error"
                                                   and i == 0 else ""}) for i in range(3)]
        print("rcs", [p.rc for p in run_processes(cmds, Path(tmp), timeout=600, fail_fast=True)], flush=True)
except processes.Interrupted as e:
    print(f"driver: {e}", file=sys.stderr)
    sys.exit(128 + e.signum)
"""


def _ours(marker: Path) -> list[str]:
    """Live processes whose command line or environment names `marker` (a test's folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            seen = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(marker).encode() in seen and state != "Z":
            found.append(f"{entry.name}: {(entry / 'cmdline').read_bytes()[:200]!r}")
    return found


def _wait(condition: Callable[[], bool], what: str, limit_s: float = 300.0) -> None:
    end = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < end, f"waited {limit_s:.0f} s for {what}"
        time.sleep(0.1)


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "error"])
def test_workers_and_their_folder_never_outlive_a_signal_or_a_failure(tmp_path: Path, how: str) -> None:
    """The workers (each with a child in a session of its own) and the temporary folder are gone after SIGTERM,
    SIGINT or a worker's exception (its peers are not left waiting for it); the driver exits 128 + N with one
    line, no traceback."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, how], env={**os.environ, "TMPDIR": str(tmpdir)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if how != "error":
            _wait(lambda: len(list(tmpdir.glob("neuron_plan_*/ready*"))) == 3 or driver.poll() is not None,
                  "the workers to start")
            assert driver.poll() is None, driver.communicate()
            driver.send_signal(getattr(signal, how))
        out, err = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
    if how == "error":
        assert driver.returncode == 0 and "rcs [1, " in out, (out, err)  # the failed rank ended its peers
    else:
        assert driver.returncode == 128 + getattr(signal, how), (out, err)
        assert f"stopped by {how}" in err and "Traceback" not in err
    assert list(tmpdir.iterdir()) == [] and _ours(tmpdir) == []


def test_plan_measure_stopped_by_sigterm_leaves_no_worker_and_no_folder(tmp_path: Path) -> None:
    """`torch-neuronx plan --measure` as `timeout` stops it: exit 143, one line, its workers and its
    /tmp/neuron_plan_* folder gone."""
    from torch_neuronx.testing.plan import tiny_llama

    config = tmp_path / "config.json"
    tiny_llama().to_json_file(str(config))
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    planner = subprocess.Popen([sys.executable, "-m", "torch_neuronx", "plan", str(config), "--instance",
                                "trn1.2xlarge", "--global-batch", "2", "--seq-len", "32", "--precision", "fp32",
                                "--layout", "2x1x1", "--measure", "1"], env={**os.environ, "TMPDIR": str(tmpdir)},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def workers_started() -> bool:
            return sum("tools.plan.measure" in p for p in _ours(tmpdir)) >= 2 or planner.poll() is not None

        _wait(workers_started, "the planner's workers to start")
        assert planner.poll() is None, planner.communicate()
        planner.send_signal(signal.SIGTERM)
        out, err = planner.communicate(timeout=120)
    finally:
        if planner.poll() is None:
            planner.kill()
    assert planner.returncode == 143, (out, err)
    assert "stopped by SIGTERM" in err and "Traceback" not in err
    assert list(tmpdir.iterdir()) == [] and _ours(tmpdir) == []
