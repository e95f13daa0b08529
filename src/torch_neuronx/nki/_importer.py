"""Serve ``import nki`` (and ``nki.language``, ``nki.isa``, ...) from this interpreter, without copies.

The top-level shim (``src/nki.py``) calls :func:`install` only when no real
``nki`` package exists elsewhere on ``sys.path``. It then makes ``nki`` the
same module object as ``torch_neuronx.nki`` and puts a finder first on
``sys.meta_path`` that answers ``nki.<sub>`` with ``torch_neuronx.nki.<sub>``,
so each submodule exists once, under both names (one ``NkiTensor`` class,
one launch state).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

PREFIX = "torch_neuronx."


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        pass  # already executed under its torch_neuronx name


class AliasFinder(importlib.abc.MetaPathFinder):
    """``nki.X`` -> ``torch_neuronx.nki.X`` while ``nki`` is this interpreter."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("nki."):
            return None
        parent = sys.modules.get("nki")
        if parent is None or not getattr(parent, "__emulated__", False):
            return None
        real = PREFIX + fullname
        if importlib.util.find_spec(real) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(real))


def install() -> ModuleType:
    """Make ``sys.modules["nki"]`` this interpreter and route its submodules; returns the module."""
    module = importlib.import_module("torch_neuronx.nki")
    if not any(isinstance(f, AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, AliasFinder())
    sys.modules["nki"] = module
    for name in ("language", "isa", "typing"):
        sys.modules[f"nki.{name}"] = sys.modules[f"torch_neuronx.nki.{name}"]
    return module
