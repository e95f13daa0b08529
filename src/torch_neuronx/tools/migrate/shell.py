"""Shell launchers (``.sh``, and the ``!`` lines and ``%%bash`` cells of notebooks): the XLA-era environment.

Line by line (shell is not Python: no codemod exists for it, and launchers are short):

- ``neuron_parallel_compile CMD`` -> commented out, with its ``\\`` continuation lines (its trial run only extracted
  and compiled graphs, with invalid outputs; natively there is nothing to compile ahead of time, and running CMD
  would train for real); flagged where it is not a command of its own (inside a string, after ``then`` ...);
- ``NEURON_CC_FLAGS`` -> dropped, with a warning naming each flag (neuronx-cc options);
- ``XLA_*`` / ``PJRT_*`` runtime variables -> dropped, with a warning;
- ``XLA_USE_BF16`` / ``XLA_DOWNCAST_BF16`` -> flagged: the bf16 choice moves into the script;
- ``NEURON_RT_*`` (runtime: visible cores, ...) -> kept;
- ``python script.py`` for a script that called ``xmp.spawn`` -> flagged: launch it with ``torchrun``;
- ``optimum-cli export neuron`` -> flagged (an inference export, declined);
- any other mention of torch-xla, optimum-neuron or neuronx-distributed -> flagged.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from torch_neuronx.tools.migrate import flags as flagmod
from torch_neuronx.tools.migrate.report import Flag, Rewrite

TODO = "# TODO(torch-neuronx migrate):"
_ASSIGN = r"(?:export\s+)?{name}=(?:\"[^\"]*\"|'[^']*'|\S*)"
_BF16 = re.compile(_ASSIGN.format(name=r"(?:XLA_USE_BF16|XLA_DOWNCAST_BF16)"))
_CC = re.compile(_ASSIGN.format(name=r"NEURON_CC_FLAGS"))
_XLA_ENV = re.compile(_ASSIGN.format(name=r"(?:XLA_[A-Z0-9_]+|PJRT_[A-Z0-9_]+|TPU_[A-Z0-9_]+)"))
_NPC = re.compile(r"\bneuron_parallel_compile\b")
# a command line that starts the trial run: `[time|nohup|env|exec|sudo] [VAR=value ...] neuron_parallel_compile ...`
_NPC_COMMAND = re.compile(r"(?:(?:time|nohup|env|exec|sudo(?:\s+-E)?)\s+"
                          r"|[A-Za-z_][A-Za-z0-9_]*=(?:\"[^\"]*\"|'[^']*'|\S*)\s+)*neuron_parallel_compile\b")
_FAMILY = re.compile(r"torch[-_]xla|optimum[-_.]neuron|optimum-cli\s+neuron|neuronx[-_]distributed")
_EXPORT = re.compile(r"\boptimum-cli\s+export\s+neuron\b")
_PYTHON = re.compile(r"\bpython3?\s+(?:-u\s+)?(\S+\.py)\b")

SPAWN = flagmod.FlagRule(
    "xmp-launch", "This script used xmp.spawn, which started one process per NeuronCore; the migrated script "
    "is one torchrun worker.", "torchrun --nproc-per-node <cores> SCRIPT (as many processes as xmp.spawn used).")
PARALLEL_COMPILE = flagmod.FlagRule(
    "parallel-compile", "neuron_parallel_compile ran its command as a trial that only extracted and compiled graphs "
    "(outputs invalid); without it the command trains for real.",
    "remove the trial run: the native backend compiles when torch.compile runs; keep only the real command.")
FAMILY = flagmod.FlagRule(
    "launcher-family", "The launcher names the XLA-era stack (torch-xla, optimum-neuron or neuronx-distributed).",
    "install torch-neuronx (TorchNeuron) and the Hugging Face libraries instead; see docs/migrate.md.")

EXPORT = flagmod.FlagRule(
    "optimum-export", "Declined: `optimum-cli export neuron` compiles an inference artifact ahead of time with "
    "neuronx-cc; it is not part of a training migration.",
    "for native inference, transformers' from_pretrained(..., device_map='neuron') and generate(), or "
    "torch.compile(model, backend='neuron').")


@dataclass
class ShellResult:
    code: str
    rewrites: list[Rewrite] = field(default_factory=list)
    flags: list[Flag] = field(default_factory=list)


def _cc_flags(assignment: str) -> list[str]:
    value = assignment.split("=", 1)[1]
    try:
        words = shlex.split(value)
    except ValueError:
        words = value.split()
    words = [w for word in words for w in word.split()]
    return [w for w in words if w.startswith("-")]


def _todo(indent: str, rule: flagmod.FlagRule) -> str:
    return f"{indent}{TODO} {rule.reason} Native: {rule.suggestion}"


def comment_block_above(lines: list[str]) -> set[str]:
    """The stripped comment lines right above the end of `lines` (up to the first line that is not a comment)."""
    block: set[str] = set()
    for line in reversed(lines):
        if not line.strip().startswith("#"):
            break
        block.add(line.strip())
    return block


def _trial_run(indent: str, stripped: str, eol: str, lineno: int, cell: int | None, res: ShellResult) -> str:
    """`neuron_parallel_compile CMD`, commented out. Its run extracts graphs and runs stubs that return zeros
    (NEURON_EXTRACT_GRAPHS_ONLY, AWS's torch-neuronx environment variables and neuron_parallel_compile pages);
    Optimum even skips save_model under it (optimum/neuron/trainers/transformers.py). Running CMD instead would be
    a second, real training."""
    res.rewrites.append(Rewrite(line=lineno, rule="launcher", before=stripped, after=f"# {stripped}", cell=cell,
                                warning="neuron_parallel_compile trial run commented out: it only compiled graphs "
                                "ahead of time (its outputs were invalid); the native backend compiles when "
                                "torch.compile runs"))
    return f"{indent}# {stripped}{eol}"


def migrate_shell(code: str, spawn_scripts: set[str] | None = None, cell: int | None = None,
                  line_offset: int = 0) -> ShellResult:
    spawn_scripts = spawn_scripts or set()
    lines = code.splitlines(keepends=True)
    out: list[str] = []
    res = ShellResult("")
    continued: str | None = None  # inside a trial-run command (its `\\` continuation): the command's indent
    for n, raw in enumerate(lines, 1):
        line = raw.rstrip("\n")
        eol = raw[len(line):]
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        lineno = n + line_offset
        if continued is not None or _NPC_COMMAND.match(stripped):
            if continued is None:
                continued = indent
                out.append(_trial_run(indent, stripped, eol, lineno, cell, res))
            else:
                out.append(f"{indent}# {stripped}{eol}" if stripped else raw)
            if not line.endswith("\\"):  # the command ends here; an indented one (an `if` body) keeps a `:`
                out += [f"{continued}:{eol or chr(10)}"] if continued else []
                continued = None
            continue
        if not stripped or stripped.startswith("#"):
            if stripped.startswith(TODO):  # left by an earlier migration: still open
                res.flags.append(Flag(line=lineno, rule="open-todo", reason=stripped[len(TODO):].strip(),
                                      suggestion="see the TODO", code=stripped, cell=cell))
            out.append(raw)
            continue
        new = line
        warnings: list[str] = []
        todos: list[flagmod.FlagRule] = []
        for m in list(_CC.finditer(new)):
            cc = _cc_flags(m.group(0))
            warnings.append("dropped NEURON_CC_FLAGS" + (f": {' '.join(cc)} (neuronx-cc options the native backend "
                                                         "does not read)" if cc else ""))
        new = _CC.sub("", new)
        for m in list(_XLA_ENV.finditer(new)):
            if _BF16.fullmatch(m.group(0)):
                continue
            warnings.append(f"dropped {m.group(0).replace('export ', '').split('=')[0]} (an XLA runtime variable)")
        new = re.sub(_XLA_ENV, lambda m: m.group(0) if _BF16.fullmatch(m.group(0)) else "", new)
        if _NPC.search(new.split(" #", 1)[0]):
            todos.append(PARALLEL_COMPILE)
        if _BF16.search(new):
            todos.append(flagmod.BF16)
            new = _BF16.sub("", new)
        new_stripped = new.strip()
        if new_stripped in ("export", ""):
            new = ""
        else:
            new = indent + new.lstrip()
            new = re.sub(r"(?<=\S)  +", " ", new) if new != line else new
        for m in _PYTHON.finditer(new):
            if m.group(1).rsplit("/", 1)[-1] in spawn_scripts:
                todos.append(SPAWN)
        if _EXPORT.search(new):
            todos.append(EXPORT)
        elif _FAMILY.search(new):
            todos.append(FAMILY)
        above = comment_block_above(out)
        for rule in todos:
            todo = _todo(indent, rule)
            res.flags.append(Flag(line=lineno, rule=rule.rule, reason=rule.reason, suggestion=rule.suggestion,
                                  code=line.strip(), cell=cell))
            if todo.strip() not in above:  # an earlier migration wrote it (a second pass adds nothing)
                out.append(todo + "\n")
        if new != line:
            res.rewrites.append(Rewrite(line=lineno, rule="launcher", before=line.strip(), after=new.strip(),
                                        warning="; ".join(warnings), cell=cell))
            if new.strip():
                if flagmod.BF16 in todos:  # `XLA_USE_BF16=1 python train.py`: the assignment stays visible, commented
                    out.append(f"{indent}# {line.strip()}{eol}")
                out.append(new + eol)
            elif todos:  # keep the flagged line visible, commented out
                out.append(f"{indent}# {line.strip()}{eol}")
        else:
            out.append(raw)
    res.code = "".join(out)
    return res
