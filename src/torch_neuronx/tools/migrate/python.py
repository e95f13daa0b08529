"""The codemod driver for Python source: find the references, apply the family rules, flag what is left.

Three passes over one libcst tree:

1. ``names.RefIndex``: every reference to a migrated family (longest name chain), its line and statement;
2. ``Migrator``: rules rewrite calls and names (expression level), or whole statements (a removed
   ``xm.mark_step()``, an ``xm.optimizer_step`` that becomes two statements); every reference no rule consumed
   is flagged, with a TODO comment above its statement;
3. ``Cleanup``: imports of the families go when nothing unflagged needs them, removed statements leave their
   comments behind, empty blocks get ``pass``; then needed imports and the inlined helpers are added.

Rules live in ``rules_xla``, ``rules_optimum`` and ``rules_nxd``, which depend on ``registry`` only (the
``Rules`` and ``Ctx`` types and the shared expression helpers); only this engine imports them (``all_rules``).
"""

from __future__ import annotations

import ast
import builtins
import re
import sys
import textwrap
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import libcst as cst
import libcst.matchers as cst_matchers
from libcst.metadata import MetadataWrapper, PositionProvider

from torch_neuronx.tools.migrate import flags as flagmod
from torch_neuronx.tools.migrate import helpers as helpermod
from torch_neuronx.tools.migrate.names import (
    Aliases,
    Ref,
    RefTracking,
    catches_import_error,
    dotted,
    in_family,
    module_name,
)
from torch_neuronx.tools.migrate.registry import (  # noqa: F401  (re-exported: rules and tests use them)
    _EMPTY,
    CPU,
    NEURON,
    REMOVED,
    TODO,
    Ctx,
    Expr,
    ExprRule,
    Rules,
    Stmt,
    StmtRule,
    Target,
    _parse_expr,
    _parse_stmt,
    arg,
    bind,
    is_literal,
    is_xla_string,
    parenthesised,
    split_args,
    string_matches,
    strip_arg,
)
from torch_neuronx.tools.migrate.report import Flag, Rewrite


def all_rules() -> Rules:
    from torch_neuronx.tools.migrate import rules_nxd, rules_optimum, rules_xla

    rules = Rules()
    for fam in (rules_xla, rules_optimum, rules_nxd):
        rules.merge(fam.RULES)
    return rules


def _names_xla(node: cst.CSTNode) -> bool:
    """A string literal naming XLA's device type or module: "xla", "xla:0", "torch_xla", "torch_xla.core..."."""
    return string_matches(node, r"xla(:\d+)?|torch_xla(\..*)?")


def _tests_for_xla_prefix(call: cst.Call) -> bool:
    """`s.startswith("xla")` / `s.startswith(("xla", "cuda"))`: a test of a device string for XLA."""
    if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "startswith" and call.args):
        return False
    first = call.args[0].value
    values = [e.value for e in first.elements] if isinstance(first, (cst.Tuple, cst.List)) else [first]
    for v in values:
        if isinstance(v, cst.SimpleString):
            try:
                text = v.evaluated_value
            except Exception:
                continue
            if isinstance(text, str) and re.fullmatch(r"xla(:\d*)?|torch_xla.*", text) is not None:
                return True
    return False


# `is_torch_xla_available()` (transformers.utils, accelerate.utils), `is_torch_tpu_available()` (older
# transformers), `is_tpu_available()` (older accelerate): true only where torch_xla imports (rv32c item 7)
_XLA_PROBES = {"is_torch_xla_available", "is_torch_tpu_available", "is_tpu_available"}
# given "torch_xla" first: a probe however its result is used (importlib, pkgutil, importlib.metadata, pkg_resources)
_SPEC_PROBES = {"find_spec", "find_loader", "import_module", "__import__", "version", "distribution",
                "get_distribution"}


def _names_torch_xla(node: cst.CSTNode) -> bool:
    return string_matches(node, r"torch_xla(\..*)?")


def _probes_for_xla(call: cst.Call, resolved: str | None = None, tested: bool = False,
                    local: bool = False) -> bool:
    """`importlib.util.find_spec("torch_xla")`, `is_torch_xla_available()` (also under an import alias:
    `from transformers.utils import is_torch_xla_available as xla_ok`, `resolved`), and a call given the string
    "torch_xla..." as a positional argument whose result is tested (`tested`: `spec = importlib.util.find_spec;
    if spec("torch_xla"): ...`, `sys.modules.get("torch_xla") is not None`): a test for an installed or imported
    torch_xla (rv32d item 4). Other calls given the string are not (`logging.getLogger("torch_xla")`,
    `print("torch_xla")`, `filterwarnings(module="torch_xla")`, rv32e item 6); `local`: the callee is a name the
    function binds itself (a parameter called like a probe)."""
    name = None if local else dotted(call.func)
    lasts = {n.rsplit(".", 1)[-1] for n in (name, resolved) if n}
    if lasts & _XLA_PROBES:
        return True
    if lasts & _SPEC_PROBES and bool(call.args) and _names_xla(call.args[0].value):
        return True
    return tested and any(a.keyword is None and not a.star and _names_torch_xla(a.value) for a in call.args)


def _xla_device_fstring(node: cst.FormattedString) -> bool:
    """`f"xla:{idx}"`: an XLA device built at run time (rv32c item 12)."""
    first = node.parts[0] if node.parts else None
    return (isinstance(first, cst.FormattedStringText) and re.fullmatch(r"xla(:\d*)?", first.value) is not None
            and (len(node.parts) > 1))


def _todo_lines(rule: flagmod.FlagRule) -> list[str]:
    text = f"{TODO} {rule.reason} Native: {rule.suggestion}"
    lines = textwrap.wrap(text, 110, subsequent_indent="#   ", break_on_hyphens=False)
    return lines


def _with_todos(node: Stmt, rules: Sequence[flagmod.FlagRule]) -> Stmt:
    if not rules or not hasattr(node, "leading_lines"):
        return node
    existing = {ln.comment.value for ln in node.leading_lines if ln.comment is not None}  # type: ignore[attr-defined]
    new: list[cst.EmptyLine] = []
    for rule in rules:
        lines = _todo_lines(rule)
        if lines[0] in existing:  # idempotent: a second migration adds no second TODO
            continue
        existing.add(lines[0])
        new += [cst.EmptyLine(indent=True, comment=cst.Comment(c)) for c in lines]
    if not new:
        return node
    return node.with_changes(leading_lines=[*node.leading_lines, *new])  # type: ignore[attr-defined]


def _removed_marker(original: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
    return cst.SimpleStatementLine(body=[cst.Expr(cst.Name(REMOVED))], leading_lines=original.leading_lines)


def _is_marker(node: cst.CSTNode) -> bool:
    return (isinstance(node, cst.SimpleStatementLine) and len(node.body) == 1
            and isinstance(node.body[0], cst.Expr) and isinstance(node.body[0].value, cst.Name)
            and node.body[0].value.value == REMOVED)


class Migrator(RefTracking, cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)
    scoped_names = frozenset(_XLA_PROBES | _SPEC_PROBES)  # a parameter named like a probe is not one

    def __init__(self, ctx: Ctx, rules: Rules) -> None:
        super().__init__()
        self._init_tracking(ctx.aliases)
        self.ctx = ctx
        self.rules = rules
        self.consumed: set[int] = set()
        self._fstring_quotes: list[str] = []  # the quotes of the f-strings around the node being rewritten
        self._stmt_calls: set[int] = set()
        self._stmt_flags: list[list[tuple[flagmod.FlagRule, str, int]]] = []
        self.leftovers: list[Ref] = []
        self._bare_calls: set[int] = set()  # calls that are a whole expression statement
        self._targets: set[int] = set()  # what assignments store to (`self.trn_config = ...`): never rewritten
        self._call_funcs: dict[int, cst.Call] = {}  # the `func` of every call -> the call (a class called)
        self._parents: list[cst.CSTNode] = []  # the original nodes from the module down to the one being visited
        # rewritten `xm.add_step_closure(...)` lines and removed `xm.mark_step()` lines, by id; the nodes are held
        # so that no other node can get their id
        self._closure_lines: dict[int, tuple[cst.CSTNode, int]] = {}
        self._step_markers: dict[int, cst.CSTNode] = {}

    def visit_FormattedString(self, node: cst.FormattedString) -> bool:
        self._fstring_quotes.append(node.end)
        if _xla_device_fstring(node):
            self.ctx.flag(flagmod.XLA_DEVICE_FSTRING, self.ctx.code(node).strip())
            self._collect_flags(self._line(node))
        return True

    def leave_FormattedString(self, original_node: cst.FormattedString,
                              updated_node: cst.FormattedString) -> cst.FormattedString:
        self._fstring_quotes.pop()
        return updated_node

    def _fit(self, new: Any) -> Any:
        """Inside an f-string, strings of the replacement must not use its quote (Python < 3.12)."""
        if not self._fstring_quotes or not isinstance(new, cst.CSTNode):
            return new
        return new.visit(_Requote(set("".join(self._fstring_quotes))))

    # helpers
    def _line(self, node: cst.CSTNode) -> int:
        try:
            return self.get_metadata(PositionProvider, node).start.line
        except KeyError:
            return self.ctx.line

    def _record(self, rule: str, original: cst.CSTNode, new: cst.CSTNode | Sequence[cst.CSTNode] | None) -> None:
        after = "" if new is None else (
            "\n".join(self.ctx.code(n).strip() for n in new) if isinstance(new, Sequence) else self.ctx.code(new))
        warning = "; ".join(self.ctx._warnings)
        self.ctx._warnings.clear()
        self.ctx.rewrites.append(Rewrite(line=self._line(original), rule=rule, before=self.ctx.code(original).strip(),
                                         after=after.strip(), warning=warning, cell=self.ctx.cell))

    def _collect_flags(self, line: int) -> None:
        for rule, code in self.ctx._pending:
            if self._stmt_flags:
                self._stmt_flags[-1].append((rule, code, line))
        self.ctx._pending.clear()

    # statements: open a flag list; on leave, flag leftovers and add TODOs
    def on_visit(self, node: cst.CSTNode) -> bool:
        self._parents.append(node)
        if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            self._stmt_flags.append([])
            self.ctx.line = self._line(node)
        if isinstance(node, (cst.SimpleStatementLine, cst.SimpleStatementSuite)) and len(node.body) == 1:
            small = node.body[0]
            if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                qn = self.aliases.qualname(small.value.func)
                if in_family(qn) and qn in self.rules.statements:
                    self._stmt_calls.add(id(small.value))
        if self.track_visit(node) is False:
            return False
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode, updated_node: Any) -> Any:
        result = super().on_leave(original_node, updated_node)
        if (isinstance(original_node, cst.Call) and isinstance(result, cst.Call)
                and dotted(result.func) != "neuron_init_group"  # init_method="xla://" became the helper's call
                and _is_init_call(original_node, self.aliases.qualname(original_node.func))):  # for _GuardInits
            self.ctx.state.setdefault("inits", {})[id(result)] = (self._line(original_node), result)
        if isinstance(original_node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            result = self._finish_statement(original_node, result)
        self.track_leave(original_node)
        self._parents.pop()
        return result

    def _in_place(self, original: cst.CSTNode, new: Any) -> Any:
        """`new` in parentheses where it replaces an operand, a callee or an attribute's value and binds less
        tightly (`xm.is_master_ordinal() == False` -> `(... == 0) == False`, not a chained comparison)."""
        parent = self._parents[-2] if len(self._parents) > 1 and self._parents[-1] is original else None
        if isinstance(parent, _TIGHT_PARENTS) and isinstance(new, cst.BaseExpression):
            return parenthesised(new)
        return new

    def _finish_statement(self, original: cst.CSTNode, result: Any) -> Any:
        flags = self._stmt_flags.pop()
        explained = [code for _, code, _ in flags]  # a rule that declined a call flagged it with its reason
        for ref in self.refs_by_stmt.get(id(original), []):
            if id(ref.node) not in self.consumed:
                self.leftovers.append(ref)
                func = self.ctx.code(ref.node).strip()
                if id(ref.node) in self.ambiguous:
                    flags.append((flagmod.CLASS_SCOPE, ref.qualname, ref.line))
                elif not any(code.startswith(f"{func}(") for code in explained):
                    flags.append((flagmod.for_qualname(ref.qualname), ref.qualname, ref.line))
        if not flags:
            return result
        for rule, code, line in flags:
            self.ctx.flags.append(Flag(line=line, rule=rule.rule, reason=rule.reason, suggestion=rule.suggestion,
                                       code=code, cell=self.ctx.cell))
        rules = [r for r, _, _ in flags]
        if isinstance(result, cst.FlattenSentinel):
            nodes = list(result.nodes)
            return cst.FlattenSentinel([_with_todos(nodes[0], rules), *nodes[1:]])
        if isinstance(result, cst.RemovalSentinel):
            return result
        return _with_todos(result, rules)

    # statement-level rules
    def _expand(self, small: cst.BaseSmallStatement, statement: cst.CSTNode) -> list[Stmt] | Expr | None:
        """The statement rule's statements; or, when the call's arguments keep a flagged reference, the expression
        rule's expression (a statement split into a block would move the reference away from its TODO)."""
        if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)):
            return None
        call = small.value
        original_call = self._original_stmt_call
        if original_call is None:
            return None
        ref = self.refs[id(original_call.func)]
        inner_left = any(id(r.node) not in self.consumed and r.node is not original_call.func
                         for r in self.refs_by_stmt.get(id(statement), [])) or bool(self._stmt_flags[-1])
        if inner_left:
            rule = self.rules.call_rule(ref.qualname)
            expr = rule(self.ctx, call, ref.qualname) if rule is not None else None
            self._collect_flags(ref.line)
            if expr is not None:
                self.consumed.add(id(original_call.func))
            return expr
        out = self.rules.statements[ref.qualname](self.ctx, call, ref.qualname)
        self._collect_flags(ref.line)
        if out is None:
            return None
        self.consumed.add(id(original_call.func))
        return out

    _original_stmt_call: cst.Call | None = None

    def visit_Call(self, node: cst.Call) -> bool:
        self._call_funcs[id(node.func)] = node
        return True

    def visit_Expr(self, node: cst.Expr) -> bool:
        if isinstance(node.value, cst.Call):
            self._bare_calls.add(id(node.value))
        return True

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine) -> Any:
        removed = [s for s in updated_node.body if isinstance(s, cst.Expr) and isinstance(s.value, cst.Name)
                   and s.value.value == REMOVED]
        if removed:  # `xm.mark_step(); print(1)`: the removed call goes, the rest of the line stays
            body = [s for s in updated_node.body if s not in removed]
            if not body:
                return _removed_marker(original_node)
            body[-1] = body[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
            updated_node = updated_node.with_changes(body=body)
        extra: list[Stmt] = []
        for hook in self.rules.after_statement:
            extra += hook(self.ctx, original_node, updated_node)
        self._collect_flags(self._line(original_node))
        small = original_node.body[0]
        if (len(original_node.body) == 1 and isinstance(small, cst.Expr) and id(small.value) in self._stmt_calls
                and id(small.value.func) in self.refs):  # not a ref: a local `xm` of an enclosing function
            self._original_stmt_call = small.value  # type: ignore[assignment]
            out = self._expand(updated_node.body[0], original_node)
            self._original_stmt_call = None
            if isinstance(out, cst.BaseExpression):
                self._record(self.refs[id(small.value.func)].qualname.rsplit(".", 1)[-1],  # type: ignore
                             small.value, out)
                new_line = updated_node.with_changes(body=[updated_node.body[0].with_changes(value=out)])
                return cst.FlattenSentinel([new_line, *extra]) if extra else new_line
            if out is not None:
                self._record(self.refs[id(small.value.func)].qualname.rsplit(".", 1)[-1],  # type: ignore
                             original_node, out)
                if not out:
                    marker = _removed_marker(original_node)
                    if self.refs[id(small.value.func)].qualname in _STEP_MARKERS:  # type: ignore[attr-defined]
                        self._step_markers[id(marker)] = marker
                    return marker
                first = out[0].with_changes(leading_lines=original_node.leading_lines)  # type: ignore[attr-defined]
                if isinstance(first, cst.SimpleStatementLine) and len(out) == 1 and not extra:
                    first = first.with_changes(trailing_whitespace=updated_node.trailing_whitespace)
                return cst.FlattenSentinel([first, *out[1:], *extra])
        if extra:
            self._record("plan", original_node, extra)
            return cst.FlattenSentinel([updated_node, *extra])
        if (len(original_node.body) == 1 and isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)
                and id(small.value.func) in self.consumed
                and self.refs[id(small.value.func)].qualname == _STEP_CLOSURE):
            self._closure_lines[id(updated_node)] = (updated_node, self._line(original_node))
        return updated_node

    def _defer_closures(self, body: Sequence[Stmt]) -> list[Stmt] | None:
        """torch_xla binds a step closure's callee and arguments where it is added and calls it after the graph
        of the next mark_step (xla_model.py: add_step_closure appends `lambda a=args: closure(*a)`, mark_step
        calls `_run_step_closures()`). Here it is called where it was added. That is the same only when the next
        statements of its block, up to a removed mark_step, are other closures; any other closure is flagged
        (never moved: a move crosses `continue`, nested blocks and late-bound arguments, rv32b items 2-4)."""
        kept: list[Stmt] = []
        flagged = False
        for i, stmt in enumerate(body):
            closure, line = self._closure_lines.get(id(stmt), (None, 0))
            if closure is stmt and not self._closures_then_marker(body[i + 1:]):
                self._flag_closure(line, self.ctx.code(stmt).strip())
                stmt = _with_todos(stmt, [flagmod.STEP_CLOSURE])
                flagged = True
            kept.append(stmt)
        return kept if flagged else None

    def _closures_then_marker(self, rest: Sequence[Stmt]) -> bool:
        for stmt in rest:
            if self._step_markers.get(id(stmt)) is stmt:
                return True
            if self._closure_lines.get(id(stmt), (None, 0))[0] is not stmt:
                return False
        return False

    def _flag_closure(self, line: int, code: str) -> None:
        rule = flagmod.STEP_CLOSURE
        self.ctx.flags.append(Flag(line=line, rule=rule.rule, reason=rule.reason, suggestion=rule.suggestion,
                                   code=code, cell=self.ctx.cell))

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> Any:
        body = self._defer_closures(updated_node.body)
        return updated_node if body is None else updated_node.with_changes(body=body)

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = self._defer_closures(updated_node.body)
        return updated_node if body is None else updated_node.with_changes(body=body)

    def leave_SimpleStatementSuite(self, original_node: cst.SimpleStatementSuite,
                                   updated_node: cst.SimpleStatementSuite) -> Any:
        kept = [s for s in updated_node.body if not (isinstance(s, cst.Expr) and isinstance(s.value, cst.Name)
                                                     and s.value.value == REMOVED)]
        if len(kept) < len(updated_node.body):
            kept = kept or [cst.Pass()]
            kept[-1] = kept[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
            updated_node = updated_node.with_changes(body=kept)
        small = original_node.body[0]
        if (len(original_node.body) == 1 and isinstance(small, cst.Expr) and id(small.value) in self._stmt_calls
                and id(small.value.func) in self.refs):  # not a ref: a local `xm` of an enclosing function
            self._original_stmt_call = small.value  # type: ignore[assignment]
            out = self._expand(updated_node.body[0], self._stmts[-1] if self._stmts else original_node)
            self._original_stmt_call = None
            if isinstance(out, cst.BaseExpression):
                self._record(self.refs[id(small.value.func)].qualname.rsplit(".", 1)[-1],  # type: ignore
                             small.value, out)
                return updated_node.with_changes(body=[updated_node.body[0].with_changes(value=out)])
            if out is not None:
                self._record(self.refs[id(small.value.func)].qualname.rsplit(".", 1)[-1],  # type: ignore
                             original_node, out)
                if not out:
                    return updated_node.with_changes(body=[cst.Pass()])
                if len(out) == 1 and isinstance(out[0], cst.SimpleStatementLine):
                    return updated_node.with_changes(body=out[0].body)
                return cst.IndentedBlock(header=updated_node.trailing_whitespace, body=out)
        return updated_node

    # expression-level rules
    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> Expr:
        resolved = self.aliases.qualname(original_node.func)
        root = dotted(original_node.func)
        local = root is not None and (self._is_shadowed(root.split(".")[0]) == "local" or root in self.ctx.state.get(
            "own_probes", ()))  # the file's own `def is_torch_xla_available()` (rv32f item 10)
        if _tests_for_xla_prefix(original_node) or _probes_for_xla(
                original_node, resolved, self._is_tested(original_node), local):  # always False now
            self.ctx.flag(flagmod.XLA_TEST, self.ctx.code(original_node).strip())
            self._collect_flags(self._line(original_node))
        ref = self.refs.get(id(original_node.func))
        if ref is None:  # not a family call: hooks (the 'xla' device string, ParallelLoader(...).per_device_loader)
            self.ctx.state["bare_call"] = id(original_node) in self._bare_calls
            for hook in self.rules.call_hooks:
                new = hook(self.ctx, original_node, updated_node)
                self._collect_flags(self._line(original_node))
                if new is not None:
                    self.consumed.update(self._refs_within(original_node.func))
                    new = self._fit(new)
                    self._record(getattr(hook, "rule_name", hook.__name__.strip("_")), original_node, new)
                    return new
            return updated_node
        if id(original_node) in self._stmt_calls:
            return updated_node
        rule = self.rules.call_rule(ref.qualname)
        if rule is None:
            return updated_node
        self.ctx.line = ref.line
        self.ctx.state["bare_call"] = id(original_node) in self._bare_calls
        new = rule(self.ctx, updated_node, ref.qualname)
        self._collect_flags(ref.line)
        if new is None:
            return updated_node
        self.consumed.add(id(original_node.func))
        if ref.qualname == _STEP_CLOSURE and not self._alone_on_its_line(original_node):
            self.ctx.flag(flagmod.STEP_CLOSURE, self.ctx.code(original_node).strip())  # see _defer_closures
            self._collect_flags(ref.line)
        new = self._fit(new)
        self._record(ref.qualname.rsplit(".", 1)[-1], original_node, new)
        return self._in_place(original_node, new)

    def _is_tested(self, node: cst.CSTNode) -> bool:
        """`node`'s value is tested: the test of an `if`, `while`, `assert` or conditional expression, an operand
        of `not`, `and` / `or` or a comparison."""
        if len(self._parents) < 2 or self._parents[-1] is not node:
            return False
        parent = self._parents[-2]
        if (isinstance(parent, cst.Arg) and len(self._parents) > 2 and isinstance(self._parents[-3], cst.Call)
                and dotted(self._parents[-3].func) == "bool"):  # `bool(mods.get("torch_xla"))` (rv32f item 10)
            return True
        if isinstance(parent, (cst.If, cst.While, cst.Assert, cst.IfExp)):
            return parent.test is node
        return isinstance(parent, (cst.BooleanOperation, cst.Comparison, cst.ComparisonTarget)) or (
            isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not))

    def _builds_a_string(self, node: cst.CSTNode) -> bool:
        """`node` flows into a string built at run time: an operand of `+` or `%`, an element of what `%` formats
        or `str.join` joins, an argument of `str.format` (`"xla" + ":" + str(i)`, rv32e item 5)."""
        chain = self._parents[:-1] if self._parents and self._parents[-1] is node else self._parents
        in_sequence = False
        for parent in reversed(chain[-4:]):
            if isinstance(parent, cst.BinaryOperation):
                return isinstance(parent.operator, (cst.Add, cst.Modulo))
            if isinstance(parent, cst.FormattedStringExpression):  # f"{'xla'}:{i}" (rv32f item 10)
                return True
            if isinstance(parent, cst.Call):
                if not (isinstance(parent.func, cst.Attribute) and parent.func.attr.value in ("join", "format")):
                    return False
                # `":".join(["xla", ...])`, not a path: `os.path.join("/tmp", "xla")` (rv32f item 10)
                return (parent.func.attr.value == "format" or in_sequence
                        or isinstance(parent.func.value, (cst.SimpleString, cst.ConcatenatedString)))
            if not isinstance(parent, (cst.Element, cst.Arg, cst.List, cst.Tuple)):
                return False
            in_sequence = in_sequence or isinstance(parent, cst.Element)
        return False

    def _alone_on_its_line(self, call: cst.Call) -> bool:
        """`call` is the whole of a statement line of an indented block or the module (_defer_closures judges
        it there), or only other closures and then a mark_step follow it on its line (`for i in r:
        xm.add_step_closure(f); xm.mark_step()`, rv32c item 16)."""
        if len(self._parents) < 4 or self._parents[-1] is not call:
            return False
        expr, line, block = self._parents[-2], self._parents[-3], self._parents[-4]
        if not isinstance(expr, cst.Expr) or not isinstance(line, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            return False
        if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            return isinstance(block, (cst.IndentedBlock, cst.Module))
        for small in line.body[list(line.body).index(expr) + 1:]:  # not visited yet: resolved from the imports
            qualname = self.aliases.qualname(small.value.func) if (isinstance(small, cst.Expr)
                                                                   and isinstance(small.value, cst.Call)) else None
            if qualname not in (_STEP_CLOSURE, *_STEP_MARKERS):
                return False
            if qualname in _STEP_MARKERS:
                return True
        return False

    def _refs_within(self, node: cst.CSTNode) -> list[int]:
        found: list[int] = []

        class _V(cst.CSTVisitor):
            def on_visit(_self, n: cst.CSTNode) -> bool:  # noqa: N805
                if id(n) in self.refs:
                    found.append(id(n))
                    return False
                return True

        node.visit(_V())
        return found

    def _rename(self, original: cst.CSTNode, updated: Expr) -> Expr:
        ref = self.refs.get(id(original))
        if ref is None:
            return updated
        make = self.rules.renames.get(ref.qualname)
        if make is None:
            return updated
        self.ctx.state["renaming_a_call"] = id(original) in self._call_funcs  # `Cls(...)`, not `Cls` as a value
        self.ctx.state["renamed_call"] = self._call_funcs.get(id(original))
        made = make(self.ctx)
        self._collect_flags(self._line(original))
        if made is None:  # the rule declined (its call is flagged): the name stays, with its import
            return updated
        new = self._fit(made)
        self.consumed.add(id(original))
        self._record(ref.qualname.rsplit(".", 1)[-1], original, new)
        return new.with_changes(lpar=updated.lpar, rpar=updated.rpar) if hasattr(updated, "lpar") else new

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> Expr:
        return self._rename(original_node, updated_node)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> bool:
        self._targets.add(id(node.target))
        return True

    def visit_AnnAssign(self, node: cst.AnnAssign) -> bool:
        self._targets.add(id(node.target))
        return True

    def visit_AugAssign(self, node: cst.AugAssign) -> bool:
        self._targets.add(id(node.target))
        return True

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> Expr:
        if original_node.attr.value == "is_xla":  # `x.is_xla`: always False now
            self.ctx.flag(flagmod.XLA_TEST, self.ctx.code(original_node).strip())
            self._collect_flags(self._line(original_node))
        if id(original_node) not in self.refs and id(original_node) not in self._targets:  # a read, not a store
            for hook in self.rules.attr_hooks:
                new = hook(self.ctx, updated_node)
                self._collect_flags(self._line(original_node))
                if new is not None:
                    new = self._fit(new)
                    self._record(original_node.attr.value, original_node, new)
                    return new
        return self._rename(original_node, updated_node)

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self.ctx.classes.append(node.name.value)
        return True

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        self.ctx.classes.pop()
        return updated_node

    def visit_Assign(self, node: cst.Assign) -> bool:
        if len(node.targets) == 1:
            self.ctx.assign_target = self.ctx.code(node.targets[0].target).strip()
        return True

    # strings that configure XLA from Python
    def leave_SimpleString(self, original_node: cst.SimpleString, updated_node: cst.SimpleString) -> Expr:
        value = original_node.value
        if "XLA_USE_BF16" in value or "XLA_DOWNCAST_BF16" in value:
            self.ctx.flag(flagmod.BF16, value)
        elif "NEURON_CC_FLAGS" in value:
            self.ctx.flag(flagmod.CC_FLAGS, value)
        elif "PJRT_DEVICE" in value or re.search(r"\bXLA_[A-Z_]+", value):
            self.ctx.flag(flagmod.XLA_ENV, value)
        elif string_matches(original_node, r"xla:([%{].*)?"):  # "xla:" + str(i), "xla:%d" % i, "xla:{}".format(i)
            self.ctx.flag(flagmod.XLA_DEVICE_FSTRING, value)  # a device built at run time (rv32d item 8)
        elif string_matches(original_node, r"xla") and self._builds_a_string(original_node):
            self.ctx.flag(flagmod.XLA_DEVICE_FSTRING, value)  # "xla" + ":" + str(i), ":".join(["xla", ...])
        self._collect_flags(self._line(original_node))
        return updated_node

    def leave_Subscript(self, original_node: cst.Subscript, updated_node: cst.Subscript) -> Expr:
        """`sys.modules["torch_xla"]`: a test for an imported torch_xla, now always failing (rv32d item 4)."""
        if any(isinstance(e.slice, cst.Index) and _names_torch_xla(e.slice.value) for e in original_node.slice):
            self.ctx.flag(flagmod.XLA_TEST, self.ctx.code(original_node).strip())
            self._collect_flags(self._line(original_node))
        return updated_node

    def leave_Comparison(self, original_node: cst.Comparison, updated_node: cst.Comparison) -> Expr:
        """`x.device.type == "xla"`, `"torch_xla" in sys.modules`: tests that are now always false, flagged."""
        operands = [original_node.left, *(c.comparator for c in original_node.comparisons)]
        elements = [e.value for o in operands if isinstance(o, (cst.Tuple, cst.List, cst.Set))
                    for e in o.elements]  # `x.device.type in ("xla", "cuda")`
        if any(_names_xla(o) for o in [*operands, *elements]):
            self.ctx.flag(flagmod.XLA_TEST, self.ctx.code(original_node).strip())
            self._collect_flags(self._line(original_node))
        return self._optional_import_test(original_node, updated_node)

    def _optional_import_test(self, original: cst.Comparison, updated: cst.Comparison) -> Expr:
        """`xm is not None` after `try: import torch_xla... as xm / except ImportError: xm = None` (rv32b 5, 6):
        the import is what the migrated code provides, so the test is `True` (`is None`: `False`), and the XLA
        branch it guards, now migrated, is the one taken."""
        ref = self.refs.get(id(original.left))
        if ref is None or len(original.comparisons) != 1 or not isinstance(original.left, cst.Name):
            return updated
        test = original.comparisons[0]
        if not (isinstance(test.comparator, cst.Name) and test.comparator.value == "None"
                and isinstance(test.operator, (cst.Is, cst.IsNot))):
            return updated
        self.consumed.add(id(original.left))
        new = cst.Name("True" if isinstance(test.operator, cst.IsNot) else "False")
        self._record("optional-import", original, new)
        return new.with_changes(lpar=updated.lpar, rpar=updated.rpar)

    def _in_import_error_handler(self) -> bool:
        for node in reversed(self._parents):
            if isinstance(node, cst.ExceptHandler):
                return catches_import_error(node)
            if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
                return False
        return False

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        self.ctx.assign_target = None
        target = original_node.targets[0].target
        if (len(original_node.targets) == 1 and id(target) in self.refs and isinstance(original_node.value, cst.Name)
                and original_node.value.value == "None" and self._in_import_error_handler()):
            self.consumed.add(id(target))  # the fallback of an optional import: dead code once it is migrated
        # device = 'xla'
        if (len(updated_node.targets) == 1 and isinstance(updated_node.targets[0].target, cst.Name)
                and "dev" in updated_node.targets[0].target.value.lower() and is_xla_string(updated_node.value)):
            quote = updated_node.value.quote  # type: ignore[attr-defined]
            new = updated_node.with_changes(value=cst.SimpleString(self.ctx.device_str(quote)))
            self.ctx.state["device_used"] = self.ctx.state["current_device"] = True
            self._record("xla-device-string", original_node, new)
            return new
        return updated_node


_STEP_CLOSURE = "torch_xla.core.xla_model.add_step_closure"
_STEP_MARKERS = ("torch_xla.core.xla_model.mark_step", "torch_xla.sync")

# where a generated expression that binds less tightly than a call needs parentheses
_TIGHT_PARENTS = (cst.Comparison, cst.ComparisonTarget, cst.BinaryOperation, cst.UnaryOperation, cst.BooleanOperation,
                  cst.Attribute, cst.Call, cst.Subscript, cst.Await, cst.IfExp)


class _Requote(cst.CSTTransformer):
    """Give plain string literals a quote the enclosing f-strings do not use."""

    def __init__(self, taken: set[str]) -> None:
        super().__init__()
        self.quote = next((q for q in ("'", '"') if q not in taken), None)

    def leave_SimpleString(self, original_node: cst.SimpleString, updated_node: cst.SimpleString) -> Any:
        if self.quote is None or len(updated_node.quote) != 1 or updated_node.quote == self.quote:
            return updated_node
        body = updated_node.raw_value
        if self.quote in body or "\\" in body:
            return updated_node
        return updated_node.with_changes(value=f"{updated_node.prefix}{self.quote}{body}{self.quote}")


class Cleanup(cst.CSTTransformer):
    """Drop family imports nothing unflagged needs; drop removal markers keeping their comments; no empty body."""

    def __init__(self, ctx: Ctx, still_used: set[str], rules: Rules, import_lines: dict[str, int],
                 line_queue: dict[str, list[int]] | None = None) -> None:
        super().__init__()
        self.import_lines = import_lines
        # the same import text twice (in two functions): each its own line, in order (rv32f item 11)
        self.line_queue = {text: list(lines) for text, lines in (line_queue or {}).items()}
        self.ctx = ctx
        self.still_used = still_used
        self.rules = rules
        self.removed_imports: list[tuple[str, int]] = []  # (its code, its line)

    def on_visit(self, node: cst.CSTNode) -> bool:
        # statements and blocks only: nothing below a simple statement's line needs visiting (the speed of it)
        if isinstance(node, (cst.BaseExpression, cst.BaseSmallStatement)):
            return False
        return super().on_visit(node)

    def _family_import(self, small: cst.BaseSmallStatement) -> cst.BaseSmallStatement | None | bool:
        """False: not a family import; None: drop it all; else the import reduced to what is still used."""
        if isinstance(small, cst.Import):
            keep, fam = [], False
            for a in small.names:
                full = module_name(a.name)
                if not in_family(full):
                    keep.append(a)
                    continue
                fam = True
                local = a.asname.name.value if a.asname and isinstance(a.asname.name, cst.Name) else full.split(".")[0]
                if local in self.still_used:
                    keep.append(a)
            if not fam:
                return False
            if not keep:
                return None
            return small.with_changes(names=[strip_arg(a, i == len(keep) - 1) for i, a in enumerate(keep)])  # type: ignore
        if isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative:
            mod = module_name(small.module)
            if not in_family(mod):
                return False
            if isinstance(small.names, cst.ImportStar):
                return small
            keep = []
            for a in small.names:
                local = a.asname.name.value if a.asname and isinstance(a.asname.name, cst.Name) else module_name(a.name)
                if local in self.still_used:
                    keep.append(a)
            if not keep:
                return None
            names = [strip_arg(a, i == len(keep) - 1) for i, a in enumerate(keep)]  # type: ignore[arg-type]
            return small.with_changes(names=names, rpar=small.rpar if len(keep) > 1 else None,
                                      lpar=small.lpar if len(keep) > 1 else None)
        return False

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine) -> Any:
        body: list[cst.BaseSmallStatement] = []
        changed = False
        kept_family = False
        for small in updated_node.body:
            res = self._family_import(small)
            if res is False:
                body.append(small)
                continue
            text = self.ctx.code(small).strip()
            queue = self.line_queue.get(text) or [self.import_lines.get(text, 0)]
            line = queue.pop(0) if len(queue) > 1 else queue[0]
            if res is None:
                changed = True
                self.removed_imports.append((text, line))
                continue
            if res is not small:
                changed = True
            # `import torch, torch_xla... as xm` with xm migrated away leaves `import torch`: no family name is kept
            kept_family = kept_family or not isinstance(res, cst.Import) or any(
                in_family(module_name(a.name)) for a in res.names)
            body.append(res)  # type: ignore[arg-type]
        if not changed and not kept_family:
            return updated_node
        if not body:
            return _removed_marker(updated_node)
        new = updated_node.with_changes(body=[s.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
                                              if i == len(body) - 1 else s for i, s in enumerate(body)])
        stars = [_star_rule(module_name(b.module)) for b in body  # type: ignore[arg-type]
                 if isinstance(b, cst.ImportFrom) and isinstance(b.names, cst.ImportStar) and b.module is not None
                 and not b.relative and in_family(module_name(b.module))]
        if stars:  # its reason, at its line (the flag itself is raised by migrate_module)
            new = _with_todos(new, stars)  # type: ignore[assignment]
        if kept_family:
            rule = flagmod.FlagRule("import-kept", "Import kept: the flagged code of this file still uses it.",
                                    "remove it once the flagged lines are migrated.")
            if not any(f.rule == "import-kept" and f.code == self.ctx.code(new).strip() for f in self.ctx.flags):
                self.ctx.flags.append(Flag(line=self.import_lines.get(self.ctx.code(original_node.body[0]).strip(), 0),
                                           rule=rule.rule, reason=rule.reason, suggestion=rule.suggestion,
                                           code=self.ctx.code(new).strip(), cell=self.ctx.cell))
            new = _with_todos(new, [rule])  # type: ignore[assignment]
        return new

    @staticmethod
    def _squash(body: Sequence[Stmt], footer: Sequence[cst.EmptyLine]) -> tuple[list[Stmt], list[cst.EmptyLine]]:
        out: list[Stmt] = []
        carry: list[cst.EmptyLine] = []
        for stmt in body:
            if _is_marker(stmt):
                carry += list(stmt.leading_lines)  # type: ignore[attr-defined]
                continue
            if carry:
                stmt = stmt.with_changes(leading_lines=[*carry, *stmt.leading_lines])  # type: ignore[attr-defined]
                carry = []
            out.append(stmt)
        return out, [*carry, *footer]

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> Any:
        if not any(_is_marker(s) for s in updated_node.body):
            return updated_node
        body, footer = self._squash(updated_node.body, updated_node.footer)
        comments = [ln for ln in footer if ln.comment is not None]
        if not body:  # a block needs a statement: `pass`, with the removed lines' comments above it
            body = [cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=comments)]
            footer = [ln for ln in footer if ln.comment is None]
        return updated_node.with_changes(body=body, footer=footer)

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if not any(_is_marker(s) for s in updated_node.body):
            return updated_node
        body, footer = self._squash(updated_node.body, updated_node.footer)
        return updated_node.with_changes(body=body, footer=footer)


def _star_rule(mod: str) -> flagmod.FlagRule:
    return flagmod.FlagRule("star-import", f"`from {mod} import *` hides which names are used.",
                            "import the names explicitly, then migrate again.")


def _defined_names(module: cst.Module) -> set[str]:
    names: set[str] = set()
    for stmt in module.body:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            names.add(stmt.name.value)
        elif isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Assign):
                    for t in small.targets:
                        if isinstance(t.target, cst.Name):
                            names.add(t.target.value)
    return names


def _is_import_line(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body)


def _is_docstring(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Expr) and isinstance(
        stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))


def _header_end(body: Sequence[Stmt]) -> int:
    """The index after the module's leading docstring and import lines: added imports and helpers go there, before
    any module code (which may call a helper) and before a late import further down."""
    i = 1 if body and _is_docstring(body[0]) else 0
    while i < len(body) and _is_import_line(body[i]):
        i += 1
    return i


def insert_helpers(module: cst.Module, names: Sequence[str], target: Target) -> cst.Module:
    """Add the helpers not yet defined, after the module's leading imports (before any module code)."""
    defined = _defined_names(module)
    todo = [n for n in names if n not in defined]
    if not todo:
        return module
    code = "\n\n".join(helpermod.source(n, target.device, target.backend) for n in todo)
    code = code.replace("\n", module.default_newline)  # a CRLF file: the docstrings' lines end as its own (rv32d 12)
    stmts = list(cst.parse_module(code).body)
    body = list(module.body)
    blank = cst.EmptyLine()
    at = _header_end(body)
    stmts[0] = stmts[0].with_changes(leading_lines=[blank, blank] if at else [])  # type: ignore[attr-defined]
    if at < len(body):
        nxt = body[at]
        lead = list(nxt.leading_lines)  # type: ignore[attr-defined]
        while lead and lead[0].comment is None:
            lead.pop(0)
        body[at] = nxt.with_changes(leading_lines=[blank, blank, *lead])  # type: ignore[attr-defined]
    body[at:at] = stmts
    return module.with_changes(body=body)


def _bound(module: cst.Module) -> set[tuple[str, str | None]]:
    """The (module, object) pairs the module's leading imports already provide (a late import binds too late)."""
    have: set[tuple[str, str | None]] = set()
    for stmt in module.body[:_header_end(module.body)]:
        if not _is_import_line(stmt):
            continue
        for small in stmt.body:  # type: ignore[attr-defined]
            if isinstance(small, cst.Import):
                for a in small.names:
                    if a.asname is None:
                        full = module_name(a.name)
                        parts = full.split(".")
                        have.update((".".join(parts[: i + 1]), None) for i in range(len(parts)))
            elif isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative:
                if not isinstance(small.names, cst.ImportStar):
                    for a in small.names:
                        if a.asname is None:
                            have.add((module_name(small.module), module_name(a.name)))
    return have


def add_imports(module: cst.Module, imports: set[tuple[str, str | None]],
                known: Aliases | None = None) -> cst.Module:
    """Add `import X` / `from X import Y` lines not already there, after the top-level imports (or at the top,
    after a docstring and `from __future__`). `known`: names bound elsewhere (earlier notebook cells)."""
    have = _bound(module)
    todo = []
    for mod, obj in sorted(imports, key=lambda x: (x[0], x[1] or "")):
        if (mod, obj) in have:
            continue
        if known is not None:
            root = mod.split(".")[0]
            if (obj is None and known.names.get(root) == root) or (obj and known.names.get(obj) == f"{mod}.{obj}"):
                continue
        todo.append(f"from {mod} import {obj}\n" if obj else f"import {mod}\n")
    if not todo:
        return module
    new = list(cst.parse_module("".join(todo)).body)
    body = list(module.body)
    at = _header_end(body)
    body[at:at] = new
    return module.with_changes(body=body)


@dataclass
class PyResult:
    code: str
    rewrites: list[Rewrite]
    flags: list[Flag]
    helpers: set[str]


def migrate_module(module: cst.Module, aliases: Aliases, target: Target = NEURON, rules: Rules | None = None,
                   cell: int | None = None, with_helpers: bool = True,
                   tree: ast.AST | None = None, source: str | None = None,
                   keep_names: frozenset[str] = frozenset(),
                   shared: dict[str, Any] | None = None) -> tuple[cst.Module, Ctx]:
    """Run the three passes on a parsed module. `with_helpers=False` leaves the helpers to the caller
    (a notebook inserts them once, in the first cell that needs one); `keep_names`: imported names that flagged
    code elsewhere (a later notebook cell) still uses, whose imports stay; `shared`: facts of the whole file the
    rules' `prepare` steps extend (a notebook's other cells: `xla_init_literal`)."""
    rules = rules or all_rules()
    ctx = Ctx(target, aliases, cell)
    ctx.state.update(shared or {})
    module = _todos_to_first_statement(module)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    ctx.state["called"] = _called_names_ast(tree) if tree is not None else _called_names(module)
    ctx.state["tree"] = tree
    ctx.state["os_name"] = "_neuron_os" if _rebinds_os(tree, module) else "os"
    ctx.state["own_probes"] = {s.name.value for s in module.body if isinstance(s, cst.FunctionDef)} & _XLA_PROBES
    for prep in rules.prepare:
        prep(ctx, module)
    migrator = Migrator(ctx, rules)
    new = wrapper.visit(migrator)
    still_used = {(dotted(r.node) or "").split(".")[0] for r in migrator.leftovers}
    ctx.state["still_used"] = set(still_used)
    cleanup = Cleanup(ctx, still_used | keep_names, rules, migrator.import_lines, migrator.import_line_queue)
    new = new.visit(cleanup)
    for text, line in cleanup.removed_imports:
        ctx.rewrites.append(Rewrite(line=line, rule="import", before=text, after="", cell=cell))
    for mod in aliases.star_imports:
        if in_family(mod):
            rule = _star_rule(mod)
            line = migrator.import_lines.get(f"from {mod} import *", 0)
            ctx.flags.append(Flag(line=line, rule=rule.rule, reason=rule.reason, suggestion=rule.suggestion,
                                  code=f"from {mod} import *", cell=cell))
    # the group first (rv32e items 3, 4): a collective's helper starts it, or the script starts its own XLA group
    # and uses the device (maybe before it)
    kind, unsure_line = _script_kind(module, tree) if with_helpers else ("library", 0)
    script = kind in ("script", "main")
    group_first = "neuron_init_group" in helpermod.closure(ctx.helpers) or bool(
        ctx.state.get("xla_init") and ctx.state.get("device_used"))
    early = script and group_first
    unsure = kind == "unsure" and group_first  # not started at import: flagged (rv32g item 4)
    if unsure:
        rule = flagmod.SCRIPT_UNSURE
        code = module.code.splitlines()[unsure_line - 1].strip() if unsure_line else ""
        ctx.flags.append(Flag(line=unsure_line, rule=rule.rule, reason=rule.reason, suggestion=rule.suggestion,
                              code=code, cell=cell))
    if early:
        new = new.visit(_GuardInits(ctx, ctx.state.get("inits", {})))
        ctx.helper("neuron_init_group")
    elif with_helpers and not script and ctx.state.get("xla_init"):  # a library: its importer starts the group
        # first (rv32f item 4)
        new = new.visit(_GuardInits(ctx, ctx.state.get("inits", {}), flagmod.LIBRARY_GROUP))
    # "xla" and xla_device() were one device: the bare "neuron" (or the current device synchronized) must be the
    # process's core too (rv32f item 1), in a library module as well (its functions may run before any group sets
    # the current device); a file that only names the indexed device needs nothing
    own_core = with_helpers and bool(ctx.state.get("current_device")) and target.device != "cpu"
    if own_core:
        ctx.helper("neuron_set_device")
    if with_helpers and ctx.helpers:
        new = insert_helpers(new, helpermod.closure(ctx.helpers), target)
    starts = [call for call, wanted in ((_EARLY_CALL, early), (_SET_DEVICE_CALL, own_core)) if wanted]
    if starts:  # a file whose only script sign is its `__main__` block starts the group only when run as one
        new = _start_group_first(new, starts, guarded=early and kind == "main")
    if early and tree is not None:
        flagged = _flag_settings_after_start(tree, ctx, cell)
        if flagged:
            new = new.visit(_SettingTodos(flagged, _environ_names(list(getattr(tree, "body", [])))))
    if unsure:
        new = _todo_after_helpers(new, flagmod.SCRIPT_UNSURE)
    new = add_imports(new, ctx.imports, aliases if cell is not None else None)
    _open_todos(module, ctx, source)
    ctx.rewrites.sort(key=lambda r: r.line)
    ctx.flags.sort(key=lambda f: f.line)
    return new, ctx


# the names of a script's entry points, exactly (`main()`, `_run()`): calling one by its bare name at module level
# runs it; a name that only starts like one (`app_config()`, `eval_transforms()`, `run_cleanup`) is no entry point
# (rv32i D1: libraries call such functions of their own at import)
_ENTRY = re.compile(r"_?(main|run|train|fit|launch|cli|app|evaluate|eval|finetune|pretrain)")
# calls that a library module makes at its import too (a warning of a missing optional package, configuration)
_QUIET_ROOTS = frozenset(("warnings", "logging", "logger", "log", "sys", "os", "print", "re", "collections",
                          "functools", "typing", "dataclasses", "enum", "namedtuple", "TypeVar", "partial"))
_BUILTINS = frozenset(dir(builtins))


def _script_kind(module: cst.Module, tree: ast.AST | None = None) -> tuple[str, int]:
    """("script" | "main" | "library" | "unsure", the line of the first call that left it unsure).

    A script: module-level code (also inside a module-level `if` / `try` / loop / `with`, not in its `except`
    handlers) that calls an entry point (`main()`, `result = main()`, `out = run()`, `raise SystemExit(main())`,
    `assert run() is None`, `cProfile.run("main()")`: rv32f item 3, rv32g item 3, rv32j), an XLA /
    torch.distributed API (`s = xm.all_reduce(...)`), or in a loop the file's own step (`for e in range(3):
    train_step()`). A module-level loop or `with` alone is none (`with open(cfg) as f: CFG = json.load(f)`, a
    loop filling a registry: rv32j D2). "main": an `if __name__ == "__main__":` block that does something is the
    only sign (calls of unknown effect above it too): the group starts behind the file's own `__main__` guard
    before its module code, and importing the file starts nothing (rv32j D2). Calls into torch or
    the standard library (registration, configuration: `torch.serialization.add_safe_globals([...])`,
    `warnings.warn(...)`) are a library's too (rv32g item 4). Unsure: a call as a statement into anything else,
    with no sign of a script. A library's helpers start the group at their first collective: started at its
    import, it would collide with the importing script's own `init_process_group`."""
    if tree is None:
        try:
            tree = ast.parse(module.code)
        except SyntaxError:
            return "library", 0
    body = getattr(tree, "body", [])
    own = {n.name for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    imported = _module_imports(body)
    unsure = 0
    main_block = False
    for stmt in body:
        if _is_main_test(stmt):
            if stmt.orelse:  # its `else` runs at import
                return "script", 0
            main_block = main_block or _does_something(stmt.body)
            continue
        for kind, line in _module_calls(stmt, own, imported):
            if kind == "sign":
                return "script", 0
            unsure = unsure or line
    if main_block:  # also with calls of unknown effect above it: the guarded start comes before them
        return "main", 0
    return ("unsure", unsure) if unsure else ("library", 0)


def _is_main_test(stmt: ast.stmt) -> bool:
    """`if __name__ == "__main__":`, `"__main__" == __name__`, or either `and` a condition: a block that runs when
    the file runs, never at its import (`__name__ != "__main__"` runs at import: rv32k D1)."""
    return isinstance(stmt, ast.If) and _tests_main(stmt.test)


def _tests_main(test: ast.expr) -> bool:
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(_tests_main(v) for v in test.values)
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = {ast.unparse(test.left), ast.unparse(test.comparators[0])}
    return sides in ({"__name__", "'__main__'"}, {"__name__", '"__main__"'})


def _is_main_block(module: cst.Module, stmt: cst.CSTNode) -> bool:
    """The CST twin of :func:`_is_main_test`."""
    if not isinstance(stmt, cst.If):
        return False
    try:
        return _tests_main(ast.parse(module.code_for_node(stmt.test).strip(), mode="eval").body)
    except SyntaxError:
        return False


def _does_something(body: Sequence[ast.stmt]) -> bool:
    """A block that holds more than `pass`, `...` or a string."""
    return any(not (isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)))
               for s in body)


def _module_imports(body: Sequence[ast.stmt]) -> dict[str, str]:
    """The module-level names imports bind (also inside a module-level `try` / `if`): name -> qualified name."""
    out: dict[str, str] = {}
    for stmt in body:
        for node in ast.walk(stmt) if isinstance(stmt, (ast.Try, ast.If)) else (stmt,):
            if isinstance(node, ast.Import):
                for a in node.names:
                    out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _headers(stmt: ast.stmt) -> list[ast.expr]:
    """The header of a loop or `with`: what it iterates, tests or enters."""
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        return [stmt.iter]
    if isinstance(stmt, ast.While):
        return [stmt.test]
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return [item.context_expr for item in stmt.items]
    return []


def _module_calls(stmt: ast.stmt, own: set[str], imported: dict[str, str],
                  in_loop: bool = False) -> list[tuple[str, int]]:
    """("sign" | "other", line) for the calls that module-level code makes in `stmt`: its own blocks, not its
    `except` handlers, nor functions or classes defined there. "other": a call as a statement into something
    unknown; quiet calls and unknown calls whose value is assigned are left out. `in_loop`: `stmt` is in a
    module-level loop, where the file's own `train_step()` runs the training too."""
    out: list[tuple[str, int]] = []
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)):
        return out
    if isinstance(stmt, (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Raise, ast.Assert)):
        # `raise SystemExit(main())`, `assert run() is None` run the file's entry point as an assignment does (rv32j)
        discarded = isinstance(stmt, ast.Expr)
        value = stmt.test if isinstance(stmt, ast.Assert) else getattr(stmt, "value", getattr(stmt, "exc", None))
        if value is None:
            return out
        for node in ast.walk(value):
            if isinstance(node, ast.Call):
                kind = _call_kind(node, own, imported, discarded=discarded, in_loop=in_loop)
                if kind == "sign" or (kind == "other" and isinstance(stmt, ast.Expr) and node is value):
                    out.append((kind, node.lineno))
        return out
    loop = in_loop or isinstance(stmt, (ast.For, ast.AsyncFor, ast.While))
    for header in _headers(stmt):
        for node in ast.walk(header):
            if isinstance(node, ast.Call) and _call_kind(node, own, imported, discarded=False) == "sign":
                out.append(("sign", node.lineno))  # `for batch in pl.MpDeviceLoader(...)`, `with xm.step():`
    blocks = [getattr(stmt, name, []) for name in ("body", "orelse", "finalbody")]
    for block in blocks:
        for inner in block if isinstance(block, list) else []:
            out += _module_calls(inner, own, imported, loop)
    return out


# a string of code that calls a function by its bare name: `cProfile.run("main()")`, `exec("run()")`
_CODE_CALL = re.compile(r"\s*(\w+)\s*\(.*\)\s*", re.S)


def _call_kind(call: ast.Call, own: set[str], imported: dict[str, str], discarded: bool = True,
               in_loop: bool = False) -> str:
    """"sign": an entry point called by its bare name, exactly (`main()`, `app()`, `result = main()`; an imported
    one as a statement: `TRAIN, TEST = train_test_split(...)` is no entry point; `CONFIG = app_config()`,
    `eval(...)` neither: rv32i D1), in a loop the file's own function named like one (`train_step()`), the code
    `"main()"` given to a call (`cProfile.run`, `exec`), `runpy`, an XLA / torch.distributed API (not an `is_*`
    test); "quiet": torch or the standard library (configuration, registration: `atexit.register(run_cleanup)`,
    `subprocess.run(...)`); "other": anything else, also the file's other functions (`_register()`, `app =
    create_app()`) and entry-like names on attributes (`MODEL.eval()`): a library does both at its import (rv32h
    D1)."""
    parts: list[str] = []
    func: ast.expr = call.func
    while isinstance(func, ast.Attribute):
        parts.insert(0, func.attr)
        func = func.value
    if discarded and any(isinstance(a, ast.Name) and a.id in own and _ENTRY.fullmatch(a.id) for a in call.args):
        return "sign"  # `fire.Fire(main)`, `typer.run(main)`: a launcher given the file's entry point
    if any(_runs_entry(a, own) for a in call.args):
        return "sign"  # `cProfile.run("main()")`: the profiler runs it (rv32j)
    if not isinstance(func, ast.Name):  # `torch.ones(2).to("xla")`
        return "other"
    root, last = func.id, (parts or [func.id])[-1]
    builtin = root in _BUILTINS and root not in imported and root not in own  # `eval(...)`: Python's, no entry
    if not parts and not builtin and _ENTRY.fullmatch(root) and (discarded or root not in imported):
        return "sign"
    if not parts and in_loop and discarded and root in own and _ENTRY.match(root):
        return "sign"  # `for epoch in range(3): train_step()`; `REG[k] = run_factory(k)` fills a registry (rv32k D5)
    qualname = ".".join([imported.get(root, root), *parts])
    if (in_family(qualname) or qualname.startswith(("torch.distributed.", "runpy."))) and not last.startswith("is_"):
        return "sign"
    stdlib = root in imported and qualname.split(".")[0] in sys.stdlib_module_names  # `atexit.register(f)`
    if root in _QUIET_ROOTS or qualname.split(".")[0] == "torch" or builtin or stdlib:
        return "quiet"
    return "other"


def _runs_entry(code: ast.expr, own: set[str]) -> bool:
    """A string constant of code that calls the file's entry point by its bare name (`"main()"`)."""
    if not (isinstance(code, ast.Constant) and isinstance(code.value, str)):
        return False
    match = _CODE_CALL.fullmatch(code.value)
    return match is not None and match.group(1) in own and _ENTRY.fullmatch(match.group(1)) is not None


def _rebinds_os(tree: ast.AST | None, module: cst.Module) -> bool:
    """The file binds the name `os` to something else somewhere (a parameter `os="linux"`, an assignment, an
    import of another module as `os`): generated code then reads the environment through `_neuron_os`."""
    if tree is None:
        try:
            tree = ast.parse(module.code)
        except SyntaxError:
            return False
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.arg == "os":
            return True
        if isinstance(node, ast.Name) and node.id == "os" and not isinstance(node.ctx, ast.Load):
            return True
        if isinstance(node, ast.ExceptHandler) and node.name == "os":
            return True
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == "os" for a in node.names):
            return True
        if isinstance(node, ast.Import) and any(a.asname == "os" and a.name != "os" for a in node.names):
            return True
    return False


def _is_init_call(call: cst.Call, resolved: str | None = None) -> bool:
    """`init_process_group(...)`, also under an import alias (`from torch.distributed import init_process_group as
    ipg`: `resolved`, rv32f item 4)."""
    return any((name or "").rsplit(".", 1)[-1] == "init_process_group" for name in (dotted(call.func), resolved))


_EARLY_CALL = "neuron_init_group()  # torchrun: the process group first, before any device use (as XLA's runtime)\n"
_SET_DEVICE_CALL = 'neuron_set_device()  # torchrun: the bare "neuron" is this process\'s core, as XLA\'s one device\n'


def _start_group_first(module: cst.Module, calls: Sequence[str], guarded: bool = False) -> cst.Module:
    """Call `neuron_init_group()` (and `neuron_set_device()`) after the inlined helpers, before any module code
    that can touch the device: under torchrun XLA's runtime joined the processes at start, and the native runtime
    must not be initialised (a device used) before `init_process_group` (TorchNeuron's `_neuron_runtime_setup`
    asserts it; rv32e item 3). The module's leading settings go first (`os.environ[...] = ...` between its imports:
    the group start reads the machine's settings, rv32f item 2). With one process, or a group already running,
    they do nothing. `guarded`: a file whose only script sign is its `__main__` block gets them behind its own
    `if __name__ == "__main__":`, still before its module code: run as a script, the group starts before anything
    at its import can use the device; imported by a program that starts its own group, it starts nothing (rv32j
    D2). No judgement of what the module code does at import is needed (reviews rv32k-rv32p each found code that
    such a judgement missed: annotations, metaclasses, Enum members, aliases)."""
    body = list(module.body)
    present = set()
    main_blocks = [s.body.body for s in body if isinstance(s, cst.If) and isinstance(s.body, cst.IndentedBlock)
                   and _is_main_block(module, s)]  # the guard, or the user's block (earlier migrations put it there)
    for stmt in [*body, *(inner for block in main_blocks for inner in block)]:
        first = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) else None
        if isinstance(first, cst.Expr) and isinstance(first.value, cst.Call) and not first.value.args:
            present.add(dotted(first.value.func))
    todo = [call for call in calls if call.split("(")[0] not in present]  # a second migration adds none
    if not todo:
        return module
    helpers = [i for i, s in enumerate(body) if isinstance(s, (cst.FunctionDef, cst.ClassDef))
               and s.name.value in helpermod.HELPERS]
    at = helpers[-1] + 1 if helpers else _header_end(body)
    settings_end = _settings_end(body, at)
    stmts = [cst.parse_statement(call) for call in todo] if not guarded else [
        cst.parse_statement(_GUARD + "".join("    " + call for call in todo))]
    if settings_end == at:
        stmts[0] = stmts[0].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
    body[settings_end:settings_end] = stmts
    return module.with_changes(body=body)


_GUARD = 'if __name__ == "__main__":  # run as a script: the group first; imported, nothing starts\n'


# what a module's leading settings may call: the environment and the import path
_SETTING_CALLS = ("os.environ.", "os.putenv", "sys.path.")
_ANY_CALL = cst_matchers.Call()


def _todo_after_helpers(module: cst.Module, rule: flagmod.FlagRule) -> cst.Module:
    """The TODO on the first module-level statement after the inlined helpers: where `neuron_init_group()` goes
    in a script."""
    body = list(module.body)
    helpers = [i for i, s in enumerate(body) if isinstance(s, (cst.FunctionDef, cst.ClassDef))
               and s.name.value in helpermod.HELPERS]
    at = helpers[-1] + 1 if helpers else _header_end(body)
    at = _settings_end(body, at)
    if at >= len(body):
        return module
    body[at] = _with_todos(body[at], [rule])
    return module.with_changes(body=body)


def _flag_settings_after_start(tree: ast.AST, ctx: Ctx, cell: int | None) -> dict[str, set[int]]:
    """Flag each module-level environment setting (`os.environ[...] = ...`, `del os.environ[...]`, `|=`,
    `os.environ.update(...)`, `os.putenv(...)`; also through `import os as o`, `from os import environ as E`,
    `env = os.environ`) that the start may read and that comes after the first module code, where the group start
    goes (`_settings_end`): the start does not see it (reviews rv32q, rv32r, rv32s). Function bodies run later and
    are not looked at, nor what a `__main__` block does after its first call (XLA read nothing later either).
    Returns, per flagged statement's code, which of that code's occurrences (in file order) get the TODO."""
    body = list(getattr(tree, "body", []))
    environ = _environ_names(body)
    i = 1 if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else 0
    while i < len(body) and (isinstance(body[i], (ast.Import, ast.ImportFrom)) or _is_inert(body[i])):
        i += 1  # what `_settings_end` lets go before the start: imports, settings, statements calling nothing
    rule = flagmod.SETTING_AFTER_START
    flagged: dict[str, set[int]] = {}
    seen: dict[str, int] = {}
    todo: list[tuple[ast.AST, bool]] = [(stmt, n >= i) for n, stmt in enumerate(body)]
    while todo:
        node, after = todo.pop(0)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue  # runs when called, not at import
        keys = _environ_keys(node, environ) if isinstance(node, ast.stmt) else None
        if keys is not None:
            code = ast.unparse(node)
            seen[code] = seen.get(code, -1) + 1
            if after and _start_reads(keys):
                ctx.flags.append(Flag(line=node.lineno, rule=rule.rule, reason=rule.reason,
                                      suggestion=rule.suggestion, code=code.splitlines()[0], cell=cell))
                flagged.setdefault(code, set()).add(seen[code])
            continue
        children: list[tuple[ast.AST, bool]] = [(c, after) for c in ast.iter_child_nodes(node)]
        if isinstance(node, ast.stmt) and _is_main_test(node):  # after the block's first call: read by no one
            called = False
            children = [(node.test, after)]
            for inner in node.body:
                children.append((inner, after and not called))
                called = called or not _is_inert(inner) and _environ_keys(inner, environ) is None
            children += [(c, after) for c in node.orelse]  # an `else` runs at import: counted in file order too
        todo[:0] = children
    return flagged


def _environ_names(body: Sequence[ast.stmt]) -> set[str]:
    """The spellings of `os.environ` in a file: `os.environ`, `o.environ` after `import os as o`, `E` after `from os
    import environ as E`, and module-level names bound to one of them (`env = os.environ`)."""
    names = {"os.environ"}
    for node in (n for stmt in body for n in ast.walk(stmt)):
        if isinstance(node, ast.Import):
            names |= {f"{a.asname}.environ" for a in node.names if a.name == "os" and a.asname}
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            names |= {a.asname or a.name for a in node.names if a.name == "environ"}
    for stmt in body:
        if isinstance(stmt, ast.Assign) and ast.unparse(stmt.value) in names:
            names |= {t.id for t in stmt.targets if isinstance(t, ast.Name)}
    return names


# the variables the group start reads: the launcher's, the rendezvous, the runtime's cores, c10d's and the
# backend's options (compiler settings, NEURON_CC_FLAGS and XLA_FLAGS, are read at the first compile, later)
_READ_AT_START = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                            "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})
_READ_AT_START_PREFIXES = ("NEURON_RT_", "NEURON_LOGICAL_NC", "TORCH_DISTRIBUTED", "TORCH_NCCL", "TORCHELASTIC",
                           "GLOO_", "COLLECTIVE_BUCKETSIZE", "NEURON_USE_SPLIT")


def _environ_keys(stmt: ast.stmt, environ: set[str]) -> list[str | None] | None:
    """The variables a statement sets or deletes in the environment (None for one it cannot name), or None when it
    is no environment setting. `environ`: the file's spellings of `os.environ`."""
    def is_environ(node: ast.AST) -> bool:
        return ast.unparse(node) in environ

    def dict_keys(value: ast.AST) -> list[str | None]:
        if isinstance(value, ast.Dict) and None not in value.keys:
            return [_literal(k) for k in value.keys]
        return [None]

    if isinstance(stmt, ast.AugAssign) and is_environ(stmt.target):  # `os.environ |= {...}`
        return dict_keys(stmt.value)
    if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
        targets = stmt.targets if isinstance(stmt, (ast.Assign, ast.Delete)) else [stmt.target]
        keys = [t.slice for t in targets if isinstance(t, ast.Subscript) and is_environ(t.value)]
        return [_literal(k) for k in keys] or None
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return None
    call = stmt.value
    modules = {name[: -len(".environ")] for name in environ if name.endswith(".environ")}
    func = call.func
    on_os = isinstance(func, ast.Attribute) and ast.unparse(func.value) in modules
    if (on_os and func.attr in ("putenv", "unsetenv")) or (  # type: ignore[union-attr]
            isinstance(func, ast.Attribute) and is_environ(func.value)
            and func.attr in ("setdefault", "pop", "__setitem__", "__delitem__")):
        return [_literal(call.args[0]) if call.args else None]
    if isinstance(func, ast.Attribute) and is_environ(func.value) and func.attr == "update":
        keys: list[str | None] = [k.arg for k in call.keywords]  # `**cfg`: None, a key it cannot name
        for a in call.args:
            keys += dict_keys(a)
        return keys or [None]
    return None


def _literal(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _start_reads(keys: Sequence[str | None]) -> bool:
    """A setting of a variable the start may read, or of one it cannot name (a variable key, `update(cfg)`)."""
    return any(k is None or k in _READ_AT_START or k.startswith(_READ_AT_START_PREFIXES) for k in keys)


def _is_inert(stmt: ast.stmt) -> bool:
    """A simple statement that calls nothing but `os.environ` / `sys.path` methods (a setting, a constant), as
    `_settings_end` counts them."""
    if isinstance(stmt, (ast.If, ast.For, ast.While, ast.With, ast.Try, ast.FunctionDef, ast.AsyncFunctionDef,
                         ast.ClassDef, ast.AsyncFor, ast.AsyncWith)):
        return False
    return all(ast.unparse(c.func).startswith(_SETTING_CALLS) for c in ast.walk(stmt) if isinstance(c, ast.Call))


class _SettingTodos(cst.CSTTransformer):
    """The TODO of `xla-setting-after-start` above each flagged setting, so that it outlives the report (a second
    pass lists it as an open TODO). Found by its code and which occurrence of that code it is, in file order, as
    `_flag_settings_after_start` counted them (the same code before the start gets none: rv32s); a line of several
    statements gets it when one of them is flagged."""

    def __init__(self, flagged: dict[str, set[int]], environ: set[str]) -> None:
        super().__init__()
        self.flagged = flagged
        self.environ = environ
        self.seen: dict[str, int] = {}

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False  # settings in functions were not counted

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine,
                                  updated: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
        try:
            stmts = ast.parse(cst.Module(body=[original.with_changes(leading_lines=[])]).code).body
        except SyntaxError:
            return updated
        hit = False
        for stmt in stmts:
            if _environ_keys(stmt, self.environ) is None:
                continue
            code = ast.unparse(stmt)
            self.seen[code] = self.seen.get(code, -1) + 1
            hit = hit or self.seen[code] in self.flagged.get(code, ())
        return _with_todos(updated, [flagmod.SETTING_AFTER_START]) if hit else updated


def _settings_end(body: Sequence[Stmt], at: int) -> int:
    """The index of the first module-level statement from `at` on that may touch the device: one that is not an
    import nor a simple statement calling nothing but `os.environ` / `sys.path` methods (`os.environ["X"] = "1"`)."""
    while at < len(body):
        stmt = body[at]
        if not isinstance(stmt, cst.SimpleStatementLine):
            break
        if not _is_import_line(stmt) and any(
                not (dotted(c.func) or "").startswith(_SETTING_CALLS) for c in cst_matchers.findall(stmt, _ANY_CALL)):
            break
        at += 1
    return at


class _GuardInits(cst.CSTTransformer):
    """With the group started first (`_start_group_first`), the script's own `init_process_group` would start a
    second one (rv32e item 4): one that is a statement of its own, with only the target's backend, gets `if not
    torch.distributed.is_initialized():` (under torchrun the group it meant runs already; without, it starts it
    as before); one already behind an `is_initialized()` test is left alone; any other is flagged."""

    def __init__(self, ctx: Ctx, inits: dict[int, tuple[int, cst.Call]],
                 rule: flagmod.FlagRule = flagmod.EARLY_GROUP) -> None:
        super().__init__()
        self.ctx = ctx
        self.inits = inits
        self.rule = rule
        self.tests: list[str] = []  # the tests of the enclosing `if`s
        self.marks: list[list[str]] = []  # per enclosing statement: "guard" or "flag"
        self.bare: list[int] = []  # per enclosing statement: the id of its call when it is a lone call

    def visit_If(self, node: cst.If) -> bool:
        self.tests.append(self.ctx.code(node.test))
        return True

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> Any:
        self.tests.pop()
        return self._finish(original_node, updated_node)

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            self.marks.append([])
            lone = isinstance(node, cst.SimpleStatementLine) and len(node.body) == 1 and isinstance(
                node.body[0], cst.Expr)
            self.bare.append(id(node.body[0].value) if lone else 0)  # type: ignore[union-attr]
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode, updated_node: Any) -> Any:
        result = super().on_leave(original_node, updated_node)
        if isinstance(original_node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)) and not isinstance(
                original_node, cst.If):
            result = self._finish(original_node, result)
        return result

    def _finish(self, original: cst.CSTNode, updated: Any) -> Any:
        marks = self.marks.pop()
        self.bare.pop()
        if "flag" in marks:
            return _with_todos(updated, [self.rule])
        if "guard" in marks:
            self.ctx.need("torch")
            test = cst.parse_expression("not torch.distributed.is_initialized()")
            # the statement's own TODOs stay on it, inside the guard, where a second migration raises them again
            # (a TODO above the guard was added again inside it: rv32h D3)
            lines = list(updated.leading_lines)
            at = next((i for i, ln in enumerate(lines) if ln.comment is not None
                       and ln.comment.value.startswith(TODO)), len(lines))
            inner = updated.with_changes(leading_lines=lines[at:])
            return cst.If(test=test, body=cst.IndentedBlock(body=[inner]), leading_lines=lines[:at])
        return updated

    def visit_Call(self, node: cst.Call) -> bool:
        entry = self.inits.get(id(node))
        if entry is None or any("is_initialized" in t for t in self.tests) or not self.marks:
            return True
        if self.bare and self.bare[-1] == id(node) and self._only_backend(node):
            self.marks[-1].append("guard")
            return True
        self.marks[-1].append("flag")
        rule = self.rule
        self.ctx.flags.append(Flag(line=entry[0], rule=rule.rule, reason=rule.reason, suggestion=rule.suggestion,
                                   code=self.ctx.code(node).strip(), cell=self.ctx.cell))
        return True

    def _only_backend(self, call: cst.Call) -> bool:
        """Only the target's backend, as a literal: what `neuron_init_group()` starts."""
        if len(call.args) != 1:
            return False
        first = call.args[0]
        keyword = first.keyword.value if first.keyword is not None else None
        return keyword in (None, "backend") and not first.star and string_matches(
            first.value, re.escape(self.ctx.target.backend))


def _called_names(module: cst.Module) -> set[str]:
    """The last name of everything called in the module (`init_process_group`, a class instantiated)."""
    called: set[str] = set()

    class _V(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            name = dotted(node.func)
            if name:
                called.add(name.rsplit(".", 1)[-1])

    module.visit(_V())
    return called


def _called_names_ast(tree: ast.AST) -> set[str]:
    """`_called_names` from Python's parse tree (C speed)."""
    called: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name):
                called.add(f.id)
            elif isinstance(f, ast.Attribute):
                called.add(f.attr)
    return called


def _todos_to_first_statement(module: cst.Module) -> cst.Module:
    """libcst puts the comments above the first statement in the module's header: give a TODO block there back
    to the statement it belongs to (the rendering is the same), so that a second migration sees it."""
    header = list(module.header)
    if not module.body:
        return module
    i = len(header)
    while i > 0 and header[i - 1].comment is not None and header[i - 1].comment.value.startswith((TODO, "#   ")):
        i -= 1
    while i < len(header) and not header[i].comment.value.startswith(TODO):  # type: ignore[union-attr]
        i += 1
    if i == len(header):
        return module
    first = module.body[0]
    moved = [*header[i:], *first.leading_lines]  # type: ignore[attr-defined]
    return module.with_changes(header=header[:i], body=[first.with_changes(leading_lines=moved), *module.body[1:]])


def _open_todos(module: cst.Module, ctx: Ctx, source: str | None = None) -> None:
    """TODOs an earlier migration left (or a launcher line in a notebook) that this run did not raise again:
    still open, so still flagged (the exit code of a second migration stays 1)."""
    text = source if source is not None else module.code
    if TODO not in text:
        return
    # counted: two lines with the same TODO (two `groups=` calls) need two flags raised again (rv32c item 13)
    raised = Counter(_todo_lines(flagmod.FlagRule(f.rule, f.reason, f.suggestion))[0] for f in ctx.flags)
    for n, line in enumerate(text.splitlines(), 1):
        text = line.strip()
        if not text.startswith(TODO):
            continue
        raised[text] -= 1
        if raised[text] < 0 and not text.startswith(f"{TODO} Import kept"):
            ctx.flags.append(Flag(line=n, rule="open-todo", reason=text[len(TODO):].strip(),
                                  suggestion="see the TODO comment", code=text, cell=ctx.cell))


_MARKERS = ("xla", "XLA", "optimum", "neuronx_distributed", "torch_neuronx", "PJRT", "NEURON_CC_FLAGS", TODO)


def might_need_migration(code: str) -> bool:
    """False when no migrated name, variable or TODO can be in the text: the file is left as it is, unparsed by
    libcst (most files of a real tree)."""
    return any(m in code for m in _MARKERS)


def migrate_python(code: str, target: Target = NEURON, rules: Rules | None = None) -> PyResult:
    """Migrate one Python source. Raises SyntaxError for code that does not parse.

    Python's own parser goes first: it rejects what Python would (with the line), and its limits (nesting
    depth) keep hostile input away from libcst's native parser, which can overflow its stack on them."""
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        raise SyntaxError(e.msg, (e.filename, e.lineno, e.offset, e.text)) from None
    except (MemoryError, RecursionError) as e:
        raise SyntaxError(f"too deeply nested to parse ({type(e).__name__})", ("", 1, 0, "")) from None
    if not might_need_migration(code):
        return PyResult(code, [], [], set())
    module = cst.parse_module(code)
    aliases = Aliases()
    aliases.add_ast(tree)
    new, ctx = migrate_module(module, aliases, target, rules, tree=tree, source=code)
    out = new.code
    return PyResult(out, ctx.rewrites, ctx.flags, ctx.helpers)
