"""Launch a job for `torch-neuronx check`: on the emulated device, then on its reference path, under a deadline.

:func:`check` is the Python API of the command: it runs the job (a script,
under torchrun when ``nproc_per_node`` is given, or the built-in Hugging Face
workload for a model directory) with the probe switched on, shows progress,
kills what outlives the deadline, runs the reference, verifies the
checkpoints in a fresh CPU-only process, and returns the report document
(tools/check/verdicts.py judges it; tools/check/report.py prints it).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch_neuronx.testing.workers import kill_group
from torch_neuronx.tools.check import results, verdicts

PLACEHOLDER = "{device}"
CPU_LOADER = Path(__file__).with_name("cpu_loader.py")
CHECK_VARIABLES = ("TORCH_NEURONX_CHECK_DIR", "TORCH_NEURONX_CHECK_LAUNCH_TIME", "TORCH_NEURONX_CHECK_RANKS_ONLY")


@dataclass
class CheckConfig:
    """What to check and how; the command line's options, one to one (docs/check.md)."""

    command: list[str] = field(default_factory=list)  # the job: `train.py --args` or any command
    reference: list[str] | None = None  # the reference command; default: `command` with {device} -> cpu
    nproc_per_node: int | None = None  # run under torchrun with this many processes
    reference_nproc_per_node: int | None = -1  # the reference's (-1: as the job; None or 0: one plain process)
    instance: str | None = None  # TORCH_NEURONX_INSTANCE_TYPE for the job
    hf_model: str | None = None  # a Hugging Face model directory: the built-in workload instead of a command
    task: str = "all"  # the built-in workload's tasks: generate, sft or all
    out_dir: Path = Path("neuronx-check")
    timeout: float = 1800.0  # seconds for everything: job, reference and checkpoint loads
    checkpoints: list[str] = field(default_factory=list)  # more files or directories to load on CPU
    thresholds: verdicts.Thresholds = field(default_factory=verdicts.Thresholds)
    progress: bool = True
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None

    def validate(self) -> None:
        if bool(self.command) == bool(self.hf_model):
            raise ValueError("give either a command to check (after `--`) or --hf-model DIR, not both or neither")
        if self.hf_model is not None and not (Path(self.hf_model) / "config.json").is_file():
            raise ValueError(f"--hf-model {self.hf_model}: no config.json there; give a directory written by "
                             "save_pretrained")
        if self.task not in ("generate", "sft", "all"):
            raise ValueError(f"--task {self.task!r}: choose generate, sft or all")
        if self.nproc_per_node is not None and self.nproc_per_node < 1:
            raise ValueError(f"--nproc-per-node {self.nproc_per_node}: give a positive process count")
        if self.timeout <= 0:
            raise ValueError(f"--timeout {self.timeout}: give a positive number of seconds")
        if self.instance is not None:
            from torch_neuronx.runtime import instances

            if self.instance not in instances.INSTANCES:
                raise ValueError(f"--instance {self.instance!r} is not a Neuron instance type; choose one of "
                                 f"{', '.join(sorted(instances.INSTANCES))}")
        if self.command and self.command[0].endswith(".py") and not Path(self.cwd or ".", self.command[0]).exists():
            raise ValueError(f"the job script {self.command[0]} does not exist")


@dataclass
class Side:
    """One launch: the neuron run or the reference run."""

    name: str
    argv: list[str]
    seconds: float = 0.0
    returncode: int | None = None
    timed_out: bool = False
    ranks: dict[int, results.RankRun] = field(default_factory=dict)
    agent_log: str = ""


# ------------------------------------------------------------------ commands
def job_commands(cfg: CheckConfig) -> tuple[list[str], list[str] | None]:
    """The neuron command and the reference command (None when there is no reference path)."""
    if cfg.hf_model is not None:
        base = ["-m", "torch_neuronx.tools.check.hf_workload", "--model", str(Path(cfg.hf_model).resolve()),
                "--task", cfg.task, "--device", PLACEHOLDER, "--out", str((cfg.out_dir / "hf-{device}").resolve())]
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
    side = Side(name, argv)
    events, logs = (cfg.out_dir / name).resolve(), (cfg.out_dir / f"{name}-logs").resolve()
    for d in (events, logs):
        _clear(d)
        d.mkdir(parents=True)
        (d / MARKER).touch()
    launched = time.time()
    env = {**os.environ, **cfg.env, "TORCH_NEURONX_CHECK_DIR": str(events),
           "TORCH_NEURONX_CHECK_LAUNCH_TIME": repr(launched), "PYTHONUNBUFFERED": "1"}
    if cfg.instance:
        env["TORCH_NEURONX_INSTANCE_TYPE"] = cfg.instance
    if "torch.distributed.run" in argv:
        env["TORCH_NEURONX_CHECK_RANKS_ONLY"] = "1"
    agent = logs / "launcher.log"
    t0 = time.monotonic()
    with open(agent, "w") as out:
        try:
            proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=cfg.cwd,
                                    start_new_session=True)
        except OSError as e:
            raise ValueError(f"cannot start the job {shlex.join(argv)}: {e}") from e
        progress = Progress(name, events, enabled=cfg.progress)
        while proc.poll() is None:
            if time.monotonic() > deadline:
                side.timed_out = True
                kill_group(proc)
                break
            progress.update()
            time.sleep(0.25)
        progress.done()
    side.seconds = time.monotonic() - t0
    side.returncode = proc.returncode
    side.agent_log = agent.read_text(errors="replace")[-4000:]
    side.ranks = results.read_run(events)
    tails = _rank_logs(logs)
    for rank, run in side.ranks.items():
        run.log_tail = tails.get(rank, side.agent_log)[-3000:]
    return side


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
    """What the job wrote that should load elsewhere: torch.save files, safetensors files and HF directories."""
    wanted: dict[str, dict[str, Any]] = {}
    for run in side.ranks.values():
        for path, ev in run.saves.items():
            has_tensors = bool(ev["tensors"])  # a pickled config (training_args.bin) is not a checkpoint
            if has_tensors and Path(path).is_file() and not str(path).startswith(str(cfg.out_dir.resolve())):
                wanted.setdefault(path, {"path": path, "kind": "torch.save", "saved": ev["tensors"]})
    roots = [Path(cfg.cwd or ".").resolve()]
    if cfg.hf_model:
        roots.append((cfg.out_dir / "hf-neuron").resolve())
    for root in roots:
        for f in _newer_files(root, since):
            if cfg.hf_model and f.parent == Path(cfg.hf_model).resolve():
                continue  # the model under test, not something the job wrote
            hf_dir = f.parent if (f.parent / "config.json").is_file() else None
            key = str(hf_dir or f)
            if hf_dir is not None:
                wanted.setdefault(key, {"path": key, "kind": "hf"})
            else:
                wanted.setdefault(key, {"path": key, "kind": "safetensors"})
    for extra in cfg.checkpoints:
        p = Path(extra).resolve()
        kind = "hf" if (p / "config.json").is_file() else ("safetensors" if p.suffix == ".safetensors" else
                                                            "torch.save")
        wanted.setdefault(str(p), {"path": str(p), "kind": kind})
    return list(wanted.values())


def _newer_files(root: Path, since: float, max_depth: int = 4, max_entries: int = 20000) -> list[Path]:
    """*.safetensors files under `root` written since `since` (a bounded walk: the job's cwd may be a home)."""
    found, seen = [], 0
    for dirpath, dirnames, filenames in os.walk(root):
        depth = len(Path(dirpath).relative_to(root).parts)
        dirnames[:] = [] if depth >= max_depth else [d for d in dirnames if not d.startswith(".")]
        seen += len(filenames)
        if seen > max_entries:
            break
        for name in filenames:
            if name.endswith(".safetensors"):
                f = Path(dirpath, name)
                try:
                    if f.stat().st_mtime >= since:
                        found.append(f)
                except OSError:
                    continue
    return found


def load_on_cpu(items: list[dict[str, Any]], probe_ids: list[int] | None, deadline: float) -> dict[str, Any]:
    """Load every checkpoint in one fresh process with the plugin blocked; path -> what it found."""
    if not items:
        return {}
    request = {"items": [{"path": i["path"], "kind": i["kind"]} for i in items], "probe_ids": probe_ids}
    env = {k: v for k, v in os.environ.items() if k not in CHECK_VARIABLES}
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    try:
        r = subprocess.run([sys.executable, str(CPU_LOADER)], input=json.dumps(request), capture_output=True,
                           text=True, env=env, timeout=max(10.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return {i["path"]: {"ok": False, "error": "loading on CPU did not finish before the deadline"}
                for i in items}
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return {i["path"]: {"ok": False, "error": f"the CPU loader failed: {r.stderr[-2000:]}"} for i in items}


# ------------------------------------------------------------------ the API
def check(cfg: CheckConfig) -> dict[str, Any]:
    """Run the checklist; returns the report document (docs/check.md#json-schema)."""
    cfg.validate()
    cfg.out_dir = Path(cfg.out_dir)
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("neuron", "neuron-logs", "reference", "reference-logs"):  # refuse before anything runs
        d = cfg.out_dir / name
        if d.exists() and not (d / MARKER).exists():
            _clear(d)
    deadline = time.monotonic() + cfg.timeout
    command, reference = job_commands(cfg)
    started = time.time()
    neuron = run_side("neuron", launcher_argv(command, cfg.nproc_per_node, (cfg.out_dir / "neuron-logs")),
                      cfg, deadline)
    # The job's checkpoints are loaded before the reference run, which may write to the same paths.
    items = find_checkpoints(neuron, cfg, started)
    loaded = load_on_cpu(items, verdicts.PROBE_IDS, deadline)
    for item in items:
        item["loaded"] = loaded.get(item["path"], {"ok": False, "error": "not loaded"})
    ref = None
    if reference is not None and not neuron.timed_out:
        nproc = cfg.nproc_per_node if cfg.reference_nproc_per_node == -1 else (cfg.reference_nproc_per_node or None)
        ref = run_side("reference", launcher_argv(reference, nproc, cfg.out_dir / "reference-logs"), cfg, deadline)
    return verdicts.judge(cfg, neuron, ref, items)
