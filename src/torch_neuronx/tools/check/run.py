"""Launch a job for `torch-neuronx check`: on the emulated device, then on its reference path, under a deadline.

:func:`check` is the Python API of the command: it runs the job (a script,
under torchrun when ``nproc_per_node`` is given, or the built-in Hugging Face
workload for a model directory) with the probe switched on, shows progress,
kills what outlives the deadline, runs the reference, verifies the
checkpoints in a fresh CPU-only process, and returns the report document
(tools/check/verdicts.py judges it; tools/check/report.py prints it).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

from torch_neuronx.runtime import processes
from torch_neuronx.tools.check import results, verdicts
from torch_neuronx.tools.check.config import CheckConfig, Side, Thresholds

PLACEHOLDER = "{device}"
CPU_LOADER = Path(__file__).with_name("cpu_loader.py")
CHECK_VARIABLES = ("TORCH_NEURONX_CHECK_DIR", "TORCH_NEURONX_CHECK_LAUNCH_TIME", "TORCH_NEURONX_CHECK_RANKS_ONLY",
                   "TORCH_NEURONX_CHECK_SIDE")
__all__ = ["CheckConfig", "Side", "Thresholds", "check"]


# ------------------------------------------------------------------ commands
def job_commands(cfg: CheckConfig) -> tuple[list[str], list[str] | None]:
    """The neuron command and the reference command (None when there is no reference path)."""
    if cfg.hf_model is not None:
        base = ["-m", "torch_neuronx.tools.check.hf_workload", "--model", str(Path(cfg.hf_model).resolve()),
                "--task", cfg.task, "--device", PLACEHOLDER, "--out", str((cfg.out_dir / "hf-{device}").resolve())]
        if cfg.buckets:
            base += ["--buckets", ",".join(str(b) for b in cfg.buckets)]
        return _sub(base, "neuron"), _sub(base, "cpu")
    has_placeholder = any(PLACEHOLDER in a for a in cfg.command)
    reference = cfg.reference if cfg.reference else (_sub(cfg.command, "cpu") if has_placeholder else None)
    return _sub(cfg.command, "neuron"), reference


def _sub(argv: list[str], device: str) -> list[str]:
    return [a.replace(PLACEHOLDER, device) for a in argv]


def launcher_argv(command: list[str], nproc: int | None, log_dir: Path) -> list[str]:
    """`command` as a process list: python for a script or -m module, torchrun around it when nproc is given."""
    cmd = list(command)
    if cmd and Path(cmd[0]).name.startswith("python") and len(cmd) > 1:
        cmd = cmd[1:]  # `python train.py` and `train.py` are the same job
    is_python = bool(cmd) and (cmd[0] == "-m" or cmd[0].endswith(".py"))
    if nproc is None:
        return [sys.executable, *cmd] if is_python else cmd
    if not is_python:
        raise ValueError(f"--nproc-per-node runs a Python script or -m module under torchrun; got {cmd[0]!r}")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "--log-dir", str(log_dir), "--redirects", "3", *cmd]


# ------------------------------------------------------------------ running
def run_side(name: str, argv: list[str], cfg: CheckConfig, deadline: float) -> Side:
    """Launch one side and wait for it until the deadline; whatever happens, no process of it survives."""
    side = Side(name, argv)
    events, logs = (cfg.out_dir / name).resolve(), (cfg.out_dir / f"{name}-logs").resolve()
    for d in (events, logs):
        _clear(d)
        d.mkdir(parents=True)
        (d / MARKER).touch()
    launched = time.time()
    env = {**os.environ, **cfg.env, "TORCH_NEURONX_CHECK_DIR": str(events), "TORCH_NEURONX_CHECK_SIDE": name,
           "TORCH_NEURONX_CHECK_LAUNCH_TIME": repr(launched), "PYTHONUNBUFFERED": "1"}
    if cfg.instance:
        env["TORCH_NEURONX_INSTANCE_TYPE"] = cfg.instance
    if "torch.distributed.run" in argv:
        env["TORCH_NEURONX_CHECK_RANKS_ONLY"] = "1"
    agent = logs / "launcher.log"
    killed = logs / "killed.jsonl"
    t0 = time.monotonic()
    proc: subprocess.Popen[Any] | None = None
    started: list[subprocess.Popen[Any]] = []
    chained = _stacks_before_signals(events, started)
    try:
        with open(agent, "w") as out:
            # Under a guardian (runtime/processes.py): every process of the job, daemons included, is killed
            # when the job ends, at the deadline, on a signal, or when this checker dies (SIGKILL included).
            proc = processes.spawn(argv, report=killed, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   cwd=cfg.cwd)
            started.append(proc)
            progress = Progress(name, events, enabled=cfg.progress)
            try:
                while proc.poll() is None:
                    if time.monotonic() > deadline:
                        side.timed_out = True
                        request_stacks(events, proc.pid)  # where each rank hung, before they are killed
                        break
                    progress.update()
                    time.sleep(0.1)
            finally:
                progress.done()
    except processes.Interrupted as e:
        side.interrupted = processes.signal_name(e.signum)
        e.side = side  # type: ignore[attr-defined]  # check() reports what was seen until then
        raise
    finally:
        for sig, previous in chained.items():
            signal.signal(sig, previous)
        if proc is not None:
            processes.stop(proc)  # the deadline, a signal, an error here; at once when the job has ended
        side.seconds = time.monotonic() - t0
        side.returncode = proc.returncode if proc is not None else None
        side.killed = processes.read_report(killed)
        side.agent_log = agent.read_text(errors="replace")[-8000:] if agent.exists() else ""
        side.ranks = results.read_run(events)
        side.exits = torchrun_exits(side.agent_log)
        tails = _rank_logs(logs)
        for rank, run in side.ranks.items():
            run.log_tail = tails.get(rank, side.agent_log)[-3000:]
    return side


def request_stacks(events: Path, guardian: int, wait_s: float = 2.0) -> None:
    """Ask every rank of a job still running under `guardian` for its Python stacks (results.STACK_SIGNAL, which
    the probe gave to faulthandler) and wait, at most `wait_s`, until each wrote them: the report then says where
    each rank was when the job was killed. Only processes that are both ranks (a start event's pid) and live
    descendants of the guardian are signalled: never a process that reused a finished rank's pid."""
    if results.STACK_SIGNAL is None:
        return
    live = set(processes.descendants(guardian))
    asked = []
    for rank, run in results.read_run(events).items():
        pid = (run.start or {}).get("pid")
        if pid in live:
            try:
                os.kill(pid, results.STACK_SIGNAL)
                asked.append(events / f"stacks.rank{rank}.{pid}.txt")
            except (ProcessLookupError, PermissionError):
                continue
    until = time.monotonic() + wait_s
    while asked and time.monotonic() < until:
        if all(f.is_file() and f.stat().st_size > 0 for f in asked):
            time.sleep(0.1)  # the dump is written line by line from the handler: let it finish
            return
        time.sleep(0.05)


def _stacks_before_signals(events: Path, started: list[subprocess.Popen[Any]]) -> dict[int, Any]:
    """On SIGINT or SIGTERM, ask the job's ranks for their stacks before the handler processes.guarded installed
    kills them (it is chained, then restored by the caller): an interrupted check says where each rank was."""
    chained: dict[int, Any] = {}
    if threading.current_thread() is not threading.main_thread():
        return chained
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(sig)
        if not callable(previous):
            continue

        def handler(signum: int, frame: Any, previous: Any = previous) -> None:
            if started and started[-1].poll() is None:
                request_stacks(events, started[-1].pid, wait_s=1.0)
            previous(signum, frame)

        chained[sig] = previous
        signal.signal(sig, handler)
    return chained


_FAILURE = re.compile(r"time\s*:\s*(?P<time>[^\n]+)\n\s*host\s*:[^\n]*\n\s*rank\s*:\s*(?P<rank>\d+)[^\n]*\n"
                      r"\s*exitcode\s*:\s*(?P<code>-?\d+)[^\n]*")


def torchrun_exits(agent_log: str) -> dict[int, dict[str, Any]]:
    """Rank -> how torchrun saw it fail (its summary table: time, exit code, signal), from the agent's log. The rank
    its "Root Cause (first observed failure)" section names is marked ``root_cause``: torchrun SIGTERMs the others
    once one fails (torch/distributed/elastic/multiprocessing/errors/__init__.py, ChildFailedError.format_msg)."""
    out: dict[int, dict[str, Any]] = {}
    root_at = agent_log.rfind("Root Cause (first observed failure)")
    for m in _FAILURE.finditer(agent_log):
        code = int(m["code"])
        rank = int(m["rank"])
        out[rank] = {"exitcode": code, "time": m["time"].strip(),
                     "signal": processes.signal_name(-code) if code < 0 else None}
        if root_at >= 0 and m.start() > root_at and not any(e.get("root_cause") for e in out.values()):
            out[rank]["root_cause"] = True
    return out


MARKER = ".torch-neuronx-check"  # in every folder the checker made: only those are ever replaced


def _clear(d: Path) -> None:
    import shutil

    if d.exists():
        if not (d / MARKER).exists():
            raise ValueError(f"{d} exists and was not made by torch-neuronx check; choose another --out (the "
                             "checker replaces only its own folders)")
        shutil.rmtree(d)


def _rank_logs(logs: Path) -> dict[int, str]:
    """torchrun's per-rank logs (<log-dir>/<run>/attempt_<n>/<local rank>/std{out,err}.log), the last attempt."""
    out: dict[int, str] = {}
    for attempt in sorted(logs.glob("*/attempt_*")):
        for rank_dir in attempt.iterdir():
            if rank_dir.name.isdigit():
                parts = [(rank_dir / f).read_text(errors="replace") for f in ("stdout.log", "stderr.log")
                         if (rank_dir / f).exists()]
                out[int(rank_dir.name)] = "\n".join(p for p in parts if p)
    return out


class Progress:
    """One status line on stderr while a job runs: each rank's step and loss (rewritten in place on a terminal)."""

    def __init__(self, name: str, events: Path, enabled: bool) -> None:
        self.name, self.events, self.enabled = name, events, enabled
        self.t0 = time.monotonic()
        self.last = ""
        self.tty = sys.stderr.isatty()
        self.next_print = 0.0

    def update(self) -> None:
        if not self.enabled or time.monotonic() < self.next_print:
            return
        self.next_print = time.monotonic() + (0.5 if self.tty else 5.0)
        parts = []
        for rank, run in sorted(results.read_run(self.events).items()):
            step = run.steps[-1] if run.steps else None
            loss = f" loss {step['loss']:.4g}" if step and step.get("loss") is not None else ""
            parts.append(f"r{rank} step {len(run.steps)}{loss}")
        line = f"[check {self.name} {time.monotonic() - self.t0:5.0f}s] " + (" | ".join(parts) or "starting")
        if line != self.last:
            sys.stderr.write(("\r" + line[:150].ljust(150)) if self.tty else line + "\n")
            sys.stderr.flush()
            self.last = line

    def done(self) -> None:
        if self.enabled and self.tty and self.last:
            sys.stderr.write("\n")


# ------------------------------------------------------------------ checkpoints
def find_checkpoints(side: Side, cfg: CheckConfig, since: float) -> list[dict[str, Any]]:
    """What the job wrote that should load elsewhere: every torch.save file (a path, a named file object, or a
    buffer the probe kept a copy of), every safetensors file, the Hugging Face directories they are in
    (save_pretrained), and --checkpoint paths."""
    wanted: dict[str, dict[str, Any]] = {}
    out = str(cfg.out_dir.resolve())
    roots = [Path(cfg.cwd or ".").resolve()]
    if cfg.hf_model:  # the built-in workload saves to <out>/hf-neuron, and to <out>/hf-cpu in the reference
        roots.append((cfg.out_dir / ("hf-cpu" if side.name == "reference" else "hf-neuron")).resolve())
    written = [(f, kind) for root in roots for f, kind in _newer_files(root, since)]
    for run in side.ranks.values():
        for path, ev in run.saves.items():
            inside = path.startswith(out + os.sep) and not ev.get("buffer")
            if not Path(path).is_file() and ev.get("inode"):  # renamed after the save: found by its inode
                path = _renamed(Path(path), ev["inode"], [f for f, _ in written]) or path
            if not Path(path).is_file() or inside or _dcp_dir(Path(path)) is not None:
                continue
            hf_dir = _hf_dir(Path(path))
            if hf_dir is not None and not ev.get("buffer"):
                wanted.setdefault(str(hf_dir), {"path": str(hf_dir), "kind": "hf"})
            kind = ev.get("format", "torch.save")
            wanted.setdefault(path, {"path": path, "kind": kind, "saved": ev.get("tensors") or {},
                                     "buffer": bool(ev.get("buffer")), "rank": run.rank,
                                     "optimizer_steps": ev.get("optimizer_steps"), "trained": ev.get("trained")})
    for f, kind in written:  # every checkpoint file the job left in its folder, however it was written
        if cfg.hf_model and f.parent == Path(cfg.hf_model).resolve():
            continue  # the model under test, not something the job wrote
        if str(f).startswith(out + os.sep) and not any(r != roots[0] and r in f.parents for r in roots):
            continue  # the checker's own files (events, kept copies), not the built-in workload's output
        if kind == "dcp":  # a distributed checkpoint: its folder, loaded whole
            wanted.setdefault(str(f.parent), {"path": str(f.parent), "kind": "dcp"})
            continue
        hf_dir = _hf_dir(f)
        if hf_dir is not None:
            wanted.setdefault(str(hf_dir), {"path": str(hf_dir), "kind": "hf"})
        wanted.setdefault(str(f), {"path": str(f), "kind": kind})
    for extra in cfg.checkpoint_paths():
        for p, kind in checkpoint_targets(as_given(extra), skip=cfg.out_dir.resolve()):
            wanted.setdefault(str(p), {"path": str(p), "kind": kind})
    _when_saved(side, list(wanted.values()))
    return list(wanted.values())


def checkpoint_targets(p: Path, skip: Path | None = None) -> list[tuple[Path, str]]:
    """What a --checkpoint path stands for, with the kind of each: a save_pretrained folder ("hf") or a
    torch.distributed.checkpoint folder ("dcp"), whole; another folder, every torch.save archive and safetensors
    file in it (4 folders deep), each loaded and compared on its own, or the folder itself as "folder" when it
    holds none (rv29d: a folder of .pt files was loaded as one file, IsADirectoryError); a file (or a missing
    path) by its name. The folder `skip` (the checker's --out) is never looked in (rv29e defect 9: `--checkpoint .`
    counted the checker's own kept copies as the job's checkpoints)."""
    if _hf_dir(p / "config.json"):
        return [(p, "hf")]
    if _dcp_dir(p / ".metadata"):
        return [(p, "dcp")]
    if p.is_dir():
        found = sorted(_newer_files(p, since=0.0, skip=skip))
        return [(f.resolve(), kind) for f, kind in found if kind != "dcp"] + sorted(
            {(f.parent.resolve(), "dcp") for f, kind in found if kind == "dcp"}) or [(p, "folder")]
    return [(p, "safetensors" if p.suffix == ".safetensors" else "torch.save")]


def _when_saved(side: Side, items: list[dict[str, Any]]) -> None:
    """What the optimizer had done when each checkpoint was saved (its steps, and the allowance of each parameter
    it trained: tools/check/optimizers.py): from the save's own event (a DCP folder's: its parts'), else the
    optimizer's state at the end of the run (a file found by the folder walk, a save_pretrained folder)."""
    saves = {path: ev for run in side.ranks.values() for path, ev in run.saves.items()}
    final = next((run.end["trained"] for _, run in sorted(side.ranks.items()) if isinstance((run.end or {}).get(
        "trained"), dict) and "params" in run.end["trained"]), None)
    for item in items:
        ev = saves.get(item["path"])
        if item.get("trained") is None and ev is not None and ev.get("trained") is not None:
            item["trained"], item["optimizer_steps"] = ev["trained"], ev.get("optimizer_steps")
        if item.get("trained") is None and final is not None:
            item["trained"], item["trained_at"] = final, "the end of the run"


def reference_steps(ref: Side, item: dict[str, Any]) -> int | None:
    """The optimizer steps the reference run had taken when it saved its version of `item` (None: not known): its
    save event found by the file's inode (kept through renames and the move aside), else by its path."""
    reference = item.get("reference")
    if not reference:
        return None
    found = next((ev for run in ref.ranks.values() for p, ev in run.saves.items() if p in (item["path"], reference)),
                 None)
    if found is None:  # renamed after the save (torch.save(tmp), os.replace): its inode, the latest save holding it
        try:
            st = os.stat(reference)
        except OSError:
            return None
        same = [ev for run in ref.ranks.values() for ev in run.saves.values()
                if ev.get("inode") == [st.st_dev, st.st_ino]]
        found = max(same, key=lambda ev: ev.get("t", 0.0), default=None)
    return found.get("optimizer_steps") if found is not None else None



def pair_reference_files(items: list[dict[str, Any]], ref_items: list[dict[str, Any]]) -> None:
    """Give each checkpoint the reference run did not write at the same path its reference version elsewhere:
    the file whose path differs only by the device name (a job that saves to runs/{device}/model.pt writes
    runs/cpu/model.pt in the reference), else the one whose path ends the same way, its parent folder at least
    (dist/base/model.safetensors and cpu/base/model.safetensors), else, when exactly one unpaired file of that
    kind and name is left on each side (runs/<timestamp>/model.pt), that one. Sets item["reference"] and says how
    in "reference_paired"."""
    taken = {i["path"] for i in items} | {i["reference"] for i in items if i.get("reference")}
    free = [r for r in ref_items if r["path"] not in taken and not r.get("buffer")]
    unpaired = [i for i in items if not i.get("reference") and not i.get("buffer")]
    for item in unpaired:
        path = item["path"]  # one "neuron" replaced (the folder may hold the word too: /work/torch-neuronx), or all
        swapped = {path[:m.start()] + "cpu" + path[m.end():] for m in re.finditer("neuron", path)}
        swapped |= {path.replace("neuron", "cpu")} - {path}
        match = next((r for r in free if r["path"] in swapped and r["kind"] == item["kind"]), None)
        if match is not None:
            item["reference"], item["reference_paired"] = match["path"], "the same path with cpu for neuron"
            free.remove(match)
    for item in [i for i in unpaired if not i.get("reference")]:
        # the reference file whose path ends the same way, folders included (dist/base/model.safetensors and
        # cpu/base/model.safetensors when the two runs were given different output folders), when one ends
        # longest and with at least its parent folder
        parts = Path(item["path"]).parts
        def common(r: dict[str, Any], parts: tuple[str, ...] = parts) -> int:
            theirs, n = Path(r["path"]).parts, 0
            while n < min(len(parts), len(theirs)) and parts[-1 - n] == theirs[-1 - n]:
                n += 1
            return n
        scored = sorted(((common(r), r["path"]) for r in free if r["kind"] == item["kind"]), reverse=True)
        if scored and scored[0][0] >= 2 and (len(scored) == 1 or scored[1][0] < scored[0][0]):
            match = next(r for r in free if r["path"] == scored[0][1])
            item["reference"] = match["path"]
            item["reference_paired"] = "the reference's file whose path ends the same way"
            free.remove(match)
    for item in [i for i in unpaired if not i.get("reference")]:
        def same(x: dict[str, Any], ref: dict[str, Any] = item) -> bool:
            return x["kind"] == ref["kind"] and Path(x["path"]).name == Path(ref["path"]).name
        mine = [i for i in unpaired if not i.get("reference") and same(i)]
        theirs = [r for r in free if same(r)]
        if len(mine) == 1 and len(theirs) == 1:
            item["reference"] = theirs[0]["path"]
            item["reference_paired"] = f"the only other {Path(item['path']).name} the reference wrote"
            free.remove(theirs[0])


def _hf_dir(f: Path) -> Path | None:
    """The folder of `f` when it is a transformers model folder (a config.json with a model_type)."""
    config = f.parent / "config.json"
    try:
        return f.parent if "model_type" in json.loads(config.read_text()) else None
    except (OSError, ValueError, TypeError):
        return None


def _renamed(path: Path, inode: list[int], candidates: list[Path]) -> str | None:
    """Where a saved file went after the job renamed it: the file with its inode, beside it or among the files
    the job wrote."""
    try:
        beside = list(path.parent.iterdir()) if path.parent.is_dir() else []
    except OSError:
        beside = []
    for f in [*beside, *candidates]:
        try:
            st = f.stat()
        except OSError:
            continue
        if [st.st_dev, st.st_ino] == list(inode) and f.is_file():
            return str(f.resolve())
    return None


def _dcp_dir(f: Path) -> Path | None:
    """The folder of `f` when it is a torch.distributed.checkpoint (DCP) folder: its global ``.metadata`` file
    (torch/distributed/checkpoint/filesystem.py, ``_metadata_fn``) beside ``.distcp`` data files."""
    return f.parent if (f.parent / ".metadata").is_file() else None


def _checkpoint_kind(f: Path) -> str | None:
    """"safetensors", "torch.save" (a torch.save zip archive, whatever its name), "dcp" (the ``.metadata`` file
    of a distributed checkpoint folder; its ``.distcp`` files, which start as zip archives, are parts of it)
    or None."""
    if _dcp_dir(f) is not None:
        return "dcp" if f.name == ".metadata" else None
    if f.name.endswith(".safetensors"):
        return "safetensors"
    try:
        with open(f, "rb") as fh:
            head = fh.read(32)
        if _legacy_torch_save(head):
            return "torch.save"
        if head[:4] != b"PK\x03\x04":
            return None
        with zipfile.ZipFile(f) as z:
            return "torch.save" if any(n.endswith("/data.pkl") or n == "data.pkl" for n in z.namelist()) else None
    except (OSError, ValueError, zipfile.BadZipFile):
        return None


# torch.save's legacy format (_use_new_zipfile_serialization=False) opens with a pickled magic number
# (torch/serialization.py: MAGIC_NUMBER, written first by _legacy_save): a pickle protocol mark, then the number as a
# LONG1 opcode of 10 bytes (rv29e defect 3: a folder of such files "held no checkpoint").
_LEGACY_MAGIC = b"\x8a\n" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little")


def _legacy_torch_save(head: bytes) -> bool:
    """Whether a file's first bytes are those of a legacy-format torch.save file (any pickle protocol >= 2)."""
    return head[:1] == b"\x80" and _LEGACY_MAGIC in head[:24]  # protocol 4 puts a 9-byte frame first


def _newer_files(root: Path, since: float, max_depth: int = 4, max_entries: int = 20000,
                 skip: Path | None = None) -> list[tuple[Path, str]]:
    """Checkpoint files (safetensors, torch.save archives) under `root` written since `since`, with their kind
    (a bounded walk: the job's cwd may be a home), the folder `skip` left out."""
    found, seen = [], 0
    for dirpath, dirnames, filenames in os.walk(root):
        depth = len(Path(dirpath).relative_to(root).parts)
        dirnames[:] = [] if depth >= max_depth else [d for d in dirnames if not d.startswith(".")
                                                     and Path(dirpath, d) != skip]
        seen += len(filenames)
        if seen > max_entries:
            break
        for name in filenames:
            f = Path(dirpath, name)
            try:
                if f.stat().st_mtime < since or not f.is_file():
                    continue
            except OSError:
                continue
            kind = _checkpoint_kind(f)
            if kind is not None:
                found.append((f, kind))
    return found


def load_on_cpu(items: list[dict[str, Any]], probe_ids: list[int] | None, deadline: float,
                thresholds: Thresholds | None = None) -> dict[str, Any]:
    """Load every checkpoint (and the reference run's version of it) in one fresh process with the plugin
    blocked; path -> what it found, with the comparison against the reference's."""
    empty = {i["path"]: {"ok": False, "empty_folder": True, "error": "a folder that holds no checkpoint: "
                         "--checkpoint takes a torch.save or safetensors file, a save_pretrained or "
                         "torch.distributed.checkpoint folder, or a folder of such files"}
             for i in items if i["kind"] == "folder"}
    items = [i for i in items if i["kind"] != "folder"]
    if not items:
        return empty
    th = thresholds or Thresholds()
    request = {"items": [{"path": i["path"], "kind": i["kind"], "reference": i.get("reference"),
                          "trained": i.get("trained")} for i in items],
               "probe_ids": probe_ids, "rtol": th.loss_rtol, "atol": th.loss_atol}
    env = {k: v for k, v in os.environ.items() if k not in CHECK_VARIABLES}
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    try:
        r = subprocess.run([sys.executable, str(CPU_LOADER)], input=json.dumps(request), capture_output=True,
                           text=True, env=env, timeout=max(10.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return {**{i["path"]: {"ok": False, "error": "loading on CPU did not finish before the deadline"}
                   for i in items}, **empty}
    try:
        return {**json.loads(r.stdout.strip().splitlines()[-1]), **empty}
    except (json.JSONDecodeError, IndexError):
        return {**{i["path"]: {"ok": False, "error": f"the CPU loader failed: {r.stderr[-2000:]}"} for i in items},
                **empty}


STASH_COPY_LIMIT = 4 << 30  # bytes: what the checker copies to move a file aside across filesystems, at most
STASH_PREFIX = ".neuron-check-stash-"  # a hidden folder beside the job's folder, on its filesystem (rv29d)
STASH_ORIGIN = "origin.json"  # in it: the --out and the job's folder of the check that made it (rv29e defect 6)


def _size_within(path: Path, limit: int) -> bool:
    """Whether `path` (a regular file or link, or a folder of regular files, folders and links, no devices) holds
    at most `limit` bytes: the only things ever copied to move them aside (a device such as /dev/zero never ends).
    Links are copied as links, never followed (rv29d: runs/latest -> runs/step_5)."""
    if path.is_symlink():
        return True
    if path.is_file():
        return path.stat().st_size <= limit
    if not path.is_dir():
        return False
    total = 0
    for dirpath, dirnames, filenames in os.walk(path):
        for name in [*filenames, *dirnames]:
            f = Path(dirpath, name)
            if f.is_symlink():
                continue
            if not (f.is_file() or f.is_dir()):
                return False
            total += f.stat().st_size if f.is_file() else 0
            if total > limit:
                return False
    return True


def move_aside(src: Path, dst: Path, limit: int = STASH_COPY_LIMIT) -> bool:
    """Move a regular file, a link (as a link) or a folder: a rename on one filesystem; across filesystems a copy
    (links kept as links), only when it is at most `limit` bytes of regular files. Anything else (a device node, a
    FIFO, more bytes) is left where it is: False."""
    if not src.is_symlink() and not (src.is_file() or src.is_dir()):
        return False
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(src, dst)
        return True
    except OSError as e:
        if e.errno != errno.EXDEV:
            return False
    if not _size_within(src, limit):
        return False
    try:
        shutil.move(str(src), str(dst))  # copytree(symlinks=True) for a folder, a new link for a link
    except OSError:
        return False
    return True


def _device(p: Path) -> int | None:
    try:
        return os.stat(p).st_dev
    except OSError:
        return None


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def _drop_stash(kept: Path) -> None:
    """Remove the hidden stash folder (STASH_PREFIX) that holds `kept` (<stash>/<aside>/<i>/<name>) once nothing
    is kept in it any more (every <i> folder empty: what it kept was put back)."""
    stash = next((d for d in kept.parents if d.name.startswith(STASH_PREFIX) and (d / MARKER).is_file()), None)
    if stash is None:
        return
    try:
        if any(any(d.iterdir()) for d in stash.glob("*/*") if d.is_dir() and not d.is_symlink()):
            return
    except OSError:
        return
    shutil.rmtree(stash, ignore_errors=True)


class Aside:
    """Files moved out of the job's way, with a manifest (<root>/moved.json) written before each move: when the
    checker dies before it puts them back (SIGKILL), the next check with the same --out finds the manifest and puts
    them back before it clears anything (:meth:`recover`).

    A file is kept under <root> when that is on its filesystem (a rename); else, when the folder above the job's
    folder (`beside`) is on it, in a hidden folder there (``.neuron-check-stash-*``, removed once emptied), so that
    a --out on another filesystem (/dev/shm) costs no copy; else under <root>, copied (:func:`move_aside`)."""

    def __init__(self, root: Path, beside: Path | None = None) -> None:
        self.root = root.resolve()
        self.beside = beside
        self.stash: Path | None = None  # the hidden folder beside the job's, once made
        self.moved: list[tuple[Path, Path]] = []
        self.inputs: set[Path] = set()  # paths that are the job's inputs too (said in the manifest)

    @property
    def manifest(self) -> Path:
        return self.root / "moved.json"

    def start(self) -> None:
        _clear(self.root)
        self.root.mkdir(parents=True)
        (self.root / MARKER).touch()

    def _kept(self, original: Path, i: int) -> Path:
        """Where `original` is kept: a rename wherever one is possible (see the class)."""
        here = self.root / str(i) / original.name
        device = _device(original.parent)
        if self.beside is None or device is None or device == _device(self.root):
            return here
        if self.stash is None:
            base = self.beside.parent
            if _device(base) != device:
                return here
            try:
                made = Path(tempfile.mkdtemp(prefix=STASH_PREFIX, dir=base))
                (made / MARKER).touch()
                (made / STASH_ORIGIN).write_text(json.dumps({"out": str(self.root.parent), "job": str(self.beside)}))
            except OSError:
                return here
            self.stash = made
        return self.stash / self.root.name / str(i) / original.name

    def move(self, original: Path, i: int) -> bool:
        kept = self._kept(original, i)
        self.manifest.write_text(json.dumps(self._pairs([*self.moved, (original, kept)])))
        if not move_aside(original, kept):
            self._write()
            return False
        self.moved.append((original, kept))
        return True

    def _pairs(self, moved: list[tuple[Path, Path]]) -> list[list[str]]:
        return [[str(a), str(b), *(["input"] if a in self.inputs else [])] for a, b in moved]

    def _write(self) -> None:
        if self.moved:
            self.manifest.write_text(json.dumps(self._pairs(self.moved)))
        else:
            self.manifest.unlink(missing_ok=True)

    def drop_stash(self) -> None:
        if self.stash is not None:
            _drop_stash(self.stash / MARKER)
            if not self.stash.exists():
                self.stash = None

    @classmethod
    def recover(cls, root: Path, stranded: Path) -> list[tuple[str, bool]]:
        """Put back what a check killed before its restore left under `root` (listed in its manifest); a file the
        job's path holds now (the reference's, or one written since) is kept under `stranded`, never deleted.
        Returns what was put back, each with whether it is also one of the job's inputs (a --checkpoint that
        existed before that check's job ran)."""
        manifest = root / "moved.json"
        try:
            pairs = [(Path(entry[0]), Path(entry[1]), "input" in entry[2:]) for entry in
                     json.loads(manifest.read_text())]
        except (OSError, ValueError, TypeError, IndexError):
            return []
        put_back = []
        for i, (original, kept, is_input) in enumerate(pairs):
            if not os.path.lexists(kept):
                continue
            if os.path.lexists(original):
                aside = stranded / str(i) / original.name
                aside.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(original), str(aside))
            original.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(kept), str(original))
            put_back.append((str(original), is_input))
        for _, kept, _ in pairs:
            _drop_stash(kept)
        manifest.unlink(missing_ok=True)
        return put_back


class Stash(Aside):
    """The neuron run's files, moved aside while the reference runs (it may write the same paths, or resume
    from them), then put back: what is left on disk after a check is the neuron run's. The reference's
    versions are kept under <out>/reference-files. Only regular files, links and folders are moved (a copy of at
    most STASH_COPY_LIMIT bytes across filesystems); what could not be moved is listed in `not_hidden`. An input
    the neuron run rewrote (a --checkpoint it reads and saves again) gets its original content back for the
    reference (:meth:`plant`)."""

    def __init__(self, out_dir: Path, beside: Path | None = None) -> None:
        super().__init__(out_dir / "neuron-files", beside)
        self.ref_root = (out_dir / "reference-files").resolve()
        self.aside: dict[Path, Path] = {}  # an original path -> where the reference's version of it now is
        self.not_hidden: list[str] = []
        self.planted: dict[Path, Any] = {}  # an input's path -> the state of the original copy put there

    def reference_copy(self, path: str) -> str | None:
        """Where the reference run's version of `path` (a file or a file in a moved folder) was put aside."""
        p = Path(path)
        for original, aside in self.aside.items():
            if p == original or original in p.parents:
                found = aside / p.relative_to(original)
                return str(found) if found.exists() else None
        return None

    def hide(self, paths: list[str]) -> None:
        self.start()
        _clear(self.ref_root)
        self.ref_root.mkdir(parents=True)
        (self.ref_root / MARKER).touch()
        # An HF directory holds files that are items too: move the directory, not its files one by one.
        dirs = [Path(p) for p in paths if Path(p).is_dir() and not Path(p).is_symlink()]
        for i, p in enumerate(sorted({Path(p) for p in paths})):
            if not os.path.lexists(p) or any(d != p and d in p.parents for d in dirs):
                continue
            if not self.move(p, i):
                self.not_hidden.append(str(p))

    def plant(self, original: Path, copy: Path) -> None:
        """Put `copy` (an input's content before the neuron run) at `original` for the reference to read."""
        original.parent.mkdir(parents=True, exist_ok=True)
        if copy.is_symlink():
            os.symlink(os.readlink(copy), original)
        elif copy.is_dir():
            shutil.copytree(copy, original, symlinks=True)
        else:
            shutil.copy2(copy, original)
        self.planted[original] = _state(original)

    def restore(self) -> None:
        moved = dict(self.moved)
        for i, original in enumerate([*moved, *(p for p in self.planted if p not in moved)]):
            if os.path.lexists(original):
                if original in self.planted and _state(original) == self.planted[original]:
                    _remove(original)  # the original input put there for the reference, which did not rewrite it
                else:  # the reference's version: kept for inspection, out of the way
                    aside = self.ref_root / str(i) / original.name
                    aside.parent.mkdir(parents=True, exist_ok=True)
                    shutil.move(str(original), str(aside))
                    self.aside[original] = aside
            if original in moved:
                original.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(moved[original]), str(original))
        self.moved = []
        self.planted = {}
        self._write()
        self.drop_stash()


class Originals:
    """A copy of each --checkpoint path that exists before the job runs (<out>/checkpoint-inputs), taken before the
    neuron run: when the job reads it and writes it again (loads init.pt, trains, saves init.pt), the reference
    is given the original content at the same path, so that both runs start alike (rv29d). Paths over
    STASH_COPY_LIMIT bytes are not copied (`too_large`); the copies are removed when the check ends."""

    def __init__(self, out_dir: Path) -> None:
        self.root = (out_dir / "checkpoint-inputs").resolve()
        self.copies: dict[str, Path] = {}
        self.too_large: list[str] = []

    def keep(self, paths: list[str]) -> None:
        _clear(self.root)
        if not paths:
            return
        self.root.mkdir(parents=True)
        (self.root / MARKER).touch()
        for i, path in enumerate(paths):
            p, copy = Path(path), self.root / str(i) / Path(path).name
            if p.is_symlink():  # kept as the link (its target is an input of its own when it is a file)
                copy.parent.mkdir(parents=True)
                os.symlink(os.readlink(p), copy)
                self.copies[path] = copy
                continue
            if not _size_within(p, STASH_COPY_LIMIT):
                self.too_large.append(path)
                continue
            try:
                copy.parent.mkdir(parents=True)
                if p.is_dir():
                    shutil.copytree(p, copy, symlinks=True)
                else:
                    shutil.copy2(p, copy)
            except OSError:  # no room for it: as too large, said if the job rewrites it
                shutil.rmtree(copy.parent, ignore_errors=True)
                self.too_large.append(path)
                continue
            self.copies[path] = copy

    def drop(self) -> None:
        if (self.root / MARKER).exists():
            shutil.rmtree(self.root, ignore_errors=True)


# ------------------------------------------------------------------ the API
def check(cfg: CheckConfig) -> dict[str, Any]:
    """Run the checklist; returns the report document (docs/check.md#json-schema). Raises ValueError for bad
    input (before anything runs) and processes.Interrupted on SIGINT / SIGTERM (after the job was killed), with
    the report of what was seen until then as its ``doc`` (``interrupted`` set)."""
    cfg.validate()
    cfg.out_dir = Path(cfg.out_dir)
    try:
        cfg.out_dir.mkdir(parents=True, exist_ok=True)
    except (OSError, RecursionError) as e:
        raise ValueError(f"--out {str(cfg.out_dir)[:80]}: cannot be made ({type(e).__name__}: "
                         f"{getattr(e, 'strerror', None) or e}); give another folder") from None
    killed_until = last_activity(cfg.out_dir)  # before the folders below are cleared: a killed check's last trace
    for name in ("neuron", "neuron-logs", "reference", "reference-logs", "neuron-files", "reference-files",
                 "previous-outputs", "checkpoint-inputs"):
        d = cfg.out_dir / name  # refuse before anything runs
        if d.exists() and not (d / MARKER).exists():
            _clear(d)
    deadline = time.monotonic() + cfg.timeout
    command, reference = job_commands(cfg)
    job_dir = Path(cfg.cwd or ".").resolve()
    recovered = recover_stranded(cfg.out_dir)  # a check killed (SIGKILL) before it put the job's files back
    refuse_other_checks_stash(job_dir, cfg.out_dir)
    # what a check killed while its job ran created (never the command's own files, nor what was made after it died)
    killed_created = killed_check_outputs(cfg.out_dir, job_dir, killed_until, command)
    previous = Previous(cfg.out_dir, beside=job_dir)
    # Both runs start from the same state: neither sees what the last check's job wrote, nor what a killed check's
    # job wrote (put back just now: that check's outputs, as if it had finished, rv29d), its inputs excepted.
    previous.hide([*(p for p, is_input in recovered if not is_input), *killed_created])
    # --checkpoint paths that exist before the job runs: its inputs
    inputs = _input_states(cfg.checkpoint_paths(), cfg.out_dir.resolve())
    originals = Originals(cfg.out_dir)
    before = listing(job_dir, cfg.out_dir.resolve())
    created: list[str] = []
    started = time.time()
    neuron: Side | None = None
    ref: Side | None = None
    items: list[dict[str, Any]] = []
    not_hidden: list[str] = []
    deleted: list[str] = []
    skipped = None
    try:
        originals.keep(sorted(inputs))  # their content before the job runs, for the reference if the job rewrites
        record_listing(cfg.out_dir, job_dir, before)  # read by the next check if this one is killed (SIGKILL)
        with processes.guarded():
            neuron = run_side("neuron", launcher_argv(command, cfg.nproc_per_node, (cfg.out_dir / "neuron-logs")),
                              cfg, deadline)
            items = find_checkpoints(neuron, cfg, started)
            listed_items = {i["path"] for i in items}
            items += [{"path": p, "kind": kind} for p in inputs if p not in listed_items and os.path.isfile(p)
                      and (kind := _checkpoint_kind(Path(p))) in ("torch.save", "safetensors")]  # a link's target
            created = created_paths(before, listing(job_dir, cfg.out_dir.resolve()))
            for item in items:
                if item["path"] in inputs and _state(Path(item["path"])) == inputs[item["path"]]:
                    item["input"] = True  # loaded on CPU; never moved, never recorded as the job's output
                elif item["path"] in inputs:
                    item["input_rewritten"] = True  # read and written again: both runs start from the original
                    if not os.path.lexists(item["path"]):  # read and deleted (rv29e defect 4): nothing to load
                        item["input_deleted"] = True
            if reference is None:
                skipped = "no reference"
            elif neuron.timed_out:
                skipped = "the job timed out"
            else:
                ref, not_hidden = _reference(cfg, reference, neuron, items, created, originals, deadline)
            deleted = [i["path"] for i in items if i.get("input_deleted")]
            items = [i for i in items if not i.get("input_deleted")]  # said in words (_notes), compared with nothing
            loaded = load_on_cpu(items, verdicts.PROBE_IDS, deadline, cfg.thresholds)
            for item in items:
                item["loaded"] = loaded.get(item["path"], {"ok": False, "error": "not loaded"})
    except processes.Interrupted as e:
        previous.restore()
        originals.drop()
        record_listing(cfg.out_dir, job_dir, None)
        side = getattr(e, "side", None)
        if neuron is None:
            neuron = side if side is not None else Side("neuron", command, interrupted=processes.signal_name(e.signum))
        elif side is not None and side is not neuron:
            ref = side
        for item in items:
            item.setdefault("loaded", {"ok": False, "interrupted": True, "error": "not loaded: the check was "
                                       "interrupted"})
        if skipped is None and reference is not None and ref is None:  # it had one; the interrupt came first
            skipped = "the check was interrupted before it ran"
        e.doc = verdicts.judge(cfg, neuron, ref, items, reference_skipped=skipped)  # type: ignore[attr-defined]
        raise
    except BaseException:
        previous.restore()
        originals.drop()
        record_listing(cfg.out_dir, job_dir, None)
        raise
    previous.restore()
    originals.drop()
    record_listing(cfg.out_dir, job_dir, None)
    previous.record([p for p in [*_outputs(items, cfg), *created] if p not in inputs])
    doc = verdicts.judge(cfg, neuron, ref, items, reference_skipped=skipped)
    doc["hidden_previous_outputs"] = [str(p) for p in previous.hidden]
    listed = before is not None
    _notes(doc, cfg, items, created if ref is not None else [], not_hidden, listed or ref is None, recovered,
           previous)
    killed_only = [p for p in killed_created if p not in {q for q, _ in recovered}]
    if killed_only:
        _add(doc, "info", "stranded_files", "a previous check with this --out was killed while its job ran; what its "
             f"runs created in the job's folder ({_shown(killed_only)}) is that check's output: hidden from both runs "
             "as if it had finished, then put back where the job did not write it again")
    if deleted:
        _add(doc, "info", "checkpoint_inputs", f"--checkpoint paths that existed before the job, which deleted them "
             f"({_shown(deleted)}): read as its inputs (the reference was given their content before the neuron "
             "run at the same path), not loaded or compared: the neuron run left no version of them")
    return doc


def _reference(cfg: CheckConfig, reference: list[str], neuron: Side, items: list[dict[str, Any]],
               created: list[str], originals: Originals, deadline: float) -> tuple[Side, list[str]]:
    """Run the reference with the neuron run's files moved aside (and an input the neuron run rewrote given back
    its original content), put them back, and pair each checkpoint with the reference's version of it. Returns
    the reference and what could not be moved aside."""
    nproc = cfg.nproc_per_node if cfg.reference_nproc_per_node == -1 else (cfg.reference_nproc_per_node or None)
    stash = Stash(cfg.out_dir, beside=Path(cfg.cwd or ".").resolve())
    stash.inputs = {Path(i["path"]) for i in items if i.get("input_rewritten")}
    stash.hide([*_outputs(items, cfg), *created])
    try:
        for item in items:
            if item["path"] in stash.not_hidden:
                item["not_hidden"] = True
            elif item.get("input_rewritten"):
                copy = originals.copies.get(item["path"])
                if copy is None:
                    item["input_not_kept"] = True  # over the copy limit: the reference cannot start from it
                else:
                    stash.plant(Path(item["path"]), copy)
        ref_started = time.time()
        ref = run_side("reference", launcher_argv(reference, nproc, cfg.out_dir / "reference-logs"), cfg, deadline)
    finally:
        stash.restore()
    for item in items:  # the reference's version of each checkpoint, kept aside, to compare with
        item["reference"] = stash.reference_copy(item["path"])
        item["reference_expected"] = not item.get("buffer") and not item.get("input")
    pair_reference_files(items, find_checkpoints(ref, cfg, ref_started))
    identical = verdicts.identical_parameters(neuron, ref)
    for item in items:
        item["reference_steps"] = reference_steps(ref, item)
        if identical and isinstance(item.get("trained"), dict):
            item["trained"] = {**item["trained"], "identical_runs": True}
    return ref, stash.not_hidden


def _add(doc: dict[str, Any], verdict: str, check_name: str, message: str) -> None:
    """One more piece of correctness evidence, after judging: a warning lowers the layer's and the check's verdict."""
    layer = doc["layers"]["correctness"]
    layer["evidence"].append({"verdict": verdict, "check": check_name, "message": message})
    if verdict == "warn":
        for holder in (layer, doc):
            if holder["verdict"] == "pass":
                holder["verdict"] = "warn"


def _shown(paths: list[str]) -> str:
    return ", ".join(paths[:5]) + (", ..." if len(paths) > 5 else "")


def _notes(doc: dict[str, Any], cfg: CheckConfig, items: list[dict[str, Any]], created: list[str],
           not_hidden: list[str], listed: bool, recovered: list[tuple[str, bool]], previous: Previous) -> None:
    """What the checker did with the job's files, said in the correctness layer: files a killed check left aside,
    what the neuron run created (moved aside while the reference ran), inputs, previous outputs."""
    put_back = [p for p, _ in recovered]
    if put_back:
        _add(doc, "info", "stranded_files", "a previous check with this --out was killed before it put the job's "
             f"files back; they were put back now ({_shown(put_back)}) and, as that check's outputs, hidden from "
             "both runs as if it had finished (its inputs excepted), then put back where the job did not write them "
             f"again; what stood in their place is kept under {cfg.out_dir / STRANDED}")
    others = sorted(set(created) - {i["path"] for i in items})
    moved = [p for p in others if p not in not_hidden]
    if moved:
        _add(doc, "info", "created_files", f"what the neuron run created in the job's folder ({_shown(moved)}) was "
             "moved aside while the reference ran, so it started from the same state, then put back")
    if [p for p in others if p in not_hidden]:
        _add(doc, "warn", "created_files", "what the neuron run created in the job's folder could not all be moved "
             f"aside while the reference ran ({_shown([p for p in others if p in not_hidden])}: not a regular file, "
             "link or folder, or over the checker's copy limit on another filesystem): the reference saw it")
    if not listed:
        _add(doc, "info", "created_files", f"the job's folder {Path(cfg.cwd or '.').resolve()} holds over "
             f"{LISTING_LIMIT} entries: only the checkpoints the job wrote were moved aside while the reference ran; "
             "other files the neuron run created there were not (docs/check.md)")
    inputs_seen = [i["path"] for i in items if i.get("input") and i["kind"] != "folder"]  # not a folder without one
    if inputs_seen:
        _add(doc, "info", "checkpoint_inputs", "--checkpoint paths that existed before the job and that it did not "
             f"change ({_shown(inputs_seen)}) were read as its inputs: loaded on CPU, left in place for both runs, "
             "not recorded as its outputs")
    rewritten = [i for i in items if i.get("input_rewritten") and not i.get("input_not_kept")
                 and not i.get("not_hidden") and not i.get("input_deleted")]
    for compared in (True, False):  # only those the reference wrote a version of were compared (rv29e defect 4)
        paths = [i["path"] for i in rewritten if bool(i.get("reference")) == compared]
        if paths:
            _add(doc, "info", "checkpoint_inputs", f"--checkpoint paths that existed before the job, which wrote "
                 f"them again ({_shown(paths)}): both runs started from their content before the neuron run (the "
                 "reference from a copy put back at the same path), " + ("both runs' versions were compared, " if
                                                                         compared else "") +
                 "the neuron run's is left in place; not recorded as the job's outputs (the next check starts from "
                 "them)")
    hidden = [str(p) for p in previous.hidden if str(p) not in put_back]
    if hidden:
        _add(doc, "info", "previous_outputs", f"the files the previous check's job wrote ({_shown(hidden)}) were "
             "hidden from both runs, so both started from the same state (without them); those the job did not "
             "write again were put back")


STRANDED = "stranded-files"  # <out>/stranded-files: what stood where a killed check's files were put back


def recover_stranded(out_dir: Path) -> list[tuple[str, bool]]:
    """Put back the job's files a killed check left moved aside (<out>/neuron-files, <out>/previous-outputs),
    before anything is cleared; said on stderr and in the report. Returns each path put back, with whether it is
    one of the job's inputs (a --checkpoint that existed before that check's job)."""
    put_back: list[tuple[str, bool]] = []
    for name in ("neuron-files", "previous-outputs"):
        root = out_dir / name
        if (root / MARKER).exists():
            put_back += Aside.recover(root.resolve(), (out_dir / STRANDED / name).resolve())
    if put_back:
        print(f"torch-neuronx check: a previous check was killed before it put the job's files back; put back: "
              f"{_shown([p for p, _ in put_back])}; its outputs are hidden from both runs, as if it had finished",
              file=sys.stderr)
    return put_back


JOB_LISTING = "job-listing.json"  # <out>/job-listing.json: the job's folder before the runs of a check in progress


def record_listing(out_dir: Path, job_dir: Path, before: set[str] | None) -> None:
    """Write what the job's folder held before this check's runs (`before`), or remove it (None) once the check has
    put everything back: a check killed (SIGKILL) while its job runs leaves it, and the next check with this --out
    tells that check's outputs by it (rv29e defect 5: a file a killed neuron run wrote was recorded nowhere, and the
    next neuron run resumed from it while the reference started fresh)."""
    path = out_dir / JOB_LISTING
    if before is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(json.dumps({"job": str(job_dir), "paths": sorted(before)}))


KILLED_SLACK_S = 10.0  # a killed run's last file may follow its last line of output by this much


def killed_check_outputs(out_dir: Path, job_dir: Path, until: float | None = None,
                         command: list[str] | tuple[str, ...] = ()) -> list[str]:
    """What a check with this --out that was killed while its runs ran created in the job's folder (the topmost
    new files and folders since its recorded listing); nothing when no such check left a listing of this folder.
    Left out (rv29f defect 1): the files `command` names (the job's script, which the user may have written after
    the kill) and whatever was last written after the killed check's last trace in --out (`until`, from
    :func:`last_activity`): made by hand since, not by that check's runs."""
    try:
        recorded = json.loads((out_dir / JOB_LISTING).read_text())
        before = {str(p) for p in recorded["paths"]} if recorded["job"] == str(job_dir) else None
    except (OSError, ValueError, TypeError, KeyError):
        return []
    named = {str((job_dir / a).resolve()) for a in command if a and not a.startswith("-") and (job_dir / a).exists()}
    kept = []
    for p in created_paths(before, listing(job_dir, out_dir.resolve())):
        if any(n == p or n.startswith(p.rstrip("/") + "/") for n in named):
            continue
        if until is not None and _newest_mtime(Path(p)) > until + KILLED_SLACK_S:
            continue
        kept.append(p)
    return kept


def last_activity(out_dir: Path) -> float | None:
    """When a check with this --out last wrote its records or its runs' logs (the newest mtime under them): a
    check killed while its job ran stopped writing then."""
    newest = None
    for name in ("neuron", "neuron-logs", "reference", "reference-logs"):
        folder = out_dir / name
        if folder.is_dir():
            t = _newest_mtime(folder)
            newest = t if newest is None else max(newest, t)
    return newest


def _newest_mtime(path: Path, limit: int = 2000) -> float:
    """The newest modification time of `path` and what it holds (at most `limit` entries looked at)."""
    try:
        newest = path.lstat().st_mtime
    except OSError:
        return 0.0
    if path.is_dir() and not path.is_symlink():
        for i, (root, _dirs, files) in enumerate(os.walk(path)):
            for f in files:
                with contextlib.suppress(OSError):
                    newest = max(newest, os.lstat(os.path.join(root, f)).st_mtime)
            if i > limit:
                break
    return newest


def refuse_other_checks_stash(job_dir: Path, out_dir: Path) -> None:
    """Refuse to run while a check with another --out, killed before it put the job's files back, keeps them in a
    hidden folder beside the job's (:class:`Aside`): the job would run without them (rv29e defect 6). Its --out puts
    them back; the folder says which (origin.json)."""
    for stash in sorted(job_dir.parent.glob(STASH_PREFIX + "*")):
        try:
            origin = json.loads((stash / STASH_ORIGIN).read_text()) if (stash / MARKER).is_file() else None
            kept = origin is not None and any(any(d.iterdir()) for d in stash.glob("*/*") if d.is_dir())
        except (OSError, ValueError):
            continue
        if kept and origin.get("job") == str(job_dir) and Path(origin.get("out", "")) != out_dir.resolve():
            raise ValueError(f"a check of this job with --out {origin['out']} was killed before it put the job's "
                             f"files back; they are in {stash}: run the check with --out {origin['out']} first, "
                             "which puts them back (or move them back yourself and remove that folder)")


LISTING_LIMIT = 20000  # entries of the job's folder listed, at most (it may be a home)
LISTING_SKIPPED = ("__pycache__",)


def listing(root: Path, out_dir: Path, max_depth: int = 4) -> set[str] | None:
    """Every file and folder under `root` (its --out excluded, folders `max_depth` deep listed but not entered);
    None when there are more than LISTING_LIMIT: compared before and after the neuron run, it says what the run
    created (:func:`created_paths`)."""
    found: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        depth = len(here.relative_to(root).parts)
        dirnames[:] = [d for d in dirnames if here / d != out_dir and d not in LISTING_SKIPPED
                       and not d.startswith(STASH_PREFIX)]
        found.update(str(here / name) for name in [*dirnames, *filenames])
        if depth >= max_depth:
            dirnames[:] = []
        if len(found) > LISTING_LIMIT:
            return None
    return found


def created_paths(before: set[str] | None, after: set[str] | None) -> list[str]:
    """The topmost files and folders in `after` but not in `before` (a new folder stands for what it holds);
    nothing when either listing was cut short (a folder listed in one and not the other would look new)."""
    if before is None or after is None:
        return []
    new = after - before
    return sorted(p for p in new if not any(str(parent) in new for parent in Path(p).parents))


def as_given(p: Path) -> Path:
    """A --checkpoint path, absolute, its folders resolved but a link to a file kept as the link (rv29e defect 7:
    latest.pt -> step_5.pt was tracked as step_5.pt, so a job that replaced latest.pt had it moved aside as its
    output and the reference found no latest.pt); anything else resolved."""
    given = Path(os.path.abspath(p))
    if given.is_symlink() and not given.is_dir():
        return given.parent.resolve() / given.name
    return given.resolve()


def _state(p: Path) -> tuple[Any, ...] | None:
    """What identifies a path's content (None when it is missing): a file's device, inode, size and modification
    time; a link's own (its inode and target: a link replaced by a file or another link is a new state); a folder's,
    every file's under it (a file rewritten in place changes its folder's own times not at all)."""
    try:
        if p.is_symlink():
            st = p.lstat()
            return ("link", st.st_dev, st.st_ino, os.readlink(p))
        st = p.stat()
    except OSError:
        return None
    if not p.is_dir():
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    files = []
    for dirpath, _, filenames in os.walk(p):
        for name in filenames:
            try:
                f = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            files.append((os.path.relpath(os.path.join(dirpath, name), p), f.st_ino, f.st_size, f.st_mtime_ns))
        if len(files) > LISTING_LIMIT:
            break
    return (st.st_dev, st.st_ino, tuple(sorted(files)))


def _input_states(paths: list[Path], out: Path | None = None) -> dict[str, tuple[Any, ...]]:
    """--checkpoint paths that exist before the job runs (a plain folder: the checkpoint files in it), with what
    identifies their content (:func:`_state`): those the job leaves unchanged are its inputs (a pretrained file it
    reads); those it changes, inputs it wrote again. A folder that holds no checkpoint is none (nothing in it to
    keep for the reference; rv29e defect 9: it was copied whole, into itself when it held --out)."""
    states = {str(t): _state(t) for p in paths for t, kind in checkpoint_targets(as_given(p), skip=out)
              if kind != "folder"}
    for p in paths:  # a link to a file: the file it points to is an input too (the job may write through the link)
        if as_given(p).is_symlink() and p.resolve().is_file():
            states.setdefault(str(p.resolve()), _state(p.resolve()))
    return {p: st for p, st in states.items() if st is not None}


def _outputs(items: list[dict[str, Any]], cfg: CheckConfig) -> list[str]:
    """The checkpoint paths the job wrote (moved aside for the reference, recorded in outputs.json): not a buffer,
    not an input it only read, not the checker's own files."""
    out = str(cfg.out_dir.resolve()) + os.sep
    return [i["path"] for i in items if not i.get("buffer") and not i.get("input") and not i["path"].startswith(out)
            and i["kind"] != "folder"]


class Previous(Aside):
    """What the job wrote in the previous check with this --out (listed in <out>/outputs.json): hidden from
    both runs while they run, so that a job that resumes from its own output starts fresh on both sides, then
    put back where the job did not write them again."""

    def __init__(self, out_dir: Path, beside: Path | None = None) -> None:
        super().__init__(out_dir / "previous-outputs", beside)
        self.outputs = (out_dir / "outputs.json").resolve()
        self.hidden: list[Path] = []

    def hide(self, also: list[str] | None = None) -> None:
        """Hide the paths outputs.json lists, and `also` (what a killed check's job wrote)."""
        try:
            listed = [str(p) for p in json.loads(self.outputs.read_text())]
        except (OSError, ValueError, TypeError):
            listed = []
        paths = [Path(p) for p in dict.fromkeys([*listed, *(also or [])])]
        if not paths:
            return
        self.start()
        for i, p in enumerate(paths):
            if os.path.lexists(p) and not any(h in p.parents for h in self.hidden) and self.move(p, i):
                self.hidden.append(p)

    def restore(self) -> None:
        for original, kept in self.moved:
            if not os.path.lexists(original) and os.path.lexists(kept):
                original.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(kept), str(original))
            elif os.path.lexists(kept) and not kept.is_relative_to(self.root):
                _remove(kept)  # superseded by what the job wrote again; never copied across filesystems
        self.moved = []
        self._write()
        self.drop_stash()

    def record(self, paths: list[str]) -> None:
        self.outputs.write_text(json.dumps(sorted(set(paths))))
