"""Shell launchers (``.sh``, and the ``!`` lines and ``%%bash`` cells of notebooks): the XLA-era environment.

Line by line (shell is not Python: no codemod exists for it, and launchers are short):

- ``neuron_parallel_compile CMD`` -> ``CMD`` (the ahead-of-time graph extraction run has nothing to do natively);
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
_NPC = re.compile(r"\bneuron_parallel_compile\s+")
_FAMILY = re.compile(r"torch[-_]xla|optimum[-_.]neuron|optimum-cli\s+neuron|neuronx[-_]distributed")
_EXPORT = re.compile(r"\boptimum-cli\s+export\s+neuron\b")
_PYTHON = re.compile(r"\bpython3?\s+(?:-u\s+)?(\S+\.py)\b")

SPAWN = flagmod.FlagRule(
    "xmp-launch", "This script used xmp.spawn, which started one process per NeuronCore; the migrated script "
    "is one torchrun worker.", "torchrun --nproc-per-node <cores> SCRIPT (as many processes as xmp.spawn used).")
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


def migrate_shell(code: str, spawn_scripts: set[str] | None = None, cell: int | None = None,
                  line_offset: int = 0) -> ShellResult:
    spawn_scripts = spawn_scripts or set()
    lines = code.splitlines(keepends=True)
    out: list[str] = []
    res = ShellResult("")
    for n, raw in enumerate(lines, 1):
        line = raw.rstrip("\n")
        eol = raw[len(line):]
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        lineno = n + line_offset
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
        if _NPC.search(new):
            new = _NPC.sub("", new)
            warnings.append("neuron_parallel_compile removed: the native backend compiles when torch.compile runs")
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
        prev = out[-1].strip() if out else ""
        for rule in todos:
            todo = _todo(indent, rule)
            res.flags.append(Flag(line=lineno, rule=rule.rule, reason=rule.reason, suggestion=rule.suggestion,
                                  code=line.strip(), cell=cell))
            if prev != todo.strip():
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
