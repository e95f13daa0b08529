"""Every process a checked job starts, found and killed: on the deadline, on SIGINT or SIGTERM, and on any exit.

Killing the launched process's group is not enough: torchrun starts each worker in a session of its own, so
its ranks outlive ``killpg`` of the agent, and a process whose parent died is reparented away from us. So a
:class:`JobTree`
* tags the job's environment with a variable unique to the launch (every descendant inherits it, whatever
  its session or parent), and finds the job's processes by that tag in ``/proc/<pid>/environ`` as well as
  by walking parent links down from the launched process;
* makes the checker a child subreaper while the job runs (Linux ``PR_SET_CHILD_SUBREAPER``), so orphans
  of the job are reparented to the checker and stay in the walk;
* stops every process it finds (``SIGSTOP``: a parent cannot restart a worker while its siblings die),
  then kills them all (``SIGKILL``) and repeats until none is left.

A job process also watches the checker (probe.py, ``TORCH_NEURONX_CHECK_WATCH_PID``) and exits when the
checker is gone, which covers a checker killed with ``SIGKILL``.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

TAG = "TORCH_NEURONX_CHECK_JOB"
_PR_SET_CHILD_SUBREAPER = 36
_live: set[JobTree] = set()
_lock = threading.Lock()


class Interrupted(Exception):  # noqa: N818  (a signal, not an error of ours)
    """The checker received SIGINT or SIGTERM; the job was killed before this propagated."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


def _proc_pids() -> list[int]:
    try:
        return [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _has_tag(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return needle in f.read().split(b"\0")
    except OSError:  # gone, or another user's
        return False


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3] == b"Z"
    except (OSError, ValueError):
        return True


class JobTree:
    """The processes of one launch: start it with :meth:`env` in its environment, then :meth:`kill`."""

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex
        self.root: int | None = None
        with _lock:
            _live.add(self)

    def env(self) -> dict[str, str]:
        return {TAG: self.tag, "TORCH_NEURONX_CHECK_WATCH_PID": str(os.getpid())}

    def members(self) -> set[int]:
        """Live processes of the job: tagged ones, and every descendant of the launched process."""
        me = os.getpid()
        needle = f"{TAG}={self.tag}".encode()
        children: dict[int, list[int]] = {}
        found: set[int] = set()
        for pid in _proc_pids():
            if pid == me:
                continue
            parent = _ppid(pid)
            if parent is not None:
                children.setdefault(parent, []).append(pid)
            if _has_tag(pid, needle):
                found.add(pid)
        todo = [p for p in (self.root, *found) if p is not None]
        while todo:
            pid = todo.pop()
            for child in children.get(pid, []):
                if child not in found:
                    found.add(child)
                    todo.append(child)
        if self.root is not None and not _is_zombie(self.root):
            found.add(self.root)
        return {p for p in found if p != me and not _is_zombie(p)}

    def kill(self, proc: subprocess.Popen[Any] | None = None, grace_s: float = 10.0) -> int:
        """Kill every process of the job; returns how many were signalled. Reaps what it can."""
        signalled: set[int] = set()
        deadline = time.monotonic() + grace_s
        while True:
            pids = self.members()
            if proc is not None and proc.poll() is None:
                pids.add(proc.pid)
            if not pids:
                break
            for sig in (signal.SIGSTOP, signal.SIGKILL):
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, sig)
            if proc is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
            signalled |= pids
            self._reap(signalled - {self.root})
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        # Orphans are reparented to us (the subreaper) only once their parent is gone: wait for that, and reap.
        others = signalled - {self.root}
        until = time.monotonic() + 2.0
        while others and time.monotonic() < until:
            self._reap(others)
            others = {p for p in others if os.path.exists(f"/proc/{p}") and _ppid(p) not in (None, 1)}
            if others:
                time.sleep(0.02)
        return len(signalled)

    @staticmethod
    def _reap(pids: set[int]) -> None:
        """Collect the exit status of orphans that were reparented to us (we are their subreaper)."""
        for pid in pids:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)

    def close(self) -> None:
        with _lock:
            _live.discard(self)


def _set_subreaper(on: bool) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _kill_all_live() -> None:
    with _lock:
        trees = list(_live)
    for tree in trees:
        tree.kill(grace_s=3.0)


atexit.register(_kill_all_live)  # any exit of the checker (an exception, sys.exit) takes the jobs with it


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """While inside: the checker is a subreaper, and SIGINT / SIGTERM kill every live job, then raise
    :class:`Interrupted` (handlers are installed only in the main thread, and restored afterwards)."""
    subreaper = _set_subreaper(True)
    previous: dict[int, Any] = {}

    def handler(signum: int, frame: Any) -> None:
        _kill_all_live()
        raise Interrupted(signum)

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        _kill_all_live()
        for sig, h in previous.items():
            signal.signal(sig, h)
        if subreaper:
            _set_subreaper(False)
