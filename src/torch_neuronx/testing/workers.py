"""Work in other processes, with deadlines: the one implementation the distributed tests, the OpInfo conformance
run and the Hugging Face compatibility report share.

Two shapes of work:

* :func:`run_processes` starts several commands at once (the ranks of a
  job, a torchrun launch) and waits for all of them until a deadline, killing
  each one's whole process tree past it (and, with ``fail_fast``, the others
  once one has failed).
* :class:`WorkerPool` keeps a worker subprocess and sends it tasks, one JSON
  line each; the worker (:func:`serve`) answers with event lines and a result
  line. A task that runs past its timeout, a worker that makes no progress for
  ``stall_timeout`` seconds once it has taken the task (its own start-up
  does not count), or one that crashes is killed and replaced; the
  task comes back as a failure with the events it did send and the tail of
  the worker's stderr, and the next task gets a fresh worker.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from torch_neuronx.runtime import processes

# The environment of child processes: nothing of this process's device or launch settings leaks in.
BASE_ENV = {
    **{k: v for k, v in os.environ.items()
       if not k.startswith(("NEURON_", "TORCH_NEURONX_", "TORCH_DEVICE_"))
       and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                     "TORCHELASTIC_RUN_ID", "GROUP_RANK", "ROLE_RANK")},
    "OMP_NUM_THREADS": "1",
    "PYTHONUNBUFFERED": "1",
}


# ---------------------------------------------------------------- several processes at once


@dataclass
class Proc:
    """One finished (or killed) process: exit code, output, seconds it ran. `timed_out`: still running at the
    deadline (and killed); `stopped`: killed before it, because another command failed (`fail_fast`)."""

    rc: int
    out: str
    err: str
    seconds: float
    timed_out: bool
    stopped: bool = False

    def log(self) -> str:
        return f"rc={self.rc} after {self.seconds:.1f}s\n--- stdout\n{self.out[-3000:]}\n--- stderr\n{self.err[-6000:]}"


def run_processes(cmds: Sequence[tuple[list[str], dict[str, str]]], workdir: Path, timeout: float,
                  cwd: str | Path | None = None, fail_fast: bool = False) -> list[Proc]:
    """Run commands concurrently (each with :data:`BASE_ENV` plus its own variables); kill what is still running
    at the deadline, with its whole process tree (torchrun's workers, daemons). With `fail_fast`, the first
    command to exit non-zero ends the others too (ranks that would wait for it in a collective until the
    deadline). Whatever happens here (an exception, a signal), no process of theirs is left running."""
    workdir.mkdir(parents=True, exist_ok=True)
    started: list[tuple[subprocess.Popen[Any], TextIO, TextIO]] = []
    t0 = time.monotonic()
    deadline = t0 + timeout
    ended: list[float | None] = []
    peer_failed = False
    try:
        for i, (argv, env) in enumerate(cmds):
            out = open(workdir / f"proc{i}.out", "w+")  # noqa: SIM115  (closed below)
            err = open(workdir / f"proc{i}.err", "w+")  # noqa: SIM115
            started.append((processes.spawn(argv, env={**BASE_ENV, **env}, stdout=out, stderr=err, cwd=cwd),
                            out, err))
            ended.append(None)
        while any(e is None for e in ended) and time.monotonic() < deadline:
            for i, (p, _, _) in enumerate(started):
                if ended[i] is None and p.poll() is not None:
                    ended[i] = time.monotonic() - t0
            if fail_fast and any(p.returncode not in (None, 0) for p, _, _ in started):
                peer_failed = True
                break
            time.sleep(0.05)
    finally:
        for p, _, _ in started:
            processes.stop(p)  # at once for those that ended; the others' trees are killed
    results = []
    for i, (p, out, err) in enumerate(started):
        killed = ended[i] is None  # by us: at the deadline, or because a peer failed first
        out.seek(0)
        err.seek(0)
        results.append(Proc(p.returncode, out.read(), err.read(), ended[i] or time.monotonic() - t0,
                            timed_out=killed and not peer_failed, stopped=killed and peer_failed))
        out.close()
        err.close()
    return results


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def agent_store() -> Iterator[int]:
    """A TCPStore hosted by this process while inside, on a port the OS assigns, as torchrun's agent hosts
    one: ranks started with ``rank_env(..., port, agent_store=True)`` reach it as clients. A port from
    :func:`free_port` is only free when asked: until rank 0 binds it, another job's socket may take it
    (rank 0 then fails, or a rank of the other job joins this one); a port bound here stays bound."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    try:
        yield store.port
    finally:
        del store


def rank_env(rank: int, world_size: int, port: int, local_rank: int | None = None,
             agent_store: bool = False) -> dict[str, str]:
    """What torchrun sets for a worker (with TORCHELASTIC_RUN_ID the device binds neuron:LOCAL_RANK).
    `agent_store`: the store at `port` is :func:`agent_store`'s (every rank a client, as under torchrun)."""
    env = {
        "TORCHELASTIC_RUN_ID": f"local-{port}",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank if local_rank is None else local_rank),
        "LOCAL_WORLD_SIZE": str(world_size),
    }
    if agent_store:
        env["TORCHELASTIC_USE_AGENT_STORE"] = "True"
    return env


def torchrun_argv(*args: str) -> list[str]:
    """A torchrun command line that uses this interpreter."""
    return [sys.executable, "-m", "torch.distributed.run", *args]


# ---------------------------------------------------------------- tasks to a worker


@dataclass
class TaskResult:
    """How a task ended: "ok" (with the worker's `value`), "error" (the handler raised), or "crash", "timeout",
    "stall" (the worker was lost)."""

    status: str
    value: Any = None
    message: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)
    stderr_tail: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class _Worker:
    def __init__(self, argv: list[str], env: dict[str, str] | None, cwd: str | Path | None) -> None:
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115  (closed in stop)
        self.proc = processes.spawn(argv, env={**BASE_ENV, **(env or {})}, cwd=cwd, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=self.stderr, text=True, bufsize=1)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)  # end of output: the worker exited

    def stderr_tail(self, n: int = 4000) -> str:
        self.stderr.flush()
        self.stderr.seek(0)
        return self.stderr.read()[-n:]

    def stop(self) -> None:
        processes.stop(self.proc)
        self.stderr.close()


class WorkerPool:
    """One worker subprocess at a time, running `argv` (a program that calls :func:`serve`), replaced when lost."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None, cwd: str | Path | None = None,
                 stall_timeout: float = 300.0) -> None:
        self.argv, self.env, self.cwd = argv, env, cwd
        self.stall_timeout = stall_timeout
        self._worker: _Worker | None = None
        self.restarts = 0

    def run(self, task: dict[str, Any], timeout: float,
            on_event: Callable[[dict[str, Any]], None] | None = None) -> TaskResult:
        """Send one task; wait at most `timeout` seconds in all, and `stall_timeout` between two lines."""
        if self._worker is None or self._worker.proc.poll() is not None:
            if self._worker is not None:
                self._worker.stop()
                self.restarts += 1
            self._worker = _Worker(self.argv, self.env, self.cwd)
        worker = self._worker
        start = time.monotonic()
        events: list[dict[str, Any]] = []
        started = False  # until the worker takes the task, only `timeout` applies (start-up is slow on a busy host)
        try:
            assert worker.proc.stdin is not None
            worker.proc.stdin.write(json.dumps(task) + "\n")
            worker.proc.stdin.flush()
        except OSError:
            return self._lost("crash", "the worker had exited", events, start)
        while True:
            now = time.monotonic()
            wait = start + timeout - now
            if started:
                wait = min(wait, self.stall_timeout)
            if wait <= 0:
                return self._lost("timeout", f"no answer within {timeout:.0f}s", events, start)
            try:  # an infinite task timeout (before the worker takes the task) waits for a line or its exit
                line = worker.lines.get(timeout=None if wait == float("inf") else wait)
            except queue.Empty:
                if not started or time.monotonic() - start >= timeout:
                    return self._lost("timeout", f"no answer within {timeout:.0f}s", events, start)
                return self._lost("stall", f"no progress for {self.stall_timeout:.0f}s", events, start)
            if line is None:
                rc = worker.proc.wait()
                return self._lost("crash", describe_exit(rc), events, start)
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short, or stray output
            if "started" in message:
                started = True
            elif "event" in message:
                events.append(message["event"])
                if on_event is not None:
                    on_event(message["event"])
            elif "result" in message:
                return TaskResult("ok", message["result"], events=events, seconds=time.monotonic() - start)
            elif "error" in message:
                return TaskResult("error", message=message["error"], events=events,
                                  seconds=time.monotonic() - start)

    def _lost(self, status: str, why: str, events: list[dict[str, Any]], start: float) -> TaskResult:
        assert self._worker is not None
        worker, self._worker = self._worker, None
        processes.stop(worker.proc)
        tail = worker.stderr_tail()
        worker.stop()
        self.restarts += 1
        return TaskResult(status, message=why, events=events, stderr_tail=tail, seconds=time.monotonic() - start)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.stop()
            self._worker = None

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


def serve(handler: Callable[[dict[str, Any], Callable[[dict[str, Any]], None]], Any]) -> None:
    """The worker side: run `handler(task, emit)` for each task line on stdin until it closes.

    `emit(event)` sends progress (it also resets the stall clock). The
    handler's return value is the result; an exception is reported as an
    "error" result and the worker goes on. Anything else written to stdout
    goes to stderr, so that it cannot corrupt the protocol.
    """
    protocol: TextIO = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import faulthandler

    faulthandler.enable()

    def send(message: dict[str, Any]) -> None:
        protocol.write(json.dumps(message, default=str) + "\n")
        protocol.flush()

    for line in sys.stdin:
        if not line.strip():
            continue
        task = json.loads(line)
        send({"started": True})  # the stall clock starts here: a worker's own start-up is not a stall
        try:
            result = handler(task, lambda event: send({"event": event}))
        except Exception as exc:  # reported to the pool; the worker serves the next task
            send({"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-6)}"})
        else:
            send({"result": result})
