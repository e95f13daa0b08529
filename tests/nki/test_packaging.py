"""``import nki``: this interpreter when AWS's package is absent, AWS's package whenever it is present (never
shadowed, whatever the order on sys.path), and ``from torch_neuronx import nki_op, nki`` in TorchNeuron's form."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch_neuronx

SRC = Path(torch_neuronx.__file__).resolve().parent.parent
SHIM = SRC / "nki.py"
PROBE = ("import nki, nki.language as nl, nki.isa as nisa; "
         "print(getattr(nki, '__emulated__', False), getattr(nki, 'REAL', False), nl.__name__, nisa.__name__)")


def run(code: str, pythonpath: list[Path] | None = None, cwd: Path | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def fake_aws_nki(root: Path) -> Path:
    pkg = root / "nki"
    (pkg / "language").mkdir(parents=True)
    (pkg / "__init__.py").write_text("REAL = True\n")
    (pkg / "language" / "__init__.py").write_text("")
    (pkg / "isa.py").write_text("")
    return root


def test_import_nki_gives_the_interpreter_without_aws_and_torchneuron_form(tmp_path: Path) -> None:
    # one interpreter start (importing torch is the slow part): the lazy import first, then both import forms
    out = run("import sys, torch_neuronx; print('torch_neuronx.nki' in sys.modules); "
              "from torch_neuronx import nki_op, nki as tn; print(tn.__emulated__, callable(nki_op)); "
              + PROBE + "; print(nki is tn, tn.provider())", cwd=tmp_path)
    assert out.splitlines() == ["False", "True True", "True False torch_neuronx.nki.language torch_neuronx.nki.isa",
                                "True torch_neuronx"]


def test_aws_package_wins_when_installed(tmp_path: Path) -> None:
    aws = fake_aws_nki(tmp_path / "aws")
    assert run(PROBE, [aws], cwd=tmp_path).startswith("False True nki.language nki.isa")
    # even with this project's directory ahead of it on the path, the shim steps aside
    assert run(PROBE, [SRC, aws], cwd=tmp_path).startswith("False True nki.language")


def test_same_site_packages_prefers_the_package_directory(tmp_path: Path) -> None:
    site = fake_aws_nki(tmp_path / "site")
    shutil.copy(SHIM, site / "nki.py")  # both installed side by side: Python picks the package, not nki.py
    assert run(PROBE, [site], cwd=tmp_path).startswith("False True")


def test_a_second_checkouts_router_is_not_taken_for_aws_package(tmp_path: Path) -> None:
    """Two checkouts on the path (a CI clone beside a development tree): each router skips the other's copy of
    itself, in either order, instead of loading it and recursing without end; the interpreter is what they give."""
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(SHIM, other / "nki.py")
    for order in ([other, SRC], [SRC, other]):
        assert run(PROBE, order).split()[:2] == ["True", "False"]
