"""The types `torch-neuronx check` passes between its modules: what to check (:class:`CheckConfig`), the limits
a verdict uses (:class:`Thresholds`) and one launch's outcome (:class:`Side`).

They live here, below both ``run`` (which launches) and ``verdicts`` (which judges), so that the package reads
in one direction: config <- results <- {run, verdicts} <- cli. Every value a user can give is validated here,
before anything runs: a bad one is a ``ValueError`` whose message names the fix (the command exits 2).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

from torch_neuronx.tools.check import results


@dataclass
class Thresholds:
    """Every limit a verdict uses (command-line flag in brackets)."""

    loss_rtol: float = 1e-3  # |loss - reference| <= loss_atol + loss_rtol * |reference|   [--loss-rtol]
    loss_atol: float = 1e-4  # [--loss-atol]
    warmup_steps: int = 2  # recompiling after this many steps fails: the steady state was interrupted
    max_shapes: int = 4  # more distinct input shapes for one compiled function warns   [--max-shapes]
    memory_warn: float = 0.9  # peak device memory above this share of a core's HBM warns   [--memory-warn]
    max_startup_s: float = 600.0  # launch to first forward, longer warns   [--max-startup]

    def validate(self) -> None:
        """Refuse limits that would make a verdict meaningless (a NaN tolerance fails every comparison)."""
        flags = {"loss_rtol": "--loss-rtol", "loss_atol": "--loss-atol", "warmup_steps": "--warmup-steps",
                 "max_shapes": "--max-shapes", "memory_warn": "--memory-warn", "max_startup_s": "--max-startup"}
        for f in fields(self):
            value = getattr(self, f.name)
            flag = flags[f.name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or \
                    math.isinf(value):
                raise ValueError(f"{flag} {value!r}: give a finite number")
            if value < 0:
                raise ValueError(f"{flag} {value}: give a number >= 0")
        if self.max_shapes < 1:
            raise ValueError(f"--max-shapes {self.max_shapes}: give at least 1 (the first shape always compiles)")
        if not 0 < self.memory_warn <= 1:
            raise ValueError(f"--memory-warn {self.memory_warn}: give a share of a core's HBM in (0, 1], e.g. 0.9")
        if self.max_startup_s == 0:
            raise ValueError("--max-startup 0: give a positive number of seconds")
        if int(self.warmup_steps) != self.warmup_steps or int(self.max_shapes) != self.max_shapes:
            raise ValueError("--warmup-steps and --max-shapes are whole numbers")


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
    thresholds: Thresholds = field(default_factory=Thresholds)
    progress: bool = True
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None

    def validate(self) -> None:
        if self.reference is not None and not self.command and self.hf_model is None:
            raise ValueError("--reference was given but no job: put the job first, then the reference, e.g. "
                             "`torch-neuronx check -- train.py --reference -- ref.py`")
        if bool(self.command) == bool(self.hf_model):
            raise ValueError("give either a command to check (after `--`) or --hf-model DIR, not both or neither")
        if self.hf_model is not None and not (Path(self.hf_model) / "config.json").is_file():
            raise ValueError(f"--hf-model {self.hf_model}: no config.json there; give a directory written by "
                             "save_pretrained")
        if self.task not in ("generate", "sft", "all"):
            raise ValueError(f"--task {self.task!r}: choose generate, sft or all")
        if self.nproc_per_node is not None and self.nproc_per_node < 1:
            raise ValueError(f"--nproc-per-node {self.nproc_per_node}: give a positive process count")
        if self.reference_nproc_per_node is not None and self.reference_nproc_per_node < -1:
            raise ValueError(f"--reference-nproc-per-node {self.reference_nproc_per_node}: give 0 (one plain "
                             "process) or a positive process count")
        timeout = self.timeout
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or math.isnan(timeout) or \
                math.isinf(timeout) or timeout <= 0:
            raise ValueError(f"--timeout {timeout!r}: give a positive, finite number of seconds")
        self.thresholds.validate()
        if self.instance is not None:
            from torch_neuronx.runtime import instances

            if self.instance not in instances.INSTANCES:
                raise ValueError(f"--instance {self.instance!r} is not a Neuron instance type; choose one of "
                                 f"{', '.join(sorted(instances.INSTANCES))}")
        if self.command and self.command[0].endswith(".py") and not Path(self.cwd or ".", self.command[0]).exists():
            raise ValueError(f"the job script {self.command[0]} does not exist")
        out = Path(self.out_dir)
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out}: that is a file; give a folder (made if missing), e.g. --out neuronx-check")
        existing = next((p for p in [out, *out.parents] if p.exists()), None)
        if existing is not None and not existing.is_dir():
            raise ValueError(f"--out {out}: {existing} is a file, so the folder cannot be made; give another --out")
        if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
            raise ValueError(f"--out {out}: {existing} is not writable; give a folder you can write to")


def check_writable_file(flag: str, path: str | Path) -> None:
    """Refuse a report path whose folder is missing or unwritable, or that names a folder, before the job runs."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag} {p}: that is a folder; give a file name, e.g. {p / 'check'}"
                         f"{'.json' if 'json' in flag else '.html'}")
    folder = p.parent if str(p.parent) else Path(".")
    if not folder.is_dir():
        raise ValueError(f"{flag} {p}: the folder {folder} does not exist; make it first or give another path")
    if not os.access(folder, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ValueError(f"{flag} {p}: {folder if not p.exists() else p} is not writable; give a path you can "
                         "write to")


@dataclass
class Side:
    """One launch: the neuron run or the reference run."""

    name: str
    argv: list[str]
    seconds: float = 0.0
    returncode: int | None = None
    timed_out: bool = False
    interrupted: str | None = None  # the signal that stopped the checker while this side ran
    ranks: dict[int, results.RankRun] = field(default_factory=dict)
    agent_log: str = ""
    exits: dict[int, dict[str, object]] = field(default_factory=dict)  # torchrun's record of each rank's exit
