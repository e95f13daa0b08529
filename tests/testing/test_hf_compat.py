"""The CI subset of the Hugging Face compatibility report: every architecture that runs on CPU matches on neuron."""

from __future__ import annotations

import pytest

from torch_neuronx.testing.hf_compat import configs, report

COMPILED_IN_TEST = {"llama", "gpt2", "bloom"}


@pytest.fixture(scope="module")
def ci_rows() -> tuple[list[dict], bool]:
    # "auto": the worker, a fresh interpreter, compiles if `import torch` registered the backend (it does).
    # A cold compile costs 20-40 s per architecture on a 2-core runner, so the
    # test compiles three position schemes (RoPE+GQA, learned, ALiBi); the
    # script's `--subset ci` compiles all ten.
    return report.run_report(configs.CI_SUBSET, compiled_mode="auto", timeout=300,
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
