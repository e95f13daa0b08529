"""What one run of a job did, read back from the event files its processes wrote (tools/check/probe.py).

:func:`read_run` turns ``rank<R>.jsonl`` files into :class:`RankRun` objects
with the figures the verdicts and the report need: startup, per-step
durations, the warm-up / steady-state split (the steady state starts after
the last compilation), step-time percentiles, throughput and peak memory.
"""

from __future__ import annotations

import json
import linecache
import os
import re
import signal
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# The signal on which each watched process writes every thread's Python stack (faulthandler, registered by the
# probe) to <events>/stacks.rank<R>.<pid>.txt: the checker sends it to the ranks before it kills a hung job, so
# that the report says where each rank was. A real-time signal: no job or library uses it for anything else.
STACK_SIGNAL = signal.SIGRTMIN + 6 if hasattr(signal, "SIGRTMIN") else None
TORCH_PARTS = (f"{os.sep}torch{os.sep}", f"{os.sep}torch_neuronx{os.sep}")


@dataclass
class RankRun:
    rank: int
    start: dict[str, Any] | None = None
    first_forward: float | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    records: dict[str, Any] = field(default_factory=dict)
    saves: dict[str, dict[str, Any]] = field(default_factory=dict)  # path -> the last save's digests
    stream_saves: list[dict[str, Any]] = field(default_factory=list)  # saved to a stream the checker cannot read
    meshes: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    probe_errors: list[dict[str, Any]] = field(default_factory=list)
    end: dict[str, Any] | None = None
    last_event: float | None = None
    log_tail: str = ""
    stacks: str = ""  # the faulthandler dump it wrote when the checker asked (a hang), "" when none

    # -------------------------------------------------------------- status
    @property
    def status(self) -> str:
        """ok (ran to its end), error (an uncaught exception), or stopped (killed, hung, or never finished)."""
        if self.errors:
            return "error"
        return "ok" if self.end is not None else "stopped"

    @property
    def stopped_at(self) -> float | None:
        """When this rank stopped: its end, its uncaught exception, or (killed, aborted) its last event."""
        if self.errors:
            return float(self.errors[0]["t"])
        if self.end is not None:
            return float(self.end["t"])
        return self.last_event

    @property
    def optimizer_steps(self) -> int | None:
        return (self.end or {}).get("optimizer_steps")

    def compared_steps(self) -> list[dict[str, Any]]:
        """The steps to compare with the reference: not the partial one the probe closes at exit after a
        crash (operations reports the crash; its half-step is no divergence)."""
        if self.status != "ok" and self.steps and self.steps[-1].get("final"):
            return self.steps[:-1]
        return self.steps

    # -------------------------------------------------------------- time
    @property
    def launched(self) -> float | None:
        return (self.start or {}).get("launched")

    @property
    def startup_s(self) -> float | None:
        """From launch to the first forward call: imports, model build and load, data set-up."""
        if self.launched is None or self.first_forward is None:
            return None
        return self.first_forward - self.launched

    def durations(self) -> list[float]:
        """Seconds of each step: from the previous step's end (the first forward for step 0)."""
        out, previous = [], self.first_forward
        for s in self.steps:
            out.append(s["t"] - previous if previous is not None else float("nan"))
            previous = s["t"]
        return out

    @property
    def warmup_steps(self) -> int:
        """Steps up to and including the last one that compiled: the steady state starts after it."""
        last = -1
        for s in self.steps:
            if s.get("compile", {}).get("graphs", 0):
                last = s["i"]
        return last + 1

    def steady(self) -> list[int]:
        return [s["i"] for s in self.steps][self.warmup_steps:]

    def step_time(self) -> dict[str, float] | None:
        """Percentiles of the steady-state step time (None without a steady state)."""
        d = self.durations()
        times = [d[i] for i in range(self.warmup_steps, len(d)) if d[i] == d[i]]
        if not times:
            return None
        p = np.percentile(times, [50, 90, 99])
        return {"p50": float(p[0]), "p90": float(p[1]), "p99": float(p[2]), "mean": float(np.mean(times)),
                "steps": len(times)}

    def throughput(self) -> dict[str, float] | None:
        d = self.durations()
        idx = [i for i in range(self.warmup_steps, len(d)) if d[i] == d[i]]
        seconds = sum(d[i] for i in idx)
        if not idx or seconds <= 0:
            return None
        tokens = sum(self.steps[i].get("tokens", 0) for i in idx)
        examples = sum(self.steps[i].get("examples", 0) for i in idx)
        return {"tokens_per_s": tokens / seconds, "examples_per_s": examples / seconds}

    def compile_seconds(self) -> float:
        if self.end:
            return float(self.end.get("compile", {}).get("compile_seconds", 0.0))
        return float(sum(s.get("compile", {}).get("seconds", 0.0) for s in self.steps))

    # -------------------------------------------------------------- memory
    def peak_memory(self) -> dict[int, dict[str, int]]:
        """Core -> the highest peak seen and its capacity."""
        out: dict[int, dict[str, int]] = {}
        for s in self.steps:
            for c in s.get("memory", []):
                cur = out.setdefault(c["device"], {"peak": 0, "capacity": c["capacity"]})
                cur["peak"] = max(cur["peak"], c["peak"])
        return out

    def losses(self) -> list[float | None]:
        return [s.get("loss") for s in self.steps]

    def summary(self) -> dict[str, Any]:
        """This rank as the JSON report's ``ranks`` entry."""
        return {
            "rank": self.rank, "status": self.status, "startup_s": self.startup_s, "steps": len(self.steps),
            "warmup_steps": self.warmup_steps, "step_time_s": self.step_time(), "throughput": self.throughput(),
            "compile_seconds": self.compile_seconds(),
            "graphs": (self.end or {}).get("compile", {}).get("graphs"),
            "graph_breaks": (self.end or {}).get("compile", {}).get("graph_breaks"),
            "memory": [{"device": d, **v} for d, v in sorted(self.peak_memory().items())],
            "meshes": self.meshes, "wrappers": (self.end or {}).get("wrappers", []),
            "world_size": next((s["world_size"] for s in reversed(self.steps) if s.get("world_size")), None),
            "errors": [{k: e[k] for k in ("type", "message")} for e in self.errors],
            "log_tail": self.log_tail,
        }


def read_rank(path: Path, rank: int) -> RankRun:
    run = RankRun(rank)
    for line in path.read_text(errors="replace").splitlines():
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a killed process
            continue
        kind = ev.get("e")
        run.last_event = ev.get("t", run.last_event)
        if kind == "start":
            run.start = ev
        elif kind == "first_forward":
            run.first_forward = ev["t"]
        elif kind == "step":
            run.steps.append(ev)
        elif kind == "record":
            run.records[ev["name"]] = ev["value"]
        elif kind == "save":
            if ev.get("path"):
                run.saves[ev["path"]] = ev
            else:
                run.stream_saves.append(ev)
        elif kind == "mesh":
            run.meshes.append({k: v for k, v in ev.items() if k not in ("e", "t")})
        elif kind == "error":
            run.errors.append(ev)
        elif kind == "probe_error":
            run.probe_errors.append(ev)
        elif kind == "end":
            run.end = ev
    return run


def read_run(directory: Path) -> dict[int, RankRun]:
    """Rank -> what it did; ranks are those that wrote a file."""
    out = {}
    for path in sorted(directory.glob("rank*.jsonl")):
        try:
            rank = int(path.stem[4:])
        except ValueError:
            continue
        out[rank] = run = read_rank(path, rank)
        pid = (run.start or {}).get("pid")
        stacks = directory / f"stacks.rank{rank}.{pid}.txt"
        if pid is not None and stacks.is_file():
            run.stacks = stacks.read_text(errors="replace")[-20000:]
    return out


def main_thread_frames(dump: str) -> list[tuple[str, int, str]]:
    """The main thread's frames, innermost first, from a faulthandler dump (``File "f", line N in func`` lines,
    one block per thread): the thread whose outermost frame is a module's top level, else the first listed."""
    threads: list[list[tuple[str, int, str]]] = []
    for line in dump.splitlines():
        stripped = line.strip()
        if stripped.startswith(("Current thread", "Thread 0x")):
            threads.append([])
        elif stripped.startswith('File "') and threads:
            try:
                path, rest = stripped[6:].split('", line ', 1)
                number, func = rest.split(" in ", 1)
                threads[-1].append((path, int(number), func.strip()))
            except ValueError:
                continue
    threads = [t for t in threads if t]
    return next((t for t in threads if t[-1][2] == "<module>"), threads[0] if threads else [])


_WORK_WAIT = re.compile(r"(?<!\bos)\.(_?wait)\s*\(")  # not os.wait()


def _waiting_on_work(innermost: tuple[str, int, str], in_torch: bool) -> dict[str, str] | None:
    """A rank waiting for an async collective's result (rv29e defect 10): `work.wait()` (torch.distributed's Work,
    returned by ``all_reduce(..., async_op=True)``) is a C++ method, so the innermost Python frame is the job's line
    that calls it; a torch.futures Future's ``wait`` is a torch frame of that name. None otherwise."""
    path, line, func = innermost
    where_ = f"{os.path.basename(path)}:{line}"
    if in_torch:
        if func in ("wait", "_wait") and f"{os.sep}futures{os.sep}" in path:
            return {"kind": "collective", "call": "wait", "text": f"waiting in a collective's future ({where_} in "
                    f"{func})"}
        return None
    source = linecache.getline(path, line)
    if not _WORK_WAIT.search(source):
        return None
    return {"kind": "collective", "call": "wait", "text": f"waiting for an async collective (work.wait() at "
            f"{where_} in {func}: {source.strip()[:80]})"}


def where(run: RankRun) -> dict[str, str] | None:
    """Where a rank was when it was asked for its stacks: ``own`` (its innermost frame outside torch and the
    standard library: the job's own code, a sleep or a loop there), ``collective`` (inside torch.distributed, or in
    a backward, where DDP and FSDP wait for their peers' gradients; ``call`` names the collective: the innermost
    torch.distributed function, ``barrier``, ``all_reduce``, or the backward), or ``torch`` (elsewhere in torch),
    with the frames in words; None without a dump."""
    frames = main_thread_frames(run.stacks)
    if not frames:
        return None
    stdlib = sysconfig.get_paths()["stdlib"]

    def library(path: str) -> bool:
        return path.startswith("<") or (path.startswith(stdlib) and "site-packages" not in path)

    def torch_frame(path: str) -> bool:
        return any(part in path for part in TORCH_PARTS)

    def shown(frame: tuple[str, int, str]) -> str:
        return f"{os.path.basename(frame[0])}:{frame[1]} in {frame[2]}"

    inside = [f for f in frames if torch_frame(f[0])]
    own = next((f for f in frames if not library(f[0]) and not torch_frame(f[0])), None)
    waited = _waiting_on_work(frames[0], torch_frame(frames[0][0]))
    if waited is not None:
        return waited
    if not inside:
        return {"kind": "own", "text": f"in its own code at {shown(own or frames[0])}"}
    caller = next((f for f in frames[frames.index(inside[0]):] if not torch_frame(f[0]) and not library(f[0])),
                  None)
    called = f", called from {shown(caller)}" if caller else ""
    def distributed(path: str) -> bool:  # torch.distributed, DDP (nn/parallel/distributed.py), FSDP
        return f"{os.sep}distributed{os.sep}" in path or path.endswith(os.path.join("parallel", "distributed.py"))

    if any(distributed(f[0]) for f in inside):
        collective = next(f for f in inside if distributed(f[0]))
        return {"kind": "collective", "call": collective[2],
                "text": f"waiting in a collective ({shown(collective)}{called})"}
    if any(f[2] in ("_engine_run_backward", "backward") for f in inside):
        return {"kind": "collective", "call": "backward (the gradients' all-reduce)",
                "text": f"waiting in backward, where DDP and FSDP exchange gradients with every rank "
                f"({shown(inside[0])}{called})"}
    return {"kind": "torch", "text": f"in torch ({shown(inside[0])}{called})"}
