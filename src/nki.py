"""``import nki`` for TorchNeuron's emulator: AWS's NKI package when it is installed, the interpreter otherwise.

This module is only a router, and it never shadows AWS's package:

* installed into the same ``site-packages`` as AWS's ``nki/`` package, Python's
  path finder picks the package directory over this ``nki.py``, so this file
  never runs;
* found first on ``sys.path`` (an editable install, ``PYTHONPATH``), it looks
  for another ``nki`` on the path and, when there is one, loads that in its
  place;
* only when there is none does ``nki`` become ``torch_neuronx.nki``, the host
  interpreter of the NKI API, whose ``__emulated__`` is true.

``torch_neuronx.nki.provider()`` says which one a plain ``import nki`` gives.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys


def _real_nki() -> importlib.machinery.ModuleSpec | None:
    here = os.path.realpath(__file__)
    for entry in sys.path:
        try:
            spec = importlib.machinery.PathFinder.find_spec("nki", [entry or os.getcwd()])
        except (ImportError, OSError, ValueError):
            continue
        if spec is None or spec.origin is None:
            continue
        if os.path.realpath(spec.origin) != here and not _is_router(spec.origin):
            return spec
    return None


def _is_router(origin: str) -> bool:
    """Whether `origin` is another copy of this router (a second checkout installed beside this one): loading it
    would look for a real ``nki`` again and come back here, without end."""
    if os.path.basename(origin) != "nki.py":
        return False  # AWS's is a package (nki/__init__.py)
    try:
        with open(origin, encoding="utf-8") as f:
            return _MARK in f.read(4096)
    except OSError:
        return False


_MARK = (__doc__ or "").splitlines()[0]  # this router's first line, as every copy of it opens


def _route() -> None:
    spec = _real_nki()
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["nki"] = module
        spec.loader.exec_module(module)
        return
    from torch_neuronx.nki._importer import install

    install()


_route()
