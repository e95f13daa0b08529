"""Files in, migrated files and a report out.

Python files, notebooks and shell launchers are found under the given paths (folders are walked; hidden folders,
``__pycache__`` and the output folder are skipped). A bad input (missing or unreadable path, a file of another
kind named explicitly, text that is not UTF-8, a syntax error) gets an error in the report, exit code 2, and its
file is neither changed nor written. Nothing is overwritten without ``in_place``.
"""

from __future__ import annotations

import ast
import difflib
import io
import os
import tokenize
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from torch_neuronx.tools.migrate.python import NEURON, Target, migrate_python
from torch_neuronx.tools.migrate.report import FileReport, Flag

KINDS = {".py": "python", ".ipynb": "notebook", ".sh": "shell", ".bash": "shell"}
_SKIP_DIRS = {"__pycache__", "node_modules", ".git", ".ipynb_checkpoints"}


@dataclass
class Migrated:
    report: FileReport
    source: str | None = None
    result: str | None = None
    spawn: bool = False
    encoding: str = "utf-8"  # how the file was read, and is written back (a PEP 263 coding declaration)


def kind_of(path: Path) -> str | None:
    return KINDS.get(path.suffix.lower())


def migrate_source(code: str, kind: str = "python", target: Target = NEURON, path: str = "<string>",
                   spawn_scripts: set[str] | None = None) -> Migrated:
    """Migrate text already read. Never raises for bad input: the report carries the error."""
    rep = FileReport(path=path, kind=kind)
    m = Migrated(rep, source=code)
    try:
        if kind == "python":
            res = migrate_python(code, target)
            out, rep.rewrites, rep.flags = res.code, res.rewrites, res.flags
            m.spawn = any(r.rule == "spawn" or r.rule == "launch" for r in res.rewrites)
        elif kind == "notebook":
            from torch_neuronx.tools.migrate.notebook import migrate_notebook

            nb = migrate_notebook(code, target, spawn_scripts)
            out, rep.rewrites, rep.flags, m.spawn = nb.code, nb.rewrites, nb.flags, nb.spawn
            if not rep.rewrites and not any(f.rule != "open-todo" for f in rep.flags):
                out = code  # nothing migrated: keep the file byte for byte (no JSON re-formatting)
        elif kind == "shell":
            from torch_neuronx.tools.migrate.shell import migrate_shell

            sh = migrate_shell(code, spawn_scripts)
            out, rep.rewrites, rep.flags = sh.code, sh.rewrites, sh.flags
        else:
            rep.error = f"unknown kind {kind!r}"
            return m
        if kind != "python":  # a Python file's TODOs were matched, one for one, by migrate_python (rv32c item 13)
            rep.flags = without_reraised_todos(rep.flags)
    except cst.ParserSyntaxError as e:
        rep.error = f"syntax error: {e.message} (the file was left untouched)"
        rep.error_line = e.raw_line
        return m
    except SyntaxError as e:
        rep.error = f"syntax error: {e.msg} (the file was left untouched)"
        rep.error_line = e.lineno
        return m
    except ValueError as e:
        rep.error = f"{e} (the file was left untouched)"
        return m
    except RecursionError:
        rep.error = "the file nests too deeply to parse (the file was left untouched)"
        return m
    except Exception as e:  # noqa: BLE001 - a tool bug on one file must not abort the others (docs: bad files)
        rep.error = (f"internal error: {type(e).__name__}: {e} (the file was left untouched); please report it")
        return m
    if kind == "python" and out != code:
        try:  # the last guard of "the output always parses"
            ast.parse(out)
        except SyntaxError as e:
            rep.error = (f"internal error: the migrated code would not parse (line {e.lineno}: {e.msg}); the file was "
                         "left untouched; please report it")
            rep.error_line = e.lineno
            return m
    m.result = out
    rep.changed = out != code
    return m


def without_reraised_todos(flags: list[Flag]) -> list[Flag]:
    """An earlier migration's TODO ("open-todo") above a line that this run flagged again with the same rule is one
    flag, not two (a `!pip install torch-xla` line of a notebook, a launcher line): a second pass counts what the
    first did. Each flag raised again cancels one open TODO of its cell whose text it starts with."""
    raised: list[tuple[int | None, str]] = [(f.cell, f"{f.reason} Native: {f.suggestion}") for f in flags
                                            if f.rule != "open-todo"]
    kept = []
    for f in flags:
        if f.rule == "open-todo":
            match = next((r for r in raised if r[0] == f.cell and r[1].startswith(f.reason)), None)
            if match is not None:
                raised.remove(match)
                continue
        kept.append(f)
    return kept


def _read(path: Path, kind: str | None = None) -> tuple[str, str]:
    """The text and its encoding: UTF-8, or for Python the encoding its coding declaration names (PEP 263:
    `# -*- coding: latin-1 -*-` on line 1 or 2), as Python itself reads it."""
    data = path.read_bytes()
    if b"\x00" in data[:8192]:
        raise ValueError("a binary file, not text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        declared = _declared_encoding(data) if kind == "python" else None
        if declared is None:
            raise ValueError(f"not UTF-8 text (byte {e.start})") from e
        try:
            return data.decode(declared), declared
        except UnicodeDecodeError as bad:
            raise ValueError(f"not {declared} text, as its coding declaration says (byte {bad.start})") from bad
    if kind == "python":
        _check_declaration(data)
    return text, "utf-8"


def _check_declaration(data: bytes) -> None:
    """Python refuses a file whose coding declaration names an unknown encoding (`# coding: klingon`) or
    contradicts its UTF-8 byte-order mark (PEP 263): so does the migration (rv32d item 10), with one line."""
    try:
        tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as e:
        raise ValueError(f"Python refuses its coding declaration ({e.msg})") from e


def _declared_encoding(data: bytes) -> str | None:
    """The encoding a PEP 263 declaration names, other than UTF-8 (None without one, or an unknown one)."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError:  # an unknown encoding, or a declaration that contradicts a BOM
        return None
    return None if encoding in ("utf-8", "utf-8-sig") else encoding


def migrate_file(path: Path, target: Target = NEURON, spawn_scripts: set[str] | None = None,
                 display: str | None = None) -> Migrated:
    kind = kind_of(path)
    name = display or str(path)
    if kind is None:
        rep = FileReport(path=name, kind="unknown",
                         error="not a Python file, notebook or shell launcher (.py, .ipynb, .sh): nothing to migrate")
        return Migrated(rep)
    try:
        code, encoding = _read(path, kind)
    except (OSError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        return Migrated(FileReport(path=name, kind=kind, error=f"cannot read: {reason}"))
    bom = code.startswith("\ufeff")  # a UTF-8 byte-order mark: not Python, but kept on the way out
    m = migrate_source(code[1:] if bom else code, kind, target, name, spawn_scripts)
    m.encoding = encoding
    if bom:
        m.source = "\ufeff" + (m.source or "")
        m.result = None if m.result is None else "\ufeff" + m.result
    return m


def collect(paths: Sequence[str | Path], exclude: Path | None = None) -> tuple[list[tuple[Path, Path, Path]],
                                                                               list[FileReport]]:
    """(file, its root, the root's base for output names) for each input file; errors for bad paths."""
    found: list[tuple[Path, Path, Path]] = []
    errors: list[FileReport] = []
    for p in map(Path, paths):
        if not p.exists():
            errors.append(FileReport(path=str(p), kind="unknown", error="no such file or directory"))
        elif p.is_dir():
            if not os.access(p, os.R_OK | os.X_OK):
                errors.append(FileReport(path=str(p), kind="unknown", error="cannot read the directory"))
                continue
            _walk(p, exclude, found, errors)
        elif not p.is_file():  # a FIFO would block the read forever, a device would never end
            errors.append(FileReport(path=str(p), kind="unknown", error=_NOT_REGULAR))
        else:
            found.append((p, p.parent, p.parent))
    return found, errors


_NOT_REGULAR = "not a regular file (a FIFO, socket or device): skipped"
MAX_DEPTH = 200  # folders below a root; deeper trees are refused with an error, not walked


def _walk(root: Path, exclude: Path | None, found: list[tuple[Path, Path, Path]], errors: list[FileReport]) -> None:
    """The migratable regular files under `root`, iteratively (no recursion limit to hit), MAX_DEPTH levels at most."""
    stack = [(root, 0)]
    too_deep = False
    while stack:
        d, depth = stack.pop()
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name, reverse=True)
        except OSError as e:
            errors.append(FileReport(path=str(d), kind="unknown", error=f"cannot read: {e.strerror}"))
            continue
        files = []
        for e in entries:
            path = Path(e.path)
            if e.is_dir(follow_symlinks=False):
                if e.name.startswith(".") or e.name in _SKIP_DIRS or (
                        exclude is not None and path.resolve() == exclude.resolve()):
                    continue
                if depth + 1 > MAX_DEPTH:
                    too_deep = True
                    continue
                stack.append((path, depth + 1))
            elif kind_of(path) is not None:
                if e.is_file():
                    files.append((path, root, root))
                else:
                    errors.append(FileReport(path=str(path), kind="unknown", error=_NOT_REGULAR))
        found.extend(reversed(files))
    if too_deep:
        errors.append(FileReport(path=str(root), kind="unknown", error=f"folders nest more than {MAX_DEPTH} levels "
                                 "deep under it: the deeper ones were not searched; give a deeper folder directly"))


def output_path(path: Path, root: Path, out_dir: Path) -> Path:
    return out_dir / path.relative_to(root)


def migrate_paths(paths: Sequence[str | Path], out_dir: str | Path | None = None, in_place: bool = False,
                  target: Target = NEURON) -> list[Migrated]:
    """Migrate files and folders. Writes to `out_dir` (mirroring each root), in place, or nowhere (dry run)."""
    out = Path(out_dir) if out_dir is not None else None
    files, errors = collect(paths, exclude=out)
    results: list[Migrated] = [Migrated(e) for e in errors]
    # Python and notebooks first: the launchers need to know which scripts used xmp.spawn
    order = sorted(files, key=lambda t: kind_of(t[0]) == "shell")
    spawn: set[str] = set()
    inputs = {f.resolve() for f, _, _ in files}
    for path, root, _base in order:
        m = migrate_file(path, target, spawn_scripts=spawn)
        if m.spawn:
            spawn.add(path.name)
        rep = m.report
        if rep.error is None and m.result is not None:
            if out is not None:
                dest = output_path(path, root, out)
                if dest.resolve() in inputs:
                    rep.error = f"--out would overwrite the input {dest}: pick another folder, or use --in-place"
                else:
                    try:
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        dest.write_text(m.result, encoding=m.encoding)
                        rep.output = str(dest)
                    except OSError as e:
                        rep.error = f"cannot write {dest}: {e.strerror}"
                    except UnicodeEncodeError as e:
                        rep.error = f"cannot write {dest} as {m.encoding}: {e.reason}"
            elif in_place and rep.changed:
                try:
                    path.write_text(m.result, encoding=m.encoding)
                    rep.output = str(path)
                except OSError as e:
                    rep.error = f"cannot write {path}: {e.strerror}"
                except UnicodeEncodeError as e:
                    rep.error = f"cannot write {path} as {m.encoding}: {e.reason}"
        results.append(m)
    return results


def unified_diff(results: Iterable[Migrated]) -> str:
    chunks = []
    for m in results:
        if m.source is None or m.result is None or m.source == m.result:
            continue
        chunks.append("".join(difflib.unified_diff(m.source.splitlines(keepends=True), m.result.splitlines(
            keepends=True), fromfile=m.report.path, tofile=m.report.output or m.report.path + " (migrated)")))
    return "".join(chunks)
