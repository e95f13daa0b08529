"""The types `torch-neuronx check` passes between its modules: what to check (:class:`CheckConfig`), the limits
a verdict uses (:class:`Thresholds`) and one launch's outcome (:class:`Side`).

They live here, below both ``run`` (which launches) and ``verdicts`` (which judges), so that the package reads
in one direction: config <- results <- {run, verdicts} <- cli. Every value a user can give is validated here,
before anything runs: a bad one is a ``ValueError`` whose message names the fix (the command exits 2).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields, replace
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
    buckets: list[int] | None = None  # --hf-model: generate at each of these prompt lengths (plan --serve's buckets)
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
        if self.buckets is not None:
            self._validate_buckets()
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
        self._validate_process_counts()
        if self.command:
            job_problem(self.command, self.cwd)
        if self.reference:  # refused up front, not after the job ran (rv29c defect 10)
            job_problem(self.reference, self.cwd, "reference")
        out = Path(self.out_dir)
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out}: that is a file; give a folder (made if missing), e.g. --out neuronx-check")
        existing = next((p for p in [out, *out.parents] if p.exists()), None)
        if existing is not None and not existing.is_dir():
            raise ValueError(f"--out {out}: {existing} is a file, so the folder cannot be made; give another --out")
        if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
            raise ValueError(f"--out {out}: {existing} is not writable; give a folder you can write to")
        self._validate_out_place(out)
        job_dir = Path(self.cwd or ".").resolve()
        for extra, p in zip(self.checkpoints, self.checkpoint_paths(), strict=True):
            folder = p.resolve()
            if folder != job_dir and (folder == out.resolve() or folder in out.resolve().parents):
                raise ValueError(f"--checkpoint {extra}: it holds --out {out}, where the checker keeps its own "
                                 "files (copies of the job's inputs among them); give an --out outside it, e.g. "
                                 "--out neuronx-check")
            if p.exists() and not (p.is_file() or p.is_dir()):  # a device may never end, a FIFO blocks
                raise ValueError(f"--checkpoint {extra}: not a regular file or folder (a device or a pipe); give "
                                 "a checkpoint file or folder")

    def checkpoint_paths(self) -> list[Path]:
        """The --checkpoint paths, a relative one taken in the job's working folder (`cwd`), as the job reads it
        (rv29e defect 11: CheckConfig(cwd=JOB, checkpoints=["init.pt"]) looked in the checker's own folder)."""
        return [Path(self.cwd or ".") / extra for extra in self.checkpoints]

    def _validate_out_place(self, out: Path) -> None:
        """Refuse an --out the checker cannot make (a path thousands of folders deep) or one that holds the job's
        folder or its script's: the checker leaves its own files under --out out of the checkpoint search, so
        there it would skip the job's checkpoints (issue 29, rv29c defects 2 and 8)."""
        try:
            resolved = out.resolve()
            depth = len(resolved.parts)
        except (OSError, RuntimeError) as e:  # RecursionError is a RuntimeError
            raise ValueError(f"--out {str(out)[:80]}...: cannot be resolved ({type(e).__name__}); give a shorter "
                             "path") from None
        if depth > MAX_OUT_DEPTH or len(str(resolved)) > MAX_OUT_CHARS:
            raise ValueError(f"--out {str(out)[:80]}...: {depth} folders deep, {len(str(resolved))} characters; "
                             f"give a path at most {MAX_OUT_DEPTH} folders and {MAX_OUT_CHARS} characters long")
        job_dirs = {"the job's working folder": Path(self.cwd or ".").resolve()}
        script = self._script()
        if script is not None:
            job_dirs["the job script's folder"] = script.resolve().parent
        for what, folder in job_dirs.items():
            if folder == resolved or resolved in folder.parents:
                raise ValueError(f"--out {out}: it holds {what} ({folder}), whose checkpoints the check would "
                                 "then skip as its own files; give a folder of its own, e.g. --out neuronx-check")

    def _script(self) -> Path | None:
        """The job's script (`train.py`, `python train.py`), relative to its working folder; None for -m or a
        program."""
        cmd = list(self.command)
        if cmd and Path(cmd[0]).name.startswith("python") and len(cmd) > 1:
            cmd = cmd[1:]
        if not cmd or not cmd[0].endswith(".py"):
            return None
        return Path(self.cwd or ".") / cmd[0]

    def _validate_process_counts(self) -> None:
        """One process per NeuronCore: refuse more ranks than the instance has cores, before anything runs.

        Without --instance the job emulates TORCH_NEURONX_INSTANCE_TYPE (from --env, then the environment, then the
        runtime's default, runtime/env.py), so the limit is that instance's and 99 ranks never start.
        """
        from torch_neuronx.runtime import instances

        if self.instance is not None and self.instance not in instances.INSTANCES:
            raise ValueError(f"--instance {self.instance!r} is not a Neuron instance type; choose one of "
                             f"{', '.join(sorted(instances.INSTANCES))}")
        name = self.instance or self.env.get("TORCH_NEURONX_INSTANCE_TYPE") or \
            os.environ.get("TORCH_NEURONX_INSTANCE_TYPE") or instances.DEFAULT_INSTANCE
        inst = instances.INSTANCES.get(name)
        if inst is None:  # an unknown TORCH_NEURONX_INSTANCE_TYPE: the job's own runtime reports it
            return
        lnc_text = self.env.get("NEURON_LOGICAL_NC_CONFIG") or os.environ.get("NEURON_LOGICAL_NC_CONFIG")
        lnc = int(lnc_text) if lnc_text and lnc_text.strip().isdigit() and int(lnc_text) > 0 else inst.default_lnc
        cores = inst.physical_cores // lnc
        for flag, n in (("--nproc-per-node", self.nproc_per_node),
                        ("--reference-nproc-per-node", self.reference_nproc_per_node)):
            if n is not None and n > cores:
                raise ValueError(f"{flag} {n}: {name} has {cores} NeuronCores (logical, LNC={lnc}); "
                                 f"one process per core: give at most {cores}")

    def _validate_buckets(self) -> None:
        if self.hf_model is None:
            raise ValueError("--buckets feeds the built-in workload's generate layer: give --hf-model DIR")
        if self.task == "sft":
            raise ValueError("--buckets sets generate's prompt lengths: give --task generate or all, not sft")
        problem = bucket_problem(self.buckets)
        if problem:
            raise ValueError(f"--buckets {self.buckets}: {problem}")
        limit = max_positions(Path(self.hf_model) / "config.json")
        if limit is not None and self.buckets[-1] + HF_NEW_TOKENS > limit:
            raise ValueError(f"--buckets: bucket {self.buckets[-1]} + {HF_NEW_TOKENS} generated tokens exceeds the "
                             f"model's {limit} positions (max_position_embeddings); give buckets up to "
                             f"{limit - HF_NEW_TOKENS}")

    def effective_thresholds(self) -> Thresholds:
        """The thresholds a verdict uses: with --buckets, each bucket's first generate call compiles its own graph
        (a static cache of a new length), so the warm-up covers the SFT steps and one call per bucket, and the
        compiled decode step sees one input shape per bucket (plus the built-in prompts' one) by design."""
        if not self.buckets:
            return self.thresholds
        earlier = HF_SFT_STEPS if self.task == "all" else 0
        th = self.thresholds
        return replace(th, warmup_steps=max(th.warmup_steps, earlier + len(self.buckets)),
                       max_shapes=max(th.max_shapes, len(self.buckets) + 1))


MAX_OUT_DEPTH = 200  # --out deeper than this is refused: pathlib's mkdir(parents=True) recurses once per folder
MAX_OUT_CHARS = 3000  # and a path longer than this is refused (PATH_MAX is 4096 on Linux; the checker adds to it)


# The built-in workload's shape (tools/check/hf_workload.py): SFT steps before generate, tokens generated per call.
HF_SFT_STEPS = 4
HF_NEW_TOKENS = 8
MAX_BUCKETS = 16  # each bucket compiles a graph on Trainium (hf_workload raises Dynamo's recompile_limit, 8 per
# code object, to cover them)


def bucket_problem(buckets: object) -> str | None:
    """Why a list of prompt-length buckets cannot be run (None when it can): whole numbers >= 1, strictly
    increasing (a duplicate would compile nothing new; plan --serve writes them sorted), at most MAX_BUCKETS."""
    if not isinstance(buckets, list) or not buckets:
        return "give one or more prompt lengths, e.g. --buckets 128,512"
    if any(isinstance(b, bool) or not isinstance(b, int) for b in buckets):
        return "each bucket is a whole number of tokens"
    if any(b < 1 for b in buckets):
        return "each bucket is at least 1 token"
    if any(b >= c for b, c in zip(buckets, buckets[1:], strict=False)):
        return "give the buckets in increasing order, each once"
    if len(buckets) > MAX_BUCKETS:
        return f"at most {MAX_BUCKETS} buckets (each compiles its own graph)"
    return None


def parse_buckets(text: str) -> list[int]:
    """`--buckets 128,512` as a list; ValueError with a one-line message for anything else."""
    parts = [p.strip() for p in str(text).split(",")]
    shown = repr(text) if len(text) <= 60 else repr(text[:60] + "...")
    if not text.strip() or any(not p for p in parts):
        raise ValueError(f"--buckets {shown}: give comma-separated prompt lengths, e.g. --buckets 128,512")
    try:
        values = [int(p) for p in parts]
    except ValueError:  # also a number of thousands of digits (int() refuses it)
        raise ValueError(f"--buckets {shown}: each bucket is a whole number of tokens, e.g. --buckets 128,512") \
            from None
    problem = bucket_problem(values)
    if problem:
        raise ValueError(f"--buckets {shown}: {problem}")
    return values


def buckets_from_plan(path: str) -> list[int]:
    """The context-encoding buckets of a `torch-neuronx plan MODEL --serve --json PATH` output (its
    `context_buckets`: the prompt lengths the plan pads to)."""
    import json

    p = Path(path)
    hint = "give the JSON that `torch-neuronx plan MODEL --serve --json PATH` wrote"
    if not p.exists():
        raise ValueError(f"--buckets-from {path}: no such file; {hint}")
    if p.is_dir():
        raise ValueError(f"--buckets-from {path}: that is a folder; {hint}")
    if not p.is_file():  # a FIFO would block until a writer comes, a device may never end: refused before opening
        raise ValueError(f"--buckets-from {path}: not a regular file (a device or a pipe); {hint}")
    try:
        doc = json.loads(p.read_text())
    except RecursionError:  # lists nested thousands deep
        raise ValueError(f"--buckets-from {path}: not a plan JSON (nested too deep); {hint}") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"--buckets-from {path}: not a JSON file ({type(e).__name__})") from None
    buckets = doc.get("context_buckets") if isinstance(doc, dict) else None
    if buckets is None:
        raise ValueError(f"--buckets-from {path}: no `context_buckets` list; give the JSON of `plan --serve --json`")
    problem = bucket_problem(buckets)
    if problem:
        raise ValueError(f"--buckets-from {path}: context_buckets {str(buckets)[:80]}: {problem}")
    return list(buckets)


# The fields `plan --serve --json` writes as `model_shape` (tools/plan/serve_plan.py) and check compares with
# --hf-model's config.json: a plan of another model has other buckets (and other positions).
MODEL_SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


def _config_fields(config_json: Path) -> tuple[dict[str, object], dict[str, object]]:
    """The config.json's top level and its `text_config` (multimodal configs), each {} when unreadable."""
    import json

    try:
        config = json.loads(config_json.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return {}, {}
    if not isinstance(config, dict):
        return {}, {}
    text_config = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    return config, text_config  # type: ignore[return-value]


def _whole_field(sources: tuple[dict[str, object], ...], key: str) -> int | None:
    for source in sources:
        value = source.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def max_positions(config_json: Path) -> int | None:
    """The model's position limit: max_position_embeddings or n_positions from config.json, else its config class's
    default (Transformers fills it in when it loads the model: LlamaConfig's is 2048); None when neither says."""
    sources = _config_fields(config_json)
    for key in ("max_position_embeddings", "n_positions"):
        value = _whole_field(sources, key)
        if value is not None:
            return value
    if not sources[0].get("model_type"):
        return None
    try:
        from transformers import AutoConfig

        loaded = AutoConfig.from_pretrained(config_json.parent).get_text_config()
    except Exception:  # noqa: BLE001 - a model type this transformers does not know: no class default to use
        return None
    for key in ("max_position_embeddings", "n_positions"):
        value = getattr(loaded, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def check_plan_model(plan_path: str, hf_model: str) -> None:
    """Refuse a `plan --serve --json` output made for another model than --hf-model (its `model_shape` differs from
    the config.json's); a plan without `model_shape` (an older one) is not compared."""
    import json

    try:
        shape = json.loads(Path(plan_path).read_text()).get("model_shape")
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, AttributeError):
        return  # buckets_from_plan has already refused what it cannot read
    if not isinstance(shape, dict):
        return
    sources = _config_fields(Path(hf_model) / "config.json")
    differ = [f"{key} {shape[key]} vs {mine}" for key in MODEL_SHAPE_KEYS
              if (mine := _whole_field(sources, key)) is not None and key in shape and shape[key] != mine]
    if differ:
        raise ValueError(f"--buckets-from {plan_path}: planned for another model than --hf-model {hf_model} "
                         f"({', '.join(differ)}); run `torch-neuronx plan {hf_model} --serve --json PATH` and give "
                         "that")


def job_problem(command: list[str], cwd: Path | None, what: str = "job") -> None:
    """Refuse a job that cannot start, before anything runs: a missing script (`x.py`, `python x.py`), a
    module Python cannot find (`-m pkg.mod`, looked up the way `python -m` run in `cwd` would), or a program that
    is not on PATH."""
    import importlib.machinery
    import shutil
    import sys

    cmd = list(command)
    if Path(cmd[0]).name.startswith("python") and len(cmd) > 1:
        cmd = cmd[1:]
    base = Path(cwd or ".")
    if cmd[0] == "-m":
        if len(cmd) < 2:
            raise ValueError("-m needs a module name, e.g. `-- -m mypkg.train`")
        if not _module_exists(cmd[1], [str(base.resolve()), *sys.path], importlib.machinery.PathFinder):
            raise ValueError(f"the {what} module {cmd[1]} cannot be found (python -m {cmd[1]} would fail)")
    elif cmd[0].endswith(".py"):
        script = base / cmd[0]
        if script.exists() and not script.is_file():
            raise ValueError(f"the {what} script {cmd[0]} is not a regular file (a folder, a device or a pipe)")
        if not script.is_file():
            raise ValueError(f"the {what} script {cmd[0]} does not exist")
    elif not Path(cmd[0]).name.startswith("python") and shutil.which(cmd[0]) is None and \
            not (base / cmd[0]).is_file():
        raise ValueError(f"the {what} program {cmd[0]} is not on PATH and not a file")


def _module_exists(name: str, path: list[str], finder: type) -> bool:
    """Whether `name` (dotted) is importable from `path`, found without importing anything."""
    import importlib.util

    parts = name.split(".")
    if not all(p.isidentifier() for p in parts):
        return False
    # the job's folder and sys.path first; then every finder (editable installs, built-in modules)
    spec = finder.find_spec(parts[0], path) or importlib.util.find_spec(parts[0])  # type: ignore[attr-defined]
    if spec is None:
        return False
    for part in parts[1:]:
        locations = list(spec.submodule_search_locations or [])
        if not locations:
            return False
        spec = finder.find_spec(part, locations)  # type: ignore[attr-defined]
        if spec is None:
            return False
    return True


def check_writable_file(flag: str, path: str | Path) -> None:
    """Refuse a report path that cannot be written, before the job runs: a missing folder, a folder, something
    other than a regular file (/dev/full), or a place where opening for writing fails (/proc/c.json: as root,
    os.access approves it, so the write is tried)."""
    p = Path(path)
    if not str(path).strip():
        raise ValueError(f"{flag} '': give a file name")
    if p.is_dir():
        raise ValueError(f"{flag} {p}: that is a folder; give a file name, e.g. {p / 'check'}"
                         f"{'.json' if 'json' in flag else '.html'}")
    folder = p.parent if str(p.parent) else Path(".")
    if not folder.is_dir():
        raise ValueError(f"{flag} {p}: the folder {folder} does not exist; make it first or give another path")
    if p.exists() and not p.is_file():
        raise ValueError(f"{flag} {p}: not a regular file (a device or a pipe); give a file name to write the "
                         "report to")
    existed = p.exists()
    try:
        with open(p, "a"):
            pass
    except OSError as e:
        raise ValueError(f"{flag} {p}: cannot be written ({e.strerror or e}); give a path you can write to") from None
    if not existed:
        p.unlink(missing_ok=True)


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
    killed: list[dict[str, object]] = field(default_factory=list)  # processes the guardian had to kill
