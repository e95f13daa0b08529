"""The migration report: per file, each rewrite (line, before, after) and each flag (line, reason, suggestion),
as text for a terminal and as a JSON document for CI."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1


@dataclass
class Rewrite:
    """One mechanical rewrite. ``warning`` is set when something was dropped that a person may want to know of."""

    line: int
    rule: str
    before: str
    after: str
    warning: str = ""
    cell: int | None = None  # notebooks: the code cell's index in the notebook


@dataclass
class Flag:
    """One place that needs a person: a TODO comment was left at the line."""

    line: int
    rule: str
    reason: str
    suggestion: str
    code: str = ""
    cell: int | None = None


@dataclass
class FileReport:
    path: str
    kind: str  # python | notebook | shell
    output: str | None = None  # where the migrated file was written (None: dry run, or nothing to write)
    changed: bool = False
    rewrites: list[Rewrite] = field(default_factory=list)
    flags: list[Flag] = field(default_factory=list)
    error: str | None = None  # bad input: the file was left untouched
    error_line: int | None = None
    check_report: str | None = None  # --check: the check report written for this file

    @property
    def exit_code(self) -> int:
        return 2 if self.error else (1 if self.flags else 0)


def exit_code(files: list[FileReport]) -> int:
    """0: nothing flagged; 1: flags remain; 2: a bad input (it wins: CI must see it)."""
    return max((f.exit_code for f in files), default=2)


def document(files: list[FileReport], **extra: Any) -> dict[str, Any]:
    return {
        "version": SCHEMA_VERSION,
        "tool": "torch-neuronx migrate",
        "exit_code": exit_code(files),
        "summary": {
            "files": len(files),
            "changed": sum(f.changed for f in files),
            "rewrites": sum(len(f.rewrites) for f in files),
            "flags": sum(len(f.flags) for f in files),
            "errors": sum(bool(f.error) for f in files),
        },
        "files": [asdict(f) for f in files],
        **extra,
    }


def write_json(files: list[FileReport], path: str | Path, **extra: Any) -> None:
    Path(path).write_text(json.dumps(document(files, **extra), indent=2) + "\n")


def _where(line: int, cell: int | None) -> str:
    return f"cell {cell} line {line}" if cell is not None else f"line {line}"


def _one_line(code: str, width: int = 100) -> str:
    code = " ".join(code.split())
    return code if len(code) <= width else code[: width - 3] + "..."


def text(files: list[FileReport]) -> str:
    out: list[str] = []
    for f in files:
        dest = f" -> {f.output}" if f.output else ""
        if f.error:
            where = f" (line {f.error_line})" if f.error_line else ""
            out.append(f"{f.path}: ERROR{where}: {f.error}")
            continue
        out.append(f"{f.path}{dest}: {len(f.rewrites)} rewrite(s), {len(f.flags)} flag(s)")
        for r in f.rewrites:
            after = _one_line(r.after) if r.after else "(removed)"
            out.append(f"  {_where(r.line, r.cell)}  [{r.rule}] {_one_line(r.before)}  =>  {after}")
            if r.warning:
                out.append(f"      warning: {r.warning}")
        for fl in f.flags:
            out.append(f"  {_where(fl.line, fl.cell)}  FLAG [{fl.rule}] {fl.reason}")
            out.append(f"      native: {fl.suggestion}")
    code = exit_code(files)
    total_r = sum(len(f.rewrites) for f in files)
    total_f = sum(len(f.flags) for f in files)
    errors = sum(bool(f.error) for f in files)
    out.append(f"\n{len(files)} file(s): {total_r} rewrite(s), {total_f} flag(s), {errors} error(s); exit code {code}")
    return "\n".join(out)
