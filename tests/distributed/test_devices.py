"""TorchNeuron's per-rank device model (its distributed backend's ``_neuron_runtime_setup`` and
``NeuronDevice.cpp``): what a process sees before and after ``init_process_group("neuron")``.

A 2-rank job checks the model itself (job_devices.py); single processes
check the conditions that make ``init_process_group`` fail, as on a
Trainium instance, and the branch without torchrun's LOCAL_* variables.
"""

from __future__ import annotations

import sys
from pathlib import Path

import job_devices
import pytest

from torch_neuronx.testing.jobs import Outcomes, assert_passed, run_job
from torch_neuronx.testing.workers import free_port, run_processes

WORLD = 2


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Outcomes:
    # a 1 MB bucket: the job's large all-gathers and reduce-scatters run in pieces (TorchNeuron's bucketing)
    return run_job(Path(__file__).parent / "job_devices.py", WORLD, Path(tmp_path_factory.mktemp("devices")),
                   env={"COLLECTIVE_BUCKETSIZE_IN_MB": "1"})


@pytest.mark.parametrize("name", job_devices.checks.names)
def test_device_model(outcomes: Outcomes, name: str) -> None:
    assert_passed(outcomes, name, WORLD)


_INIT = "import torch, torch.distributed as dist\n"
_GROUP = "dist.init_process_group('neuron', store=dist.HashStore(), rank=0, world_size=1)\n"
# name -> (extra environment, code, what it must print or the error it must end with)
CASES: dict[str, tuple[dict[str, str], str, str]] = {
    # the runtime started before the process group: TorchNeuron's backend asserts
    "device_used_first": ({}, _INIT + "torch.ones(1, device='neuron')\n" + _GROUP,
                          "AssertionError: Neuron runtime should not be initialized before the init_process_group"),
    # a user-set NEURON_RT_VISIBLE_CORES is kept, and must name one core
    "two_visible_cores": ({"NEURON_RT_VISIBLE_CORES": "0-1"}, _INIT + _GROUP,
                          "AssertionError: Attempted to have more than one device per process in distributed setup"),
    "user_core_kept": ({"NEURON_RT_VISIBLE_CORES": "5", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"},
                       _INIT + _GROUP + "import os\np = torch.neuron.get_device_properties()\n"
                       "print(os.environ['NEURON_RT_VISIBLE_CORES'], torch.neuron.device_count(), "
                       "torch.neuron.current_device(), p.logical_core_id)\n",
                       "5 1 0 5"),
    # no LOCAL_RANK / LOCAL_WORLD_SIZE: the ranks on this host are counted through the store
    "no_torchrun_variables": ({}, _INIT + _GROUP + "import os\nprint(os.environ['NEURON_RT_VISIBLE_CORES'], "
                              "torch.neuron.device_count(), torch.ones(1, device='neuron').device)\n",
                              "0 1 neuron:0"),
    # more local ranks than the instance has cores
    "too_many_local_ranks": ({"TORCH_NEURONX_INSTANCE_TYPE": "trn1.2xlarge", "LOCAL_RANK": "2",
                              "LOCAL_WORLD_SIZE": "3"}, _INIT + _GROUP,
                             "names core 2, but the instance has only 2 logical NeuronCores (0-1) (local rank 2 of 3"),
    # no process group: every visible core, as before
    "single_process_multi_core": ({}, _INIT + "a = torch.ones(1, device='neuron:5')\n"
                                  "print(torch.neuron.device_count(), a.device)\n", "64 neuron:5"),
}


def test_conditions_of_init_process_group(tmp_path: Path) -> None:
    procs = run_processes([([sys.executable, "-c", code], {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                                                           **env})
                           for env, code, _ in CASES.values()], tmp_path, timeout=180)
    for (name, (_, _, expected)), p in zip(CASES.items(), procs, strict=True):
        if expected.startswith(("AssertionError", "names core")):
            assert p.rc != 0, (name, p.log())
            assert expected in p.err, (name, p.log())
            assert "Traceback" in p.err and "Fatal" not in p.err, (name, p.log())
        else:
            assert p.rc == 0, (name, p.log())
            assert p.out.split() == expected.split(), (name, p.log())
