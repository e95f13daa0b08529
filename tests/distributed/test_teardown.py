"""A neuron process group torn down while Gloo finishes a collective must not deadlock (see job_teardown.py).

One 2-rank job repeats the teardown for each way the last reference can go; each test reports one.
"""

from __future__ import annotations

from pathlib import Path

import job_teardown
import pytest

from torch_neuronx.testing.jobs import Outcomes, assert_passed, run_job

WORLD = 2


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Outcomes:
    return run_job(Path(__file__).parent / "job_teardown.py", WORLD, Path(tmp_path_factory.mktemp("teardown")))


@pytest.mark.parametrize("name", job_teardown.checks.names)
def test_teardown(outcomes: Outcomes, name: str) -> None:
    assert_passed(outcomes, name, WORLD)
