"""A rank that dies, hangs or disagrees on a shape: the others fail with an error, within the timeout.

The 2-rank jobs of job_failures.py run at once (they mostly wait). The
process-group timeout is the user's: init_process_group(timeout=...).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from torch_neuronx.testing.workers import Proc, free_port, rank_env, run_processes

HERE = Path(__file__).resolve().parent

TIMEOUT = 6  # seconds, passed to init_process_group(timeout=...)
MODES = ("die", "hang", "mismatch_larger", "mismatch_smaller", "mismatch_smaller_detail")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Proc]]:
    cmds = []
    for mode in MODES:
        port = free_port()
        argv = [sys.executable, str(HERE / "job_failures.py"), mode.removesuffix("_detail")]
        env = {"JOB_TIMEOUT": str(TIMEOUT)}
        if mode.endswith("_detail"):
            env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        cmds += [(argv, {**rank_env(r, 2, port), **env}) for r in range(2)]
    procs = run_processes(cmds, Path(tmp_path_factory.mktemp("failures")), timeout=90)
    return {mode: procs[2 * i : 2 * i + 2] for i, mode in enumerate(MODES)}


def report(p: Proc) -> dict[str, object]:
    lines = [line for line in p.out.splitlines() if line.startswith("{")]
    assert lines, f"no report\n{p.log()}"
    return json.loads(lines[-1])


def test_dead_rank_fails_the_others_fast(runs: dict[str, list[Proc]]) -> None:
    survivor, dead = runs["die"]
    assert dead.rc == 3, dead.log()
    r = report(survivor)
    assert survivor.rc == 1 and not r["ok"], survivor.log()
    assert "peer" in str(r["error"]), r  # Gloo: "Connection reset/closed by peer"
    assert float(r["seconds"]) < TIMEOUT, r  # the closed socket is noticed at once


def test_hung_rank_times_the_others_out(runs: dict[str, list[Proc]]) -> None:
    waiter, hung = runs["hang"]
    assert not waiter.timed_out and not hung.timed_out
    r = report(waiter)
    assert waiter.rc == 1 and not r["ok"], waiter.log()
    assert "Timed out" in str(r["error"]), r
    assert TIMEOUT - 0.5 <= float(r["seconds"]) <= TIMEOUT + 3, r


def test_larger_peer_tensor_aborts_with_a_clear_message(runs: dict[str, list[Proc]]) -> None:
    # 4 vs 8 elements: Gloo detects the overflow on the rank with 4, but on its
    # own thread: it aborts the process (uncatchable) rather than raising.
    procs = runs["mismatch_larger"]
    assert not any(p.timed_out for p in procs), [p.log() for p in procs]
    assert any("Received data size doesn't match expected size" in p.err for p in procs), [p.log() for p in procs]
    assert all(p.rc != 0 for p in procs), [p.log() for p in procs]


def test_smaller_peer_tensor_does_not_hang(runs: dict[str, list[Proc]]) -> None:
    # 4 vs 3 elements: Gloo gives the rank with 3 a wrong result without error
    # (docs/distributed.md); the rank with 4 times out, or sees the peer go when the peer's own barrier timed out
    # first (a busy machine: the two timeouts are started milliseconds apart). Nothing hangs.
    procs = runs["mismatch_smaller"]
    assert not any(p.timed_out for p in procs), [p.log() for p in procs]
    error = str(report(procs[0]).get("error"))
    assert "Timed out" in error or "Connection closed by peer" in error, procs[0].log()


def test_debug_detail_names_the_shape_mismatch(runs: dict[str, list[Proc]]) -> None:
    # torch's ProcessGroupWrapper compares each collective's shapes across ranks first (plain Gloo: works)
    procs = runs["mismatch_smaller_detail"]
    assert not any(p.timed_out for p in procs), [p.log() for p in procs]
    for p in procs:
        assert "Detected mismatch between collectives" in str(report(p).get("error")), p.log()
