"""FSDP2, tensor parallelism and checkpoints on 2 neuron ranks against single-process training.

One 2-rank job runs the checks (see job_training.py); each test reports one.
The full state dict it saves must load in a fresh process without torch_neuronx.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import job_training
import pytest

from torch_neuronx.testing.jobs import Outcomes, assert_passed, run_job
from torch_neuronx.testing.workers import BASE_ENV

HERE = Path(__file__).resolve().parent

WORLD = 2


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Outcomes, Path]:
    work = Path(tmp_path_factory.mktemp("training"))
    return run_job(HERE / "job_training.py", WORLD, work), work / "out"


@pytest.mark.parametrize("name", job_training.checks.names)
def test_training(job: tuple[Outcomes, Path], name: str) -> None:
    assert_passed(job[0], name, WORLD)


LOAD_ON_PLAIN_CPU = """
import sys
import torch
sys.path.insert(0, sys.argv[1])
from _models import TinyTransformer
model = TinyTransformer()
model.load_state_dict(torch.load(sys.argv[2], weights_only=True))  # strict: every key, every shape
expected = torch.load(sys.argv[3], weights_only=True)
torch.testing.assert_close(model(expected["ids"]), expected["logits"], atol=1e-5, rtol=1e-5)
print("torch_neuronx" in sys.modules, hasattr(torch, "neuron"))
"""


def test_full_state_dict_loads_without_torch_neuronx(job: tuple[Outcomes, Path]) -> None:
    assert_passed(job[0], "full_state_dict_for_plain_cpu", WORLD)
    out = job[1]
    r = subprocess.run(
        [sys.executable, "-c", LOAD_ON_PLAIN_CPU, str(HERE), str(out / "full_state.pt"), str(out / "expected.pt")],
        env={**BASE_ENV, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False"], r.stdout
