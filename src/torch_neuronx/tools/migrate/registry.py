"""The rule registry and what every rule shares: the ``Rules`` a family registers, the ``Ctx`` a rule works with,
the ``Target`` it writes for, and the expression helpers (arguments bound by a published signature, literals,
code building).

Each ``rules_*`` module depends on this module only; the engine (``python``) merges the families' ``Rules`` and
runs them. Nothing depends on a rules module but the engine, so a family can be added or removed alone.
"""

from __future__ import annotations

import ast
import functools
import re
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import libcst as cst

from torch_neuronx.tools.migrate import flags as flagmod
from torch_neuronx.tools.migrate import helpers as helpermod
from torch_neuronx.tools.migrate.names import Aliases
from torch_neuronx.tools.migrate.report import Flag, Rewrite

TODO = "# TODO(torch-neuronx migrate):"
REMOVED = "__torch_neuronx_migrate_removed__"
_EMPTY = cst.Module(body=[])


@dataclass(frozen=True)
class Target:
    """What the migration writes: the neuron device (the migration) or the CPU (its reference twin)."""

    device: str = "neuron"
    backend: str = "neuron"

    @property
    def synchronize(self) -> str:
        return "torch.neuron.synchronize()" if self.device == "neuron" else "torch.cpu.synchronize()"


NEURON = Target()
CPU = Target("cpu", "gloo")

Expr = cst.BaseExpression
Stmt = cst.BaseStatement
ExprRule = Callable[["Ctx", cst.Call, str], Expr | None]
StmtRule = Callable[["Ctx", cst.Call, str], list[Stmt] | None]


@dataclass
class Rules:
    """The rules of one family: calls rewritten as expressions, calls rewritten as statements, names renamed."""

    calls: dict[str, ExprRule] = field(default_factory=dict)
    statements: dict[str, StmtRule] = field(default_factory=dict)
    renames: dict[str, Callable[[Ctx], Expr | None]] = field(default_factory=dict)  # None: declined, name stays
    # hooks on every call (family or not): (ctx, original, updated) -> replacement or None
    call_hooks: list[Callable[[Ctx, cst.Call, cst.Call], Expr | None]] = field(default_factory=list)
    # hooks run on each statement line after the calls in it were rewritten: -> statements to add after it
    after_statement: list[Callable[[Ctx, cst.SimpleStatementLine, cst.SimpleStatementLine], list[Stmt]]] = field(
        default_factory=list)
    # calls whose qualified name matches a predicate (a family's classes' `from_pretrained`, ...)
    call_matchers: list[tuple[Callable[[str], bool], ExprRule]] = field(default_factory=list)
    # attributes of non-family values (`args.trn_config`): (ctx, attribute) -> replacement or None
    attr_hooks: list[Callable[[Ctx, cst.Attribute], Expr | None]] = field(default_factory=list)
    # run once on the parsed module before the rewrite (to learn what is defined and used where)
    prepare: list[Callable[[Ctx, cst.Module], None]] = field(default_factory=list)

    def merge(self, other: Rules) -> None:
        self.calls.update(other.calls)
        self.statements.update(other.statements)
        self.renames.update(other.renames)
        self.call_hooks += other.call_hooks
        self.after_statement += other.after_statement
        self.call_matchers += other.call_matchers
        self.attr_hooks += other.attr_hooks
        self.prepare += other.prepare

    def call_rule(self, qualname: str) -> ExprRule | None:
        rule = self.calls.get(qualname)
        if rule is None:
            rule = next((r for match, r in self.call_matchers if match(qualname)), None)
        return rule


class Ctx:
    """What a rule can use: the target, code building, imports, helpers, flags and per-file state."""

    def __init__(self, target: Target, aliases: Aliases, cell: int | None = None) -> None:
        self.target = target
        self.aliases = aliases
        self.cell = cell
        self.imports: set[tuple[str, str | None]] = set()
        self.helpers: set[str] = set()
        self.rewrites: list[Rewrite] = []
        self.flags: list[Flag] = []
        self.state: dict[str, Any] = {}
        self._pending: list[tuple[flagmod.FlagRule, str]] = []  # flags raised inside the current statement
        self._warnings: list[str] = []
        self.line = 0  # the line of the node being rewritten
        self.classes: list[str] = []  # the classes the node being rewritten is in
        self.assign_target: str | None = None  # `x` of the `x = ...` being rewritten

    # code
    @staticmethod
    def code(node: cst.CSTNode) -> str:
        return _EMPTY.code_for_node(node)

    @staticmethod
    def expr(code: str) -> Expr:
        return _parse_expr(code)

    @staticmethod
    def stmt(code: str) -> Stmt:
        return _parse_stmt(textwrap.dedent(code))

    def qualname(self, node: cst.BaseExpression) -> str | None:
        return self.aliases.qualname(node)

    # what the rewritten code needs
    def need(self, module: str, obj: str | None = None) -> None:
        self.imports.add((module, obj))

    def helper(self, name: str) -> str:
        for h in helpermod.closure({name}):
            self.helpers.add(h)
            for m in helpermod.HELPERS[h].imports:
                self.need(m)
        return name

    # reporting
    def flag(self, rule: flagmod.FlagRule, code: str = "") -> None:
        self._pending.append((rule, code))

    def warn(self, message: str) -> None:
        self._warnings.append(message)

    def device_str(self, quote: str = '"') -> str:
        return f"{quote}{self.target.device}{quote}"


@functools.lru_cache(maxsize=4096)
def _parse_expr(code: str) -> Expr:  # libcst nodes are immutable: one parse serves every use
    return cst.parse_expression(code)


@functools.lru_cache(maxsize=4096)
def _parse_stmt(code: str) -> Stmt:
    return cst.parse_statement(code)


def split_args(call: cst.Call) -> tuple[list[cst.Arg], dict[str, cst.Arg]] | None:
    """Positional and keyword arguments; None when there is a *args or **kwargs (no static mapping)."""
    pos: list[cst.Arg] = []
    kw: dict[str, cst.Arg] = {}
    for a in call.args:
        if a.star:
            return None
        if a.keyword is not None:
            kw[a.keyword.value] = a
        else:
            pos.append(a)
    return pos, kw


def arg(call: cst.Call, index: int, name: str) -> cst.BaseExpression | None:
    """The argument at `index` or keyword `name`."""
    split = split_args(call)
    if split is None:
        return None
    pos, kw = split
    if name in kw:
        return kw[name].value
    return pos[index].value if index < len(pos) else None


def bind(call: cst.Call, params: Sequence[str]) -> dict[str, cst.BaseExpression] | None:
    """The call's arguments by parameter name, positional ones in the published signature's order `params`;
    None when they cannot be bound statically (*args / **kwargs, more positional arguments than parameters, an
    unknown keyword, a parameter given twice)."""
    split = split_args(call)
    if split is None:
        return None
    pos, kw = split
    if len(pos) > len(params) or set(kw) - set(params):
        return None
    bound = {params[i]: a.value for i, a in enumerate(pos)}
    if set(bound) & set(kw):
        return None
    bound.update({k: a.value for k, a in kw.items()})
    return bound


def is_literal(node: cst.BaseExpression | None, value: object) -> bool:
    """True when `node` is the literal `value` (None, True, 1, 2.0, "x"); `torch.float32`-like names by text."""
    if node is None:
        return False
    code = _EMPTY.code_for_node(node).strip()
    if isinstance(value, str) and value.startswith("torch."):
        return code == value
    try:
        literal = ast.literal_eval(code)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False
    if isinstance(literal, bool) or isinstance(value, bool):
        return literal is value
    if isinstance(literal, (int, float)) and isinstance(value, (int, float)):
        return literal == value
    return type(literal) is type(value) and literal == value


def strip_arg(a: cst.Arg, last: bool) -> cst.Arg:
    return a.with_changes(comma=cst.MaybeSentinel.DEFAULT) if last else a


def string_matches(node: cst.CSTNode, pattern: str) -> bool:
    """Whether `node` is a string literal whose whole value matches the regular expression `pattern`."""
    if not isinstance(node, cst.SimpleString):
        return False
    try:
        value = node.evaluated_value
    except Exception:
        return False
    return isinstance(value, str) and re.fullmatch(pattern, value) is not None


def is_xla_string(node: cst.CSTNode) -> bool:
    """A literal naming an XLA device: "xla", "xla:0"."""
    return string_matches(node, r"xla(:\d+)?")


# a "://" in a string piece, with the scheme before it if one is written there (`%s://`, `{}://`: none)
_SCHEME_SEP = re.compile(r"([%{]?)([A-Za-z][A-Za-z0-9+.\-]*)?://")


def names_xla_init_method(tree: ast.AST) -> bool:
    """The code names XLA's rendezvous, or builds an init method whose scheme it does not write: a string or bytes
    constant (also an f-string's literal part, or implicitly concatenated ones, which Python's parse joins) holding
    "xla://" or "pjrt://" in any case, or a "://" with no scheme before it (`f"{SCHEME}://"`, `"xla" + "://"`,
    `"{}://".format("xla")`, `"%s://"`), or pieces of one: a constant holding "xla:" / "pjrt:" (`S = "xla:";
    S + "//"`), or an "xla" / "pjrt" piece and one starting "//" in one list or `+` (`"".join(["xla", ":", "//"])`).
    Conservative: "xla:0" counts too. "env://", "tcp://host:1" name another scheme (rv32h D4, rv32i D5, rv32j D3)."""
    texts = [_constant_text(node) for node in ast.walk(tree) if isinstance(node, ast.Constant)]
    texts = [t.lower() for t in texts if t is not None]
    for text in texts:
        for m in _SCHEME_SEP.finditer(text):
            if m.group(1) or not m.group(2) or m.group(2) in ("xla", "pjrt"):
                return True
        if "xla:" in text or "pjrt:" in text:
            return True
    return any(_joins_a_scheme(node) for node in ast.walk(tree) if isinstance(node, (ast.List, ast.Tuple, ast.BinOp)))


def _joins_a_scheme(node: ast.List | ast.Tuple | ast.BinOp) -> bool:
    """A list, tuple or `+` chain of constants with an "xla" / "pjrt" piece and a piece starting "//"."""
    leaves: list[ast.expr] = []
    todo: list[ast.expr] = list(node.elts) if isinstance(node, (ast.List, ast.Tuple)) else [node]
    while todo:
        item = todo.pop()
        if isinstance(item, ast.BinOp) and isinstance(item.op, ast.Add):
            todo += [item.left, item.right]
        else:
            leaves.append(item)
    texts = [(_constant_text(leaf) or "").lower() for leaf in leaves if isinstance(leaf, ast.Constant)]
    return any(t in ("xla", "pjrt") for t in texts) and any(t.startswith("//") for t in texts)


def _constant_text(node: ast.Constant) -> str | None:
    """A str constant, or a bytes one read as Latin-1 (`b"xla://".decode()`); None for other constants."""
    if isinstance(node.value, str):
        return node.value
    if isinstance(node.value, bytes):
        return node.value.decode("latin-1")
    return None


# Expressions that bind at least as tightly as a call's callee, an attribute's value or an operand: they never
# need parentheses where they replace a sub-expression.
_ATOMS = (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.SimpleString, cst.ConcatenatedString,
          cst.FormattedString, cst.Integer, cst.Float, cst.Imaginary, cst.List, cst.Dict, cst.Set,
          cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp, cst.Ellipsis)


def parenthesised(node: Expr) -> Expr:
    """`node` in parentheses unless it is an atom or already has them (`lambda: x` -> `(lambda: x)`)."""
    if isinstance(node, _ATOMS) or getattr(node, "lpar", None):
        return node
    return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
