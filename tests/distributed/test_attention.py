"""Context parallelism on neuron ranks against the unsharded attention: output and gradients, 2 and 4 ranks.

See job_attention.py for the checks; each test reports one check of one job.
"""

from __future__ import annotations

from pathlib import Path

import job_attention
import pytest

from torch_neuronx.testing.jobs import Outcomes, assert_passed, run_job

HERE = Path(__file__).resolve().parent
JOBS: dict[int, Outcomes] = {}


@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"{w}ranks")
def job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Outcomes, int]:
    world = request.param
    return run_job(HERE / "job_attention.py", world, Path(tmp_path_factory.mktemp(f"cp{world}")), timeout=300), world


@pytest.mark.parametrize("name", job_attention.checks.names)
def test_context_parallel(job: tuple[Outcomes, int], name: str) -> None:
    assert_passed(job[0], name, job[1])
