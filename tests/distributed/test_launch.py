"""Launching: torchrun on one node (4 workers, 2 x 2 mesh) and on two nodes, device binding, mesh checks,
and init_process_group() with no backend.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import job_torchrun
import pytest

from torch_neuronx.testing.jobs import Outcomes, assert_passed, collect
from torch_neuronx.testing.workers import BASE_ENV, free_port, run_processes, torchrun_argv

HERE = Path(__file__).resolve().parent

SCRIPT = str(HERE / "job_torchrun.py")


def names_for(world: int) -> list[str]:
    return [n for n in job_torchrun.checks.names
            if not (n.startswith("mesh2d_") and world != 4) and not (n.startswith("across_nodes_") and world != 2)]


@pytest.fixture(scope="module")
def one_node(tmp_path_factory: pytest.TempPathFactory) -> Outcomes:
    work = Path(tmp_path_factory.mktemp("torchrun1"))
    out = work / "out"
    out.mkdir()
    argv = torchrun_argv("--standalone", "--nproc-per-node", "4", SCRIPT, "--out", str(out))
    return collect(run_processes([(argv, {})], work, timeout=180), out, 4)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Outcomes:
    work = Path(tmp_path_factory.mktemp("torchrun2"))
    out = work / "out"
    out.mkdir()
    # two agents on loopback meet at a c10d rendezvous, as two hosts would
    argv = torchrun_argv("--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                         "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "two-nodes",
                         SCRIPT, "--out", str(out))
    return collect(run_processes([(argv, {}), (argv, {})], work, timeout=180), out, 2)


@pytest.mark.parametrize("name", names_for(4))
def test_torchrun_one_node_four_workers(one_node: Outcomes, name: str) -> None:
    assert_passed(one_node, name, 4)


@pytest.mark.parametrize("name", names_for(2))
def test_torchrun_two_nodes(two_nodes: Outcomes, name: str) -> None:
    assert_passed(two_nodes, name, 2)


def test_no_backend_picks_neuron_quietly() -> None:
    code = (
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group()\n"
        "t, c = torch.ones(2, device='neuron'), torch.ones(2)\n"
        "dist.all_reduce(t); dist.all_reduce(c)\n"
        "print(dist.get_backend(), dist.get_backend_config())\n"
        "dist.destroy_process_group()\n"
    )
    env = {**BASE_ENV, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["neuron", "cpu:neuron,neuron:neuron"], r.stdout
    # no "Overriding ..." nor any other warning from registering the backend or making the group
    assert r.stderr == "", r.stderr


INIT_MESH = r"""
import torch, torch.distributed as dist
import torch_neuronx.distributed as nd
dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
mesh = nd.init_mesh((1,), ("dp",))
assert mesh.device_type == "neuron" and mesh.mesh_dim_names == ("dp",)
for shape, names, message in (((2, 2), ("dp", "tp"), "mesh 2 x 2 needs 4 processes, but 1 were launched"),
                              ((1, 1), ("dp",), "has 2 dims but 1 names")):
    try:
        nd.init_mesh(shape, names)
    except ValueError as e:
        assert message in str(e), e
    else:
        raise AssertionError(f"init_mesh{shape} was accepted")
t = torch.ones(2, device="neuron")
dist.all_reduce(t, group=mesh.get_group())
print(t.tolist())
dist.destroy_process_group()
"""


def test_init_mesh_checks_the_process_count() -> None:
    # In its own process: a process group binds its process to one core for good (TorchNeuron's model).
    r = subprocess.run([sys.executable, "-c", INIT_MESH], env=BASE_ENV, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[-2] == "[1.0, 1.0]", r.stdout


GROWING_WORLD = r"""
import sys, torch, torch.distributed as dist
rank, port = int(sys.argv[1]), int(sys.argv[2])
store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=__import__("datetime").timedelta(seconds=60))
if rank == 0:  # a world of rank 0 alone first, on the same store
    dist.init_process_group("neuron", store=store, rank=0, world_size=1)
    t = torch.ones(2, device="neuron"); dist.all_reduce(t); assert t.tolist() == [1.0, 1.0], t
    dist.destroy_process_group()
    store.set("alone_done", "1")
else:
    store.wait(["alone_done"])
dist.init_process_group("neuron", store=store, rank=rank, world_size=2)
t = torch.ones(2, device="neuron"); dist.all_reduce(t)
g = dist.new_group([0, 1], use_local_synchronization=True)  # made, destroyed and made again under one hashed name
dist.destroy_process_group(g)
g = dist.new_group([0, 1], use_local_synchronization=True)
u = torch.ones(2, device="neuron"); dist.all_reduce(u, group=g)
print(t.tolist(), u.tolist())
dist.destroy_process_group()
"""


def test_a_store_that_outlives_its_worlds(tmp_path: Path) -> None:
    """Review rvd1: one user TCPStore, a world of rank 0 alone and then one of two ranks (a count of the worlds
    each rank made would differ: rank 0 waited for keys rank 1 never wrote), and a subgroup destroyed and made
    again inside one world (c10d gives it the same hashed name: 'Connection reset' or a hang before)."""
    port = free_port()
    procs = run_processes([([sys.executable, "-c", GROWING_WORLD, str(r), str(port)], {}) for r in (0, 1)],
                          tmp_path, timeout=150, fail_fast=True)
    for p in procs:
        assert p.rc == 0, p.log()
        assert p.out.split("\n")[-2] == "[2.0, 2.0] [2.0, 2.0]", p.log()
