"""The CI slice of the OpInfo conformance run: neuron must match CPU.

Runs in worker processes, so that a crash of the C++ core fails this test
with the op that crashed instead of taking pytest down. The full op_db run is
``python scripts/conformance.py``.
"""

from __future__ import annotations

import pytest
import torch

from torch_neuronx.testing import conformance as h

MIN_PASS_RATE = 0.99
EXPECTED = h.EXPECTED_FAILURES


@pytest.fixture(scope="module")
def ci_run() -> tuple[h.Report, h.Verdict]:
    h.import_device()
    table = h.op_table()
    units = h.units_for([table[n] for n in h.CI_SUBSET])
    report = h.run_in_subprocesses(units, chunk_ops=len(h.CI_SUBSET), threads=1)
    verdict = h.judge(report, h.load_expected(EXPECTED), MIN_PASS_RATE, ran=[f"{n}/{d}" for n, d in units])
    return report, verdict


def test_ci_subset_covers_every_op(ci_run: tuple[h.Report, h.Verdict]) -> None:
    report, _ = ci_run
    assert not report.notes, report.notes
    assert report.compared > 1000, report.summary()  # a run that compared nothing proves nothing


def test_ci_subset_has_no_regressions(ci_run: tuple[h.Report, h.Verdict]) -> None:
    _, verdict = ci_run
    lines = [f.describe() for f in verdict.regressions[:30]]
    assert not verdict.regressions, f"{len(verdict.regressions)} unexpected failures:\n" + "\n".join(lines)


def test_ci_subset_pass_rate(ci_run: tuple[h.Report, h.Verdict]) -> None:
    report, _ = ci_run
    assert report.pass_rate >= MIN_PASS_RATE, (
        f"pass rate {report.pass_rate:.4%} < {MIN_PASS_RATE:.0%}: {report.summary()}"
    )


class _FakeOp:
    """Just enough of an OpInfo for run_sample: a deliberately wrong device result."""

    full_name = "fake_sin"
    has_nondeterministic_output = False

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.sin() if x.device.type == "cpu" else x.sin() + 1e-3

    def __init__(self) -> None:
        self.op = self


def test_harness_reports_a_wrong_device_result() -> None:
    from torch.testing._internal.opinfo.core import SampleInput

    h.import_device()
    sample = SampleInput(torch.randn(4, 5))
    outcome = h.run_sample(_FakeOp(), sample, torch.float32, 0, with_grad=False, tol=None)
    assert outcome.status == h.FAIL and outcome.category == "mismatch", outcome
    assert outcome.max_abs_diff is not None and 5e-4 < outcome.max_abs_diff < 2e-3


def test_harness_skips_samples_that_fail_on_cpu() -> None:
    from torch.testing._internal.opinfo.core import SampleInput

    h.import_device()
    sample = SampleInput(torch.randn(4, 5), args=(torch.randn(3),))  # shapes that cannot broadcast
    outcome = h.run_sample(type("Add", (), {"full_name": "add", "__call__": lambda self, a, b: a + b})(),
                           sample, torch.float32, 0, with_grad=False, tol=None)
    assert outcome.status == h.CPU_FAIL, outcome
