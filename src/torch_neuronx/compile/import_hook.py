"""Run a function right after a module is first imported.

Registering anything with Dynamo imports Dynamo (~1.4 s), which ``import
torch_neuronx`` must not pay. Python's import system lets a finder on
``sys.meta_path`` observe a module's first import; we use that to register
the ``neuron`` backend the moment Dynamo is loaded by whoever loads it.
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

Callback = Callable[[ModuleType], None]

_lock = threading.RLock()
_pending: dict[str, list[Callback]] = {}


def when_imported(name: str, callback: Callback) -> None:
    """Call ``callback(module)`` once module `name` is imported (now, if it already is)."""
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _pending.setdefault(name, []).append(callback)
            if not any(isinstance(f, _Finder) for f in sys.meta_path):
                sys.meta_path.insert(0, _Finder())
            return
    _run(name, [callback], module)


def _run(name: str, callbacks: list[Callback], module: ModuleType) -> None:
    for callback in callbacks:
        try:
            callback(module)
        except Exception as exc:  # a registration bug must never break the user's import
            warnings.warn(f"torch_neuronx: hook on import of {name} failed: {exc!r}", stacklevel=2)


class _Loader:
    """Delegates to the real loader, then runs the callbacks waiting for the module."""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        with _lock:
            callbacks = _pending.pop(self._name, [])
            if not _pending:
                sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]
        _run(self._name, callbacks, module)

    def __getattr__(self, attr: str) -> Any:  # get_source, is_package, resource readers, ...
        return getattr(self._loader, attr)


class _Finder:
    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> ModuleSpec | None:
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, fullname)
                return spec
        return None
