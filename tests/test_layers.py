"""The package's dependencies run one way: runtime <- metrics <- device <- {compile, distributed} <- profiling
<- {tools, testing} <- check (the job-side markers of `torch-neuronx check`).

Every import in every module (function-level ones included) is checked
against the layer it belongs to; the C++ core (`_C`) and `patches` (PyTorch
internals, importing nothing of ours) sit below everything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import torch_neuronx

PACKAGE = Path(torch_neuronx.__file__).resolve().parent

# layer -> the layers it may import (besides itself, _C and patches)
ALLOWED: dict[str, set[str]] = {
    "runtime": set(),
    "patches": set(),
    "metrics": {"runtime"},
    "device": {"runtime"},
    "compile": {"runtime", "metrics", "device"},
    "distributed": {"runtime", "device"},
    "profiling": {"runtime", "device", "distributed"},
    "nki": {"runtime"},  # the NKI interpreter: plain Python and torch, reads only the emulated instance
    "tools": {"runtime", "metrics", "device", "compile", "distributed", "profiling", "testing", "nki"},
    "testing": {"runtime", "metrics", "device", "compile", "distributed", "profiling", "nki"},
    "check": {"tools"},
}
BELOW_ALL = {"_C", "patches"}


def _layer(module: Path) -> str | None:
    rel = module.relative_to(PACKAGE)
    if len(rel.parts) == 1:
        name = rel.stem
        return None if name in ("__init__", "__main__") else name  # the package root wires the layers together
    return rel.parts[0]


def _imports(module: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(module.read_text(), str(module))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] if node.module != "torch_neuronx" else [f"torch_neuronx.{a.name}" for a in node.names]
            found += [(node.lineno, n) for n in names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
    return [(line, n) for line, n in found if n.startswith("torch_neuronx.")]


def test_dependencies_run_one_way() -> None:
    wrong = []
    modules = sorted(p for p in PACKAGE.rglob("*.py") if "csrc" not in p.parts)
    assert len(modules) > 30
    for module in modules:
        layer = _layer(module)
        if layer is None:
            continue
        allowed = ALLOWED[layer] | {layer} | BELOW_ALL
        for line, name in _imports(module):
            target = name.split(".")[1]
            if target not in allowed:
                wrong.append(f"{module.relative_to(PACKAGE)}:{line} ({layer}) imports {name}")
    assert not wrong, "\n".join(wrong)


def test_every_layer_is_known() -> None:
    layers = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    layers |= {p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")}
    assert layers <= set(ALLOWED) | {"_C"}, layers - set(ALLOWED)
