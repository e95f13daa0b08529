"""Jupyter notebooks: the code cells are migrated, everything else (markdown, outputs, metadata) is kept.

IPython lines (``!cmd``, ``%magic``) are set aside before parsing and put back after; ``!`` commands and
``%%bash`` / ``%%sh`` cells go through the shell launcher rules. Names imported in one cell are known in the
next (cells run in order). The helpers a notebook needs are defined once, in the first code cell that uses one.
A cell magic (``%%time``) stays its cell's first line; a ``%%writefile`` cell is migrated as the file it writes.
A cell that does not parse is flagged and left as it was: the notebook is still migrated.
"""

from __future__ import annotations

import ast
import copy
import difflib
import json
import re
from dataclasses import dataclass, field
from typing import Any

import libcst as cst

from torch_neuronx.tools.migrate import flags as flagmod
from torch_neuronx.tools.migrate import helpers as helpermod
from torch_neuronx.tools.migrate.names import Aliases, in_family
from torch_neuronx.tools.migrate.python import (
    NEURON,
    Target,
    _todo_lines,
    add_imports,
    insert_helpers,
    might_need_migration,
    migrate_module,
)
from torch_neuronx.tools.migrate.registry import names_xla_init_method
from torch_neuronx.tools.migrate.report import Flag, Rewrite
from torch_neuronx.tools.migrate.shell import TODO, comment_block_above, migrate_shell

_MAGIC = re.compile(r"^(\s*)([!%].*)$")
_MARK = "pass  # torch-neuronx-migrate-magic-{}"
_SHELL_CELL = re.compile(r"^\s*%%(bash|sh|script\s+(ba)?sh)\b")
_CELL_MAGIC_MARK = "# torch-neuronx-migrate-cell-magic"
_WRITES_A_FILE = re.compile(r"%%(writefile|file)\b")
_APPENDS = re.compile(r"\s(-a|--append)\b")
APPEND = flagmod.FlagRule(
    "writefile-append", "This `%%writefile -a` cell appends to a file: it was migrated as a part of what the "
    "notebook's earlier cells write there (with their imports), not of what the file held before; its helpers and "
    "imports may repeat the earlier part's.",
    "merge the cells into one `%%writefile` cell, then migrate again.")


def _written_file(magic: str) -> str | None:
    """The file a `%%writefile [-a] NAME` line writes (IPython's writefile: its one positional argument)."""
    if not _WRITES_A_FILE.match(magic):
        return None
    words = [w for w in magic.split()[1:] if not w.startswith("-")]
    return words[-1].strip("'\"") if words else None


def _writes_shell(src: str) -> bool:
    """`%%writefile run.sh`: the cell is a shell script, not Python (rv32d item 11)."""
    name = _written_file(src.partition("\n")[0])
    return name is not None and name.endswith(".sh")


@dataclass
class NotebookResult:
    code: str
    rewrites: list[Rewrite] = field(default_factory=list)
    flags: list[Flag] = field(default_factory=list)
    spawn: bool = False


def _source(cell: dict[str, Any]) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _set_source(cell: dict[str, Any], text: str) -> None:
    cell["source"] = text.splitlines(keepends=True) if isinstance(cell.get("source"), list) else text


def self_shell(indent: str, magic: str, spawn_scripts: set[str] | None, cell: int, line: int,
               res: NotebookResult) -> str | None:
    """`!cmd` and `%env NAME=VALUE` lines through the launcher rules; None when there is nothing to do."""
    if magic.startswith("!"):
        prefix, cmd = "!", magic[1:]
    elif re.match(r"%pip\s", magic):
        prefix, cmd = "%", magic[1:]
    elif re.match(r"%env\s+\w+=", magic):
        prefix, cmd = "%env ", "export " + magic[len("%env"):].strip()
    else:
        return None
    sh = migrate_shell(cmd + "\n", spawn_scripts, cell=cell, line_offset=line)
    res.rewrites += sh.rewrites
    res.flags += sh.flags
    if sh.code == cmd + "\n":
        return None  # nothing to do: the line stays byte for byte
    out = []
    for s in sh.code.splitlines(keepends=True):
        body = s.strip()
        if body.startswith("# export ") and prefix == "%env ":
            out.append(indent + "# %env " + body[len("# export "):] + "\n")
        elif body.startswith("#"):
            out.append(indent + body + "\n")
        elif prefix == "%env ":
            out.append(indent + "%env " + body.removeprefix("export ").strip() + "\n")
        else:
            out.append(indent + prefix + body + "\n")
    if indent and all(line.lstrip().startswith("#") for line in out):
        out.append(indent + "pass\n")  # the line was a block's body (an `if`): the block must not end up empty
    return "".join(out)


def migrate_notebook(text: str, target: Target = NEURON, spawn_scripts: set[str] | None = None) -> NotebookResult:
    """Raises ValueError for a file that is not a notebook."""
    try:
        nb = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not a notebook: invalid JSON at line {e.lineno}: {e.msg}") from e
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise ValueError("not a notebook: no 'cells' list")
    res = NotebookResult("")
    original = copy.deepcopy(nb)
    parsed: dict[int, tuple[cst.Module, dict[int, str]]] = {}
    trees: dict[int, ast.AST] = {}
    aliases = Aliases()
    cell_magics: dict[int, str] = {}  # cell -> its `%%time` / `%%writefile x.py` line
    for i, cell in enumerate(nb["cells"]):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        src = _source(cell)
        if _SHELL_CELL.match(src) or _writes_shell(src):
            first, _, rest = src.partition("\n")
            sh = migrate_shell(rest, spawn_scripts, cell=i, line_offset=1)
            res.rewrites += sh.rewrites
            res.flags += sh.flags
            if sh.code != rest:
                _set_source(cell, first + "\n" + sh.code)
            continue
        magics: dict[int, str] = {}
        lines = src.splitlines(keepends=True)
        if lines and lines[0].startswith("%%"):  # a cell magic: it must stay the cell's first line (rv32c item 9)
            cell_magics[i] = lines[0]
            lines[0] = _CELL_MAGIC_MARK + ("\n" if lines[0].endswith("\n") else "")
        for n, line in enumerate(lines):
            if n == 0 and i in cell_magics:
                continue
            m = _MAGIC.match(line.rstrip("\n"))
            if m:
                magics[n] = line
                lines[n] = m.group(1) + _MARK.format(n) + ("\n" if line.endswith("\n") else "")
        try:
            tree = ast.parse("".join(lines))
            module = cst.parse_module("".join(lines))
        except (SyntaxError, cst.ParserSyntaxError, MemoryError, RecursionError) as e:
            if not _mentions_family(src, aliases):  # an IPython-only form (a `\` continuation), nothing to migrate
                continue
            line = getattr(e, "lineno", None) or getattr(e, "raw_line", 0)
            msg = getattr(e, "msg", None) or getattr(e, "message", None) or type(e).__name__
            res.flags.append(Flag(line=line, rule="cell-syntax", reason=f"the cell does not parse: {msg}",
                                  suggestion="fix the cell, then migrate again; it was left as it was.", cell=i))
            continue
        if not _WRITES_A_FILE.match(cell_magics.get(i, "")):  # a %%writefile body is a file of its own
            aliases.add_ast(tree)
        parsed[i] = (module, magics)
        trees[i] = tree
    # names that flagged code of any cell still uses: their imports stay in every cell (cells share one namespace)
    own_files = {i for i in parsed if _WRITES_A_FILE.match(cell_magics.get(i, ""))}
    keep: set[str] = set()
    # the cells share one namespace: `INIT = "xla://"` in one cell, the init_process_group in the next (rv32i D5)
    shared = {"xla_init_literal": any(names_xla_init_method(trees[i]) for i in parsed if i not in own_files)}
    for i, (module, _) in parsed.items():
        if i not in own_files:
            _, ctx = migrate_module(module, aliases, target, cell=i, with_helpers=False, tree=trees[i], shared=shared)
            keep |= ctx.state.get("still_used", set())
    helper_names: set[str] = set()
    first_helper_cell = None
    migrated: dict[int, cst.Module] = {}
    files: dict[str | None, Aliases] = {}  # the names each written file imports so far (cells run in order)
    appended: set[int] = set()
    for i, (module, _) in parsed.items():
        if i in own_files:  # the file %%writefile writes: its own imports and helpers, inside it
            name = _written_file(cell_magics[i])
            if _APPENDS.search(cell_magics[i]):  # `%%writefile -a`: a part of the file (rv32d item 6)
                own = files.setdefault(name, Aliases())
                appended.add(i)
                res.flags.append(Flag(line=1, rule=APPEND.rule, reason=APPEND.reason,
                                      suggestion=APPEND.suggestion, code=cell_magics[i].strip(), cell=i))
            else:
                own = files[name] = Aliases()
            own.add_ast(trees[i])
            new, ctx = migrate_module(module, own, target, cell=i, tree=trees[i])
            res.rewrites += ctx.rewrites
            res.flags += ctx.flags
            res.spawn = res.spawn or bool(ctx.state.get("spawn"))
            migrated[i] = new
            continue
        new, ctx = migrate_module(module, aliases, target, cell=i, with_helpers=False, tree=trees[i],
                                  keep_names=frozenset(keep), shared=shared)
        res.rewrites += ctx.rewrites
        res.flags += ctx.flags
        res.spawn = res.spawn or bool(ctx.state.get("spawn"))
        if ctx.helpers and first_helper_cell is None:
            first_helper_cell = i
        helper_names |= ctx.helpers
        migrated[i] = new
    if first_helper_cell is not None:
        names = helpermod.closure(helper_names)
        mod = insert_helpers(migrated[first_helper_cell], names, target)
        needed = {(m, None) for n in names for m in helpermod.HELPERS[n].imports}
        migrated[first_helper_cell] = add_imports(mod, needed, aliases)
    for i, new in migrated.items():
        cell = nb["cells"][i]
        code = new.code
        magics = parsed[i][1]
        if magics:
            out = []
            for line in code.splitlines(keepends=True):
                m = re.search(r"torch-neuronx-migrate-magic-(\d+)", line)
                if m and int(m.group(1)) in magics:
                    magic = magics[int(m.group(1))]
                    mm = _MAGIC.match(magic.rstrip("\n"))
                    if mm:
                        magic = self_shell(mm.group(1), mm.group(2), spawn_scripts, i, int(m.group(1)), res) or magic
                        if not magic.endswith("\n") and line.endswith("\n"):
                            magic += "\n"
                    out += _without_repeated_todos(out, magic.splitlines(keepends=True))
                else:
                    out.append(line)
            code = "".join(out)
        if i in cell_magics:  # back to the first line, above what the migration added
            body = code.replace(_CELL_MAGIC_MARK + "\n", "", 1).replace(_CELL_MAGIC_MARK, "", 1)
            if not body.strip() and _source(cell).partition("\n")[2].strip():  # IPython refuses an empty body
                body = "pass\n"
            if i in appended and TODO not in body.partition("\n")[0]:
                body = "".join(f"{ln}\n" for ln in _todo_lines(APPEND)) + body
            code = cell_magics[i] + ("" if cell_magics[i].endswith("\n") or not body else "\n") + body
        if code != _source(cell):
            _set_source(cell, code)
    changed = any(_source(c) != _source(o) for c, o in zip(nb["cells"], original["cells"], strict=True))
    res.code = _dump_like(nb, text) if changed else text  # untouched: byte-identical
    return res


def _dump_like(nb: dict[str, Any], original: str) -> str:
    """`nb` as JSON in the layout of the file it was read from (indent, ASCII escapes, final newline), so that a
    migrated notebook differs from its input only in the cells that changed. aws-neuron-samples' notebooks use
    indent 4, some with escaped non-ASCII text and no final newline; nbformat itself writes indent 1, unescaped."""
    first = original.lstrip("\ufeff").replace("\r\n", "\n").split("\n", 2)
    indent_text = first[1][: len(first[1]) - len(first[1].lstrip())] if len(first) > 1 else ""
    indent: int | str = len(indent_text) if indent_text.strip(" ") == "" else indent_text
    ascii_only = original.isascii()  # escaped non-ASCII text, or none: escaping keeps it so
    end = "\n" if original.endswith("\n") else ""
    compact = "\n" not in original.strip()  # written on one line
    text = json.dumps(nb, indent=None if compact else (indent or 1), ensure_ascii=ascii_only) + end
    # line endings: a CRLF notebook (written on Windows) stays CRLF; JSON escapes the newlines inside strings,
    # so every newline of `text` is a layout one
    return _endings_like(text, original) if "\r\n" in original else text


def _endings_like(text: str, original: str) -> str:
    """`text` (LF) with each line that is also in `original` ending as it ended there, and the new lines with the
    ending most of `original`'s lines have (a notebook with mixed CRLF / LF keeps its unchanged lines' bytes)."""
    old_lines = original.splitlines(keepends=True)
    new_lines = text.splitlines(keepends=True)
    crlf = sum(ln.endswith("\r\n") for ln in old_lines)
    usual = "\r\n" if 2 * crlf >= len(old_lines) else "\n"
    out = [ln[:-1] + usual if ln.endswith("\n") else ln for ln in new_lines]
    stripped_old = [ln.rstrip("\r\n") for ln in old_lines]
    stripped_new = [ln.rstrip("\r\n") for ln in new_lines]
    matcher = difflib.SequenceMatcher(None, stripped_old, stripped_new, autojunk=False)
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            old, new = old_lines[block.a + k], new_lines[block.b + k]
            if new.endswith("\n") and old.endswith("\n"):
                out[block.b + k] = old
    return "".join(out)


def _mentions_family(src: str, aliases: Aliases) -> bool:
    """Whether a cell may hold something to migrate: a marker, or a name earlier cells imported from a family."""
    if might_need_migration(src):
        return True
    names = [local for local, qualname in aliases.names.items() if in_family(qualname)]
    return bool(names) and re.search(r"\b(" + "|".join(map(re.escape, names)) + r")\b", src) is not None


def _without_repeated_todos(before: list[str], new: list[str]) -> list[str]:
    """A `!` line's TODO that the comment block above already holds (an earlier migration wrote it) is not added
    again: a second migration leaves the cell as it is, also when it raises fewer flags than the first (a
    `XLA_USE_BF16=1` the first pass removed)."""
    above = comment_block_above(before)
    return [ln for ln in new if not (ln.strip().startswith(TODO) and ln.strip() in above)]
