"""What each imported name means, and where the migrated families are referenced.

``import torch_xla.core.xla_model as xm`` binds ``xm`` to ``torch_xla.core.xla_model``; ``xm.optimizer_step``
then resolves to ``torch_xla.core.xla_model.optimizer_step`` whatever the alias. An import binds its name for the
whole file, except inside a function (or lambda) that binds the same name itself (a parameter ``xm``, a local
``xm = Recorder()``): there the name is the local one and is left alone. An import inside a function binds the
name in that function only (and the functions nested in it), as Python's scoping does: outside it the module's
own ``xm`` (or none) is meant. Names bound in one notebook cell are seen in the next.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import PositionProvider

# The code a migration removes. `torch_neuronx` is this package's (and TorchNeuron's) own name: only its XLA-era
# entry points (custom ops, inference tracing) are references to migrate.
FAMILIES = ("torch_xla", "optimum.neuron", "neuronx_distributed", "torch_neuronx.xla_impl", "torch_neuronx.trace",
            "torch_neuronx.xla", "torch_neuronx.DataParallel", "torch_neuronx.analyze")


def in_family(qualname: str | None) -> bool:
    return qualname is not None and any(qualname == f or qualname.startswith(f + ".") for f in FAMILIES)


def dotted(node: cst.BaseExpression) -> str | None:
    """``a.b.c`` for a chain of names and attributes, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = dotted(node.value)
        return None if head is None else f"{head}.{node.attr.value}"
    return None


def module_name(node: cst.BaseExpression) -> str:
    name = dotted(node)
    assert name is not None
    return name


@dataclass
class Aliases:
    """local name -> the fully qualified name it is bound to by an import."""

    names: dict[str, str] = field(default_factory=dict)  # the module's imports (and its class bodies')
    star_imports: list[str] = field(default_factory=list)
    # the qualified names of the imports inside functions, and the local names they bind (any function)
    local_qualnames: set[str] = field(default_factory=set)
    local_bound: set[str] = field(default_factory=set)
    # the scopes the walk is in, innermost last (RefTracking keeps it): a function's own imports and other names
    scopes: list[_Scope] = field(default_factory=list)

    def add_module(self, module: cst.Module) -> None:
        module.visit(_ImportCollector(self))

    def add_ast(self, tree: ast.AST) -> None:
        """The same from Python's own parse tree (C speed: a file is parsed by `ast` first anyway)."""
        for node, local in _walk_imports(tree):
            found = self.names if not local else {}
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        found[a.asname] = a.name
                    else:
                        root = a.name.split(".")[0]
                        found[root] = root
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    if a.name == "*":
                        self.star_imports.append(node.module)
                    else:
                        found[a.asname or a.name] = f"{node.module}.{a.name}"
            if local:
                self.local_qualnames.update(found.values())
                self.local_bound.update(found)

    def qualname(self, node: cst.BaseExpression) -> str | None:
        """The fully qualified name of a chain rooted at an imported name (None otherwise)."""
        if isinstance(node, cst.Name):
            last = len(self.scopes) - 1
            for i in range(last, -1, -1):  # the innermost scope that binds the name decides (a class's: its own)
                scope = self.scopes[i]
                if scope.is_class and i != last:
                    continue
                if node.value in scope.imports:
                    return scope.imports[node.value]
                if node.value in scope.names:
                    return None
            return self.names.get(node.value)
        if isinstance(node, cst.Attribute):
            head = self.qualname(node.value)
            return None if head is None else f"{head}.{node.attr.value}"
        return None


def _walk_imports(tree: ast.AST) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import of the tree, and whether it is inside a function (a lambda holds none): a function's import
    binds its name in that function only (rv32e item 2)."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []
    todo: list[tuple[ast.AST, bool, frozenset[str]]] = [(tree, False, frozenset())]
    while todo:
        node, local, declared_global = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound = {(a.asname or a.name).split(".")[0] for a in node.names}
            # `global xm` then `import ... as xm` in a function binds the module's `xm` (rv32f item 8)
            found.append((node, local and not bound & declared_global))
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            local, declared_global = True, frozenset(_globals_of(node))
        todo.extend((child, local, declared_global) for child in ast.iter_child_nodes(node))
    found.reverse()
    return found


def _globals_of(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The names a function declares `global` (not those its nested functions or classes declare)."""
    names: set[str] = set()
    todo: list[ast.AST] = list(function.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Global):
            names.update(node.names)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))
    return names


class _FunctionImports(cst.CSTVisitor):
    """The names a function's own imports bind (not those of the functions nested in it): local name -> the
    qualified name."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_Import(self, node: cst.Import) -> bool:
        for a in node.names:
            full = module_name(a.name)
            if a.asname is not None and isinstance(a.asname.name, cst.Name):
                self.names[a.asname.name.value] = full
            else:
                self.names[full.split(".")[0]] = full.split(".")[0]
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return False
        mod = module_name(node.module)
        for a in node.names:
            name = module_name(a.name)
            local = a.asname.name.value if a.asname is not None and isinstance(a.asname.name, cst.Name) else name
            self.names[local] = f"{mod}.{name}"
        return False


def function_imports(node: cst.FunctionDef) -> dict[str, str]:
    collector = _FunctionImports()
    node.body.visit(collector)
    return collector.names


class _ImportCollector(cst.CSTVisitor):
    """The module's imports (and its class bodies'); a function's own imports bind in it only (`function_imports`,
    read again when the walk enters it): here only their names are noted."""

    def __init__(self, aliases: Aliases) -> None:
        self.aliases = aliases
        self._functions = 0  # how deep in functions the walk is

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        imports = function_imports(node)
        self.aliases.local_qualnames.update(imports.values())
        self.aliases.local_bound.update(imports)
        self._functions += 1
        return True

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._functions -= 1

    def visit_Import(self, node: cst.Import) -> bool:
        return self._functions == 0 and self._add_import(node)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return self._functions == 0 and self._add_from(node)

    def _add_import(self, node: cst.Import) -> bool:
        for a in node.names:
            full = module_name(a.name)
            if a.asname is not None and isinstance(a.asname.name, cst.Name):
                self.aliases.names[a.asname.name.value] = full
            else:
                root = full.split(".")[0]
                self.aliases.names[root] = root
        return False

    def _add_from(self, node: cst.ImportFrom) -> bool:
        if node.relative or node.module is None:
            return False
        mod = module_name(node.module)
        if isinstance(node.names, cst.ImportStar):
            self.aliases.star_imports.append(mod)
            return False
        for a in node.names:
            name = module_name(a.name)
            local = a.asname.name.value if a.asname is not None and isinstance(a.asname.name, cst.Name) else name
            self.aliases.names[local] = f"{mod}.{name}"
        return False


@dataclass
class Ref:
    """One reference to a migrated family outside an import: the longest name chain, its line, its statement."""

    node: cst.BaseExpression
    qualname: str
    line: int
    statement: cst.CSTNode


class RefTracking:
    """Finds every family reference (maximal chains only) and the innermost statement holding it, while a
    visitor or transformer walks the tree (one walk does both jobs). Needs PositionProvider metadata."""

    aliases: Aliases
    scoped_names: frozenset[str] = frozenset()  # other names whose local binding matters (a parameter `find_spec`)

    def _init_tracking(self, aliases: Aliases) -> None:
        self.aliases = aliases
        self.refs: dict[int, Ref] = {}
        self.refs_by_stmt: dict[int, list[Ref]] = {}
        self._stmts: list[cst.CSTNode] = []
        self.import_lines: dict[str, int] = {}  # an import's code -> its line
        self.import_line_queue: dict[str, list[int]] = {}  # an import's code -> the lines it is on, in order
        self._not_refs: set[int] = set()  # names that are not references: attributes' names, keywords
        # per enclosing scope: the imported names it binds locally (see `_Scope`); a scope opens at its body, as
        # default values, decorators, annotations and a class's bases are evaluated outside it (rv32c items 6, 8)
        aliases.scopes = []  # shared: the aliases resolve a name in the scope the walk is in
        self._shadowed: list[_Scope] = aliases.scopes
        self._scope_at: dict[int, _Scope] = {}  # the id of a scope's body node -> the scope it opens
        self._class_stmt: dict[int, _Scope] = {}  # a class body's statement -> its class's scope
        self.ambiguous: set[int] = set()  # references a class body may or may not have re-bound: flagged

    def _line_of(self, node: cst.CSTNode) -> int:
        return self.get_metadata(PositionProvider, node).start.line  # type: ignore[attr-defined]

    def track_visit(self, node: cst.CSTNode) -> bool | None:
        """False: do not descend (an import, a name); None: carry on."""
        if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            self._stmts.append(node)
        self._open_scopes(node)
        if isinstance(node, (cst.Import, cst.ImportFrom)):
            code = cst.Module(body=[]).code_for_node(node).strip()
            self.import_lines.setdefault(code, self._line_of(node))
            self.import_line_queue.setdefault(code, []).append(self._line_of(node))
            return False
        if isinstance(node, cst.Attribute):
            self._not_refs.add(id(node.attr))
        elif isinstance(node, cst.Arg) and node.keyword is not None:
            self._not_refs.add(id(node.keyword))
        elif isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            self._not_refs.add(id(node.name))
        elif isinstance(node, cst.Param):  # `def step(xm=xm)`: the parameter's name is not the import
            self._not_refs.add(id(node.name))
        elif (isinstance(node, (cst.AssignTarget, cst.AnnAssign, cst.For, cst.AsName)) and self._shadowed
              and self._shadowed[-1].is_class):  # a class body's `xm = Recorder()` binds, it does not read
            target = node.name if isinstance(node, cst.AsName) else node.target
            self._not_refs.update(id(n) for n in _target_name_nodes(target))
        if isinstance(node, (cst.Name, cst.Attribute)) and id(node) not in self._not_refs:
            root = _root_name(node)
            shadowed = self._is_shadowed(root) if root is not None else None
            if shadowed == "local":  # a local `xm`: not the import
                return False if isinstance(node, cst.Name) else None
            qn = self.aliases.qualname(node)
            if in_family(qn) and self._stmts:
                assert qn is not None
                ref = Ref(node, qn, self._line_of(node), self._stmts[-1])
                if shadowed == "maybe":  # no rule rewrites it: only flagged (by its statement)
                    self.ambiguous.add(id(node))
                else:
                    self.refs[id(node)] = ref
                self.refs_by_stmt.setdefault(id(ref.statement), []).append(ref)
                return False
            if isinstance(node, cst.Name):
                return False
        return None

    def _open_scopes(self, node: cst.CSTNode) -> None:
        """Register the scopes `node` opens (at their bodies), and open the one whose body `node` is."""
        names = set(self.aliases.names) | self.aliases.local_bound | self.scoped_names
        if isinstance(node, cst.FunctionDef):
            self._scope_at[id(node.body)] = _Scope(False, local_names(node) & names, imports=function_imports(node))
        elif isinstance(node, cst.Lambda):
            self._scope_at[id(node.body)] = _Scope(False, local_names(node) & names)
        elif isinstance(node, cst.ClassDef):
            # a class body binds statement by statement (its code runs once, top to bottom): a name is the
            # class's own after a statement that binds it, the import before it (rv32c item 8)
            scope = self._scope_at[id(node.body)] = _Scope(True, set())
            for stmt in node.body.body:
                self._class_stmt[id(stmt)] = scope
        elif isinstance(node, (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)):
            # a comprehension is a function scope; its first iterable is evaluated outside it
            comp = node.for_in
            scope = _Scope(False, _comprehension_targets(comp) & names)
            parts: list[cst.CSTNode] = [comp.target, *comp.ifs]
            parts += [node.key, node.value] if isinstance(node, cst.DictComp) else [node.elt]
            if comp.inner_for_in is not None:
                parts.append(comp.inner_for_in)
            for part in parts:
                self._scope_at[id(part)] = scope
        scope = self._scope_at.get(id(node))
        if scope is not None:
            self._shadowed.append(scope)

    def _is_shadowed(self, name: str) -> str | None:
        """Python's scoping: an enclosing function's binding is seen by the functions nested in it; a class
        body's binding only by the class body's own statements, not by its methods nor its comprehensions (rv32b
        item 12). "local": the name is the scope's own; "maybe": a class body bound it behind an `if` / a loop
        (either may hold, flagged); None: the import."""
        last = len(self._shadowed) - 1
        for i in range(last, -1, -1):  # the innermost scope that binds it: its own import, or another binding
            scope = self._shadowed[i]
            if scope.is_class and i != last:
                continue
            if name in scope.imports:
                return None
            if name in scope.names:
                return "local"
        if last >= 0 and self._shadowed[last].is_class and name in self._shadowed[last].maybe:
            return "maybe"
        return None

    def track_leave(self, node: cst.CSTNode) -> None:
        if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            self._stmts.pop()
        scope = self._scope_at.pop(id(node), None)
        if scope is not None:
            self._shadowed.pop()
        scope = self._class_stmt.pop(id(node), None)
        if scope is not None:  # a class body's statement ran: the names it binds are the class's from here on
            binder = _LocalBinder()
            node.visit(binder)
            bound = (binder.names - binder.declared_global) & (set(self.aliases.names) | self.aliases.local_bound)
            if isinstance(node, (cst.SimpleStatementLine, cst.FunctionDef, cst.ClassDef)):
                scope.names |= bound
            else:  # `if flag: xm = Recorder()`: bound on one path only
                scope.maybe |= bound - scope.names


@dataclass
class _Scope:
    """The imported names a function, lambda, comprehension or class body binds itself; `maybe`: those a class
    body bound on one path only (in an `if`, a loop, a `try`)."""

    is_class: bool
    names: set[str]
    maybe: set[str] = field(default_factory=set)
    imports: dict[str, str] = field(default_factory=dict)  # a function's own imports: local name -> qualified name


def _comprehension_targets(comp: cst.CompFor) -> set[str]:
    names: set[str] = set()
    while comp is not None:
        names |= _target_names(comp.target)
        comp = comp.inner_for_in  # type: ignore[assignment]
    return names


def _root_name(node: cst.BaseExpression) -> str | None:
    while isinstance(node, cst.Attribute):
        node = node.value
    return node.value if isinstance(node, cst.Name) else None


def _target_names(node: cst.CSTNode) -> set[str]:
    """The names an assignment target binds (`a`, `a, (b, *c)`); attributes and subscripts bind none."""
    if isinstance(node, cst.Name):
        return {node.value}
    if isinstance(node, (cst.Tuple, cst.List)):
        return {n for e in node.elements for n in _target_names(e.value)}
    if isinstance(node, cst.StarredElement):
        return _target_names(node.value)
    return set()


def _target_name_nodes(node: cst.CSTNode) -> list[cst.Name]:
    """The Name nodes an assignment target binds (`a`, `a, (b, *c)`)."""
    if isinstance(node, cst.Name):
        return [node]
    if isinstance(node, (cst.Tuple, cst.List)):
        return [n for e in node.elements for n in _target_name_nodes(e.value)]
    if isinstance(node, cst.StarredElement):
        return _target_name_nodes(node.value)
    return []


def catches_import_error(handler: cst.ExceptHandler) -> bool:
    """`except ImportError:`, `except (ModuleNotFoundError, OSError):`."""
    caught = handler.type
    kinds = [e.value for e in caught.elements] if isinstance(caught, cst.Tuple) else [caught] if caught else []
    return any(isinstance(k, cst.Name) and k.value in ("ImportError", "ModuleNotFoundError") for k in kinds)


class _LocalBinder(cst.CSTVisitor):
    """Names a function binds in its own scope (Python's rule: a name assigned anywhere in a function is local
    to all of it): parameters, assignment / for / with / except / walrus / comprehension targets, nested defs.
    Imports are left out: a local import of a family binds the family name (the aliases hold it)."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.declared_global: set[str] = set()

    def visit_Param(self, node: cst.Param) -> None:
        self.names.add(node.name.value)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self.names |= _target_names(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self.names |= _target_names(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self.names |= _target_names(node.target)

    def visit_For(self, node: cst.For) -> None:
        self.names |= _target_names(node.target)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self.names |= _target_names(node.target)

    def visit_AsName(self, node: cst.AsName) -> None:
        self.names |= _target_names(node.name)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self.names |= _target_names(node.target)

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> bool:
        """`except ImportError: xm = None`, the fallback of an optional import, binds no local `xm` of its own:
        the function's `xm` is the import (rv32b item 5)."""
        return not catches_import_error(node)

    def visit_Global(self, node: cst.Global) -> None:
        self.declared_global |= {n.name.value for n in node.names}

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        self.declared_global |= {n.name.value for n in node.names}

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self.names.add(node.name.value)
        return False  # its own scope

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self.names.add(node.name.value)
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False


def local_names(node: cst.FunctionDef | cst.Lambda | cst.ClassDef) -> set[str]:
    """The names `node` binds locally, which shadow the module's imports of the same names inside it."""
    binder = _LocalBinder()
    if not isinstance(node, cst.ClassDef):
        node.params.visit(binder)
    if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
        node.body.visit(binder)
    return binder.names - binder.declared_global


class RefIndex(RefTracking, cst.CSTVisitor):
    """The references of a whole module, as a visitor (the tests check migrated code with it)."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, aliases: Aliases) -> None:
        super().__init__()
        self._init_tracking(aliases)

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.track_visit(node) is False:
            return False
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.track_leave(original_node)
        super().on_leave(original_node)
