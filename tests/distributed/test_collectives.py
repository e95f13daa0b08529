"""Every collective on the neuron backend against a reference computed locally, plus the 1-D mesh and DTensor.

One 2-rank job runs all the checks (see job_collectives.py); each test reports one.
"""

from __future__ import annotations

from pathlib import Path

import job_collectives
import pytest

from torch_neuronx.testing.jobs import Outcomes, assert_passed, run_job

WORLD = 2


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Outcomes:
    return run_job(Path(__file__).parent / "job_collectives.py", WORLD, Path(tmp_path_factory.mktemp("collectives")))


@pytest.mark.parametrize("name", job_collectives.checks.names)
def test_collective(outcomes: Outcomes, name: str) -> None:
    assert_passed(outcomes, name, WORLD)
