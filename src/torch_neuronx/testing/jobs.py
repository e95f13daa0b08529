"""Multi-process jobs made of named checks, both sides of the process boundary.

Launching side: :func:`run_job` starts one process per rank (the environment
torchrun would give them), waits with a deadline, and returns each named
check's outcome on every rank. Rank side: a job module registers checks with
a :class:`Checks` instance and calls its :meth:`Checks.main`, which runs them
all in one process and writes the outcomes as JSON. Grouping many checks into
one job keeps spawn cycles (seconds each, for importing torch) down while
pytest still reports each check.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from torch_neuronx.testing.workers import Proc, agent_store, rank_env, run_processes

Outcomes = dict[str, list[tuple[bool, str]]]  # check name -> (passed, detail) per rank


def launch(script: str | Path, world_size: int, workdir: Path, *args: str, timeout: float = 120,
           env: dict[str, str] | None = None, cwd: str | Path | None = None) -> list[Proc]:
    """Start `script` once per rank, as torchrun would on one node."""
    argv = [sys.executable, str(script), *args]
    with agent_store() as port:
        cmds = [(argv, {**rank_env(r, world_size, port, agent_store=True), **(env or {})})
                for r in range(world_size)]
        return run_processes(cmds, workdir, timeout, cwd=cwd)


def collect(procs: Sequence[Proc], out_dir: Path, world_size: int) -> Outcomes:
    """Merge the ranks' JSON outcomes; fail with every rank's log if a rank crashed."""
    logs = "\n".join(f"=== process {i}: {p.log()}" for i, p in enumerate(procs))
    if any(p.rc != 0 for p in procs):
        raise AssertionError(f"job failed\n{logs}")
    merged: Outcomes = {}
    for r in range(world_size):
        path = out_dir / f"rank{r}.json"
        if not path.exists():
            raise AssertionError(f"rank {r} wrote no results\n{logs}")
        for name, (ok, detail) in json.loads(path.read_text()).items():
            merged.setdefault(name, []).append((ok, detail))
    return merged


def run_job(script: str | Path, world_size: int, workdir: Path, timeout: float = 180,
            env: dict[str, str] | None = None, cwd: str | Path | None = None) -> Outcomes:
    """Run a job module of :class:`Checks` on `world_size` ranks and collect its outcomes."""
    out_dir = workdir / "out"
    out_dir.mkdir(parents=True, exist_ok=True)
    procs = launch(script, world_size, workdir, "--out", str(out_dir), timeout=timeout, env=env, cwd=cwd)
    return collect(procs, out_dir, world_size)


def assert_passed(outcomes: Outcomes, name: str, world_size: int) -> None:
    got = outcomes.get(name)
    assert got is not None, f"check {name!r} did not run; ran: {sorted(outcomes)}"
    assert len(got) == world_size, f"check {name!r} ran on {len(got)} of {world_size} ranks"
    failed = [f"rank {r}: {detail}" for r, (ok, detail) in enumerate(got) if not ok]
    assert not failed, "\n".join(failed)


Check = Callable[[], object]


class Checks:
    """A job's checks, in order. Each passes unless it raises; its return value is the detail."""

    def __init__(self) -> None:
        self.fns: dict[str, Check] = {}

    def __call__(self, fn: Check) -> Check:
        self.fns[fn.__name__] = fn
        return fn

    @property
    def names(self) -> list[str]:
        return list(self.fns)

    def main(self, setup: Callable[[], None] | None = None, teardown: Callable[[], None] | None = None,
             only: Callable[[str], bool] | None = None) -> None:
        """Run the checks in this rank; write ``rank{RANK}.json`` into ``--out``."""
        import argparse

        import torch

        parser = argparse.ArgumentParser()
        parser.add_argument("--out", required=True)
        out = Path(parser.parse_args().out)
        torch.set_num_threads(1)
        if setup is not None:
            setup()
        results: dict[str, tuple[bool, str]] = {}
        for name, fn in self.fns.items():
            if only is not None and not only(name):
                continue
            try:
                detail = fn()
                results[name] = (True, "" if detail is None else str(detail))
            except Exception as e:  # reported by pytest on the launching side
                results[name] = (False, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-4)}")
        (out / f"rank{os.environ.get('RANK', '0')}.json").write_text(json.dumps(results, indent=1))
        if teardown is not None:
            teardown()
