"""The CI subset of scripts/hf_compat_report.py: every architecture that runs on CPU matches on neuron."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "hf_compat_report.py"
COMPILED_IN_TEST = {"llama", "gpt2", "bloom"}


def _load_report() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hf_compat_report", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ci_rows() -> tuple[list[dict], bool]:
    report = _load_report()
    # "auto": the worker, a fresh interpreter, compiles if `import torch` registered the backend (it does).
    # A cold compile costs 20-40 s per architecture on a 2-core runner, so the
    # test compiles three position schemes (RoPE+GQA, learned, ALiBi); the
    # script's `--subset ci` compiles all ten.
    return report.run_report(report.CI_SUBSET, compiled_mode="auto", timeout=300,
                             compile_only=COMPILED_IN_TEST)


def test_ci_subset_builds_on_cpu(ci_rows: tuple[list[dict], bool]) -> None:
    rows, _ = ci_rows
    broken = {r["architecture"]: r["failure"] for r in rows if not r["cpu_ok"]}
    assert not broken, f"tiny configs of the CI subset must build and run on CPU: {broken}"


def test_ci_subset_eager_matches_cpu(ci_rows: tuple[list[dict], bool]) -> None:
    rows, _ = ci_rows
    failed = {r["architecture"]: f"{r['category']}: {r['failure']}" for r in rows
              if r["cpu_ok"] and not r["eager_pass"]}
    assert not failed, failed
    assert all(r["peak_mib"] and r["peak_mib"] > 0 for r in rows if r["cpu_ok"])


def test_ci_subset_compiled_matches_cpu(ci_rows: tuple[list[dict], bool]) -> None:
    rows, compiled = ci_rows
    assert compiled
    failed = {r["architecture"]: f"{r['category']}: {r['failure']}" for r in rows
              if r["cpu_ok"] and not r["compiled_pass"] and r["architecture"] in COMPILED_IN_TEST}
    assert not failed, failed
