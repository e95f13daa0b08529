"""Running multi-process jobs for the distributed tests, both sides of the process boundary.

Test side: :func:`run_job` starts one process per rank (the environment torchrun
would give them), waits with a deadline, and returns each named check's outcome
on every rank. Rank side: a job module registers checks with :func:`check` and
calls :func:`main`, which runs them all in one process group and writes the
outcomes as JSON. Grouping many checks into one job keeps spawn cycles (a few
seconds each, for importing torch) down while pytest still reports each check.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

# Each rank gets one thread: the CI machine has two cores for up to four ranks.
BASE_ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith(("NEURON_", "TORCH_NEURONX_", "TORCH_DEVICE_"))},
    "OMP_NUM_THREADS": "1",
    "PYTHONUNBUFFERED": "1",
}
for _k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
    BASE_ENV.pop(_k, None)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Proc:
    """One finished (or killed) process: exit code, output, seconds it ran."""

    rc: int
    out: str
    err: str
    seconds: float
    timed_out: bool

    def log(self) -> str:
        return f"rc={self.rc} after {self.seconds:.1f}s\n--- stdout\n{self.out[-3000:]}\n--- stderr\n{self.err[-6000:]}"


def run_procs(cmds: Sequence[tuple[list[str], dict[str, str]]], workdir: Path, timeout: float) -> list[Proc]:
    """Run commands concurrently; kill whatever is still running at the deadline."""
    workdir.mkdir(parents=True, exist_ok=True)
    started = []
    t0 = time.monotonic()
    for i, (argv, env) in enumerate(cmds):
        out = open(workdir / f"proc{i}.out", "w+")  # noqa: SIM115  (closed below)
        err = open(workdir / f"proc{i}.err", "w+")  # noqa: SIM115
        p = subprocess.Popen(argv, env={**BASE_ENV, **env}, stdout=out, stderr=err, cwd=REPO, start_new_session=True)
        started.append((p, out, err))
    deadline = t0 + timeout
    ended: list[float | None] = [None] * len(started)
    while any(e is None for e in ended) and time.monotonic() < deadline:
        for i, (p, _, _) in enumerate(started):
            if ended[i] is None and p.poll() is not None:
                ended[i] = time.monotonic() - t0
        time.sleep(0.05)
    results = []
    for i, (p, out, err) in enumerate(started):
        timed_out = ended[i] is None
        if timed_out:
            # The whole session: torchrun's workers die with their agent.
            os.killpg(p.pid, 9)
            p.wait()
        out.seek(0)
        err.seek(0)
        results.append(Proc(p.returncode, out.read(), err.read(), ended[i] or timeout, timed_out))
        out.close()
        err.close()
    return results


def rank_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    """What torchrun sets for a worker (TORCHELASTIC_RUN_ID: the device binds neuron:LOCAL_RANK)."""
    return {
        "TORCHELASTIC_RUN_ID": f"test-{port}",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size),
    }


def launch(script: str, world_size: int, workdir: Path, *args: str, timeout: float = 120,
           env: dict[str, str] | None = None) -> list[Proc]:
    """Start `script` (in this folder) once per rank, as torchrun would on one node."""
    port = free_port()
    argv = [sys.executable, str(HERE / script), *args]
    cmds = [(argv, {**rank_env(r, world_size, port), **(env or {})}) for r in range(world_size)]
    return run_procs(cmds, workdir, timeout)


def torchrun_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


Outcomes = dict[str, list[tuple[bool, str]]]  # check name -> (passed, detail) per rank


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


def run_job(script: str, world_size: int, workdir: Path, timeout: float = 180,
            env: dict[str, str] | None = None) -> Outcomes:
    out_dir = workdir / "out"
    out_dir.mkdir(parents=True, exist_ok=True)
    procs = launch(script, world_size, workdir, "--out", str(out_dir), timeout=timeout, env=env)
    return collect(procs, out_dir, world_size)


def assert_passed(outcomes: Outcomes, name: str, world_size: int) -> None:
    got = outcomes.get(name)
    assert got is not None, f"check {name!r} did not run; ran: {sorted(outcomes)}"
    assert len(got) == world_size, f"check {name!r} ran on {len(got)} of {world_size} ranks"
    failed = [f"rank {r}: {detail}" for r, (ok, detail) in enumerate(got) if not ok]
    assert not failed, "\n".join(failed)


# ---------------------------------------------------------------- rank side

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
            except Exception as e:  # reported by pytest on the test side
                results[name] = (False, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-4)}")
        (out / f"rank{os.environ.get('RANK', '0')}.json").write_text(json.dumps(results, indent=1))
        if teardown is not None:
            teardown()
