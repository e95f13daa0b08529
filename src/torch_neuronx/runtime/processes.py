"""Child processes that never outlive their starter: the one implementation `torch-neuronx check`, `plan
--measure`'s workers and the test helpers (torch_neuronx.testing.workers) share.

Why a guardian: a job's processes escape every simple kill. torchrun starts each rank in a session of its own
(``killpg`` of the agent misses them); a daemon (``setsid``, ``env -i``, a double fork) leaves the process
group and the environment; and when the starter is killed with ``SIGKILL`` nothing of it runs to clean up. So
:func:`spawn` starts every command under a small guardian, this very file run by path with the standard
library only (no torch import: a few milliseconds):

* the guardian is a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``): every orphan of the command, however it
  detached itself, is reparented to it, so its descendants are the command's whole process tree;
* it holds the read end of a pipe whose only write end is in the starter: the starter's exit, ``SIGKILL``
  included, closes it, and the guardian kills the tree at once (a pipe, not ``PR_SET_PDEATHSIG``: that fires
  when the starting *thread* ends, and is not inherited by a command's own children);
* when the command exits, the guardian gives what the command left running a moment to end by itself, then
  kills it, and writes one JSON line per killed process (pid and command line) to its report file;
* on ``SIGTERM`` (the starter's :func:`stop`) it kills the tree and exits as the command would have;
* when the starter is gone, it also removes the folder named by ``TORCH_NEURONX_REMOVE_ON_STARTER_EXIT`` in the
  command's environment (the starter's temporary folder, whose own cleanup cannot run after ``SIGKILL``).

Killing a tree stops every process first (``SIGSTOP``: a parent cannot restart a worker while its siblings
die), then kills them all (``SIGKILL``), and repeats until none is left. The starter, inside :func:`guarded`,
turns ``SIGINT`` and ``SIGTERM`` into :class:`Interrupted` after stopping every live guardian, so that
``finally`` blocks (temporary folders) run and the command exits 128 + N with one line.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

GUARD = os.path.abspath(__file__)
_PR_SET_CHILD_SUBREAPER = 36
# A folder named in this variable of a spawned command's environment is removed by its guardian when the starter
# dies without cleaning up (SIGKILL): `plan --measure`'s temporary folder
REMOVE_ON_STARTER_EXIT = "TORCH_NEURONX_REMOVE_ON_STARTER_EXIT"
LEFTOVER_GRACE_S = 2.0  # what a command left running may take this long to end by itself (a pool's workers)

_watch_write: int | None = None
_watch_read: int | None = None
_owner = -1  # the process that made the pipe (a forked child makes its own)
_live: dict[int, subprocess.Popen[Any]] = {}  # guardian pid -> its Popen, while it runs
_lock = threading.Lock()


class Interrupted(KeyboardInterrupt):  # noqa: N818  (a signal, not an error: `except Exception` lets it pass)
    """The starter received SIGINT or SIGTERM; every live guardian's tree was killed before this was raised."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal_name(signum)}")


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


# ---------------------------------------------------------------- the process table
def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) from /proc, None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
        fields = raw[raw.rindex(b")") + 2:].split()
        return fields[0].decode(), int(fields[1])
    except (OSError, ValueError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot, field 22 of /proc/pid/stat), None when gone: with the pid, it
    names one process, as a pid alone does not once the kernel hands the number out again (pid_max can be 32,768)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
        return int(raw[raw.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def table() -> dict[int, int]:
    """pid -> parent pid of every live (not zombie) process."""
    out = {}
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return out
    for pid in pids:
        st = _stat(pid)
        if st is not None and st[0] not in ("Z", "X"):
            out[pid] = st[1]
    return out


def descendants(root: int, procs: dict[int, int] | None = None) -> list[int]:
    """The live descendants of `root` (not `root`), parents before children."""
    procs = table() if procs is None else procs
    children: dict[int, list[int]] = {}
    for pid, parent in procs.items():
        children.setdefault(parent, []).append(pid)
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child != root and child not in out:
                out.append(child)
                todo.append(child)
    return out


def command(pid: int) -> str:
    """A process's command line (its name when the line is empty, "?" when gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        if argv:
            return " ".join(argv)[:500]
        with open(f"/proc/{pid}/comm") as f:
            return f"[{f.read().strip()}]"
    except OSError:
        return "?"


def kill_tree(root: int, grace_s: float = 10.0, reap: bool = False) -> list[dict[str, Any]]:
    """Stop, then kill, every descendant of `root` until none is left; what was killed (pid, command). With
    `reap` (the caller is their subreaper) their exit statuses are collected as they die."""
    killed: dict[int, str] = {}
    until = time.monotonic() + grace_s
    while True:
        pids = descendants(root)
        if not pids:
            break
        for pid in pids:
            killed.setdefault(pid, command(pid))
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
        if reap:
            _reap_all()
        if time.monotonic() > until:
            break
        time.sleep(0.005)
    if reap:
        _reap_killed(set(killed))
    return [{"pid": pid, "command": cmd} for pid, cmd in killed.items()]


def _reap_killed(pids: set[int], wait_s: float = 1.0) -> None:
    """Collect the killed processes that died after the last reap: `descendants` skips zombies, so without this
    they outlive the guardian unreaped and their CPU time never reaches its parent's ``os.times()`` (how the test
    suite's budget measures what a test's processes cost)."""
    until = time.monotonic() + wait_s
    while pids and time.monotonic() < until:
        _reap_all()
        for pid in list(pids):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # reaped above, or not ours (yet): its parent collects it
                done = pid
            if done:
                pids.discard(pid)
        if pids:
            time.sleep(0.005)


def _reap_all() -> dict[int, int]:
    """Collect every exited child's status without blocking: pid -> wait status."""
    out = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return out
        if pid == 0:
            return out
        out[pid] = status


def set_subreaper(on: bool) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


# ---------------------------------------------------------------- the starter's side
def _watch_fd() -> int:
    """The read end of the pipe every guardian watches; its write end stays open in this process until exit."""
    global _watch_read, _watch_write
    with _lock:
        if _watch_read is None or _watch_write is None or os.getpid() != _owner:
            _new_pipe()
        assert _watch_read is not None
        return _watch_read


def _new_pipe() -> None:
    global _watch_read, _watch_write, _owner
    _watch_read, _watch_write = os.pipe()  # close-on-exec: only guardians get the read end (pass_fds)
    _owner = os.getpid()


def spawn(argv: list[str], report: str | os.PathLike[str] | None = None, **popen: Any) -> subprocess.Popen[Any]:
    """Start `argv` under a guardian (``Popen`` keyword arguments apply; its pid is the guardian's, its exit
    status the command's). `report`: a file for the JSON lines of what the guardian had to kill."""
    fd = _watch_fd()
    guard = [sys.executable, "-I", "-S", GUARD, str(fd), os.fspath(report) if report else "-", "--", *argv]
    popen.setdefault("start_new_session", True)
    proc = subprocess.Popen(guard, pass_fds=(fd, *popen.pop("pass_fds", ())), **popen)
    with _lock:
        _live[proc.pid] = proc
    return proc


def stop(proc: subprocess.Popen[Any], grace_s: float = 10.0) -> None:
    """Kill a spawned command's whole tree (its guardian does it, and writes its report); waits for the end.
    A guardian that does not answer in time is killed with its tree from here."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    forget(proc)


def forget(proc: subprocess.Popen[Any]) -> None:
    with _lock:
        _live.pop(proc.pid, None)


def stop_all(only: set[int] | None = None) -> None:
    """Stop every command spawned by this process that still runs (or only those with a guardian pid in
    `only`)."""
    with _lock:
        running = [p for pid, p in _live.items() if only is None or pid in only]
    for proc in running:
        stop(proc, grace_s=5.0)


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """While inside, SIGINT and SIGTERM stop every spawned command, then raise :class:`Interrupted` (handlers
    are installed in the main thread only, and restored afterwards); on the way out, whatever was spawned inside
    and still runs is stopped (an exception, a return). Commands spawned before (a pool's worker) are left
    alone, except on a signal."""
    previous: dict[int, Any] = {}
    with _lock:
        before = set(_live)

    def handler(signum: int, frame: Any) -> None:
        stop_all()
        raise Interrupted(signum)

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        with _lock:
            inside = set(_live) - before
        stop_all(inside)
        for sig, h in previous.items():
            signal.signal(sig, h)


def read_report(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The processes a guardian killed, from its report file (empty when none or missing)."""
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []


# ---------------------------------------------------------------- the guardian (this file run by path)
def _exit_like(status: int) -> None:
    """Exit as a process with wait status `status` did: the same code, or the same signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU):
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else status >> 8)


def _guard(args: list[str]) -> None:
    watch, report, argv = int(args[0]), args[1], args[3:]
    set_subreaper(True)
    os.set_inheritable(watch, False)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    stopped: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, f: stopped.append(s))
    signal.signal(signal.SIGCHLD, lambda s, f: None)
    try:
        child = subprocess.Popen(argv, close_fds=True)
    except OSError as e:
        print(f"cannot start {argv[0] if argv else 'an empty command'}: {e}", file=sys.stderr)
        os._exit(127)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)  # the command's pipes end with the command, not with us
    os.dup2(null, 1)
    status: int | None = None

    def write(killed: list[dict[str, Any]], when: str) -> None:
        if killed and report != "-":
            with contextlib.suppress(OSError), open(report, "a") as f:
                f.writelines(json.dumps({**k, "when": when}) + "\n" for k in killed)

    while status is None and not stopped:
        with contextlib.suppress(InterruptedError):
            ready, _, _ = select.select([watch, wake_r], [], [])
        if watch in ready and not os.read(watch, 1):  # EOF: the starter is gone, however it ended
            write(kill_tree(os.getpid(), reap=True), "starter gone")
            folder = os.environ.get(REMOVE_ON_STARTER_EXIT)  # the starter's temporary folder: its cleanup never ran
            if folder:
                shutil.rmtree(folder, ignore_errors=True)
            os._exit(137)
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 512)
        status = _reap_all().get(child.pid, status)
    if stopped:
        write(kill_tree(os.getpid(), reap=True), "stopped")
        os._exit(128 + stopped[0])
    assert status is not None
    until = time.monotonic() + LEFTOVER_GRACE_S  # what the command left: a moment to end by itself
    while descendants(os.getpid()) and time.monotonic() < until and not stopped:
        time.sleep(0.02)
        _reap_all()
    write(kill_tree(os.getpid(), reap=True), "left running")
    _exit_like(status)


if __name__ == "__main__":
    _guard(sys.argv[1:])
