"""Rank side of test_launch.py, started by torchrun: one node with 4 workers, or 2 nodes with 1 each.

4 workers: the 2-D mesh (dp x tp), DTensor on it, and TP x FSDP training.
2 nodes: FSDP2 training across the two agents. Both: the worker binds
neuron:LOCAL_RANK, and a mesh that does not fit the launch is refused.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from _models import make_model, tp_plan
from _training import assert_same_training, full_params, reference_fp32, train
from torch.testing import assert_close

import torch_neuronx.distributed as nd
from torch_neuronx.testing.jobs import Checks

checks = Checks()
RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
STEPS = 3


def only(name: str) -> bool:
    """Which checks a launch runs: mesh2d_* need 4 workers, across_nodes_* two."""
    if name.startswith("mesh2d_"):
        return WORLD == 4
    if name.startswith("across_nodes_"):
        return WORLD == 2
    return True


def dev() -> torch.device:
    return torch.device("neuron", torch.neuron.current_device())


@checks
def worker_binds_local_rank() -> str:
    assert "TORCHELASTIC_RUN_ID" in os.environ, "not started by torchrun"
    t = torch.ones(2, device="neuron")
    assert t.device == torch.device("neuron", LOCAL_RANK), t.device
    assert torch.neuron.current_device() == LOCAL_RANK
    return f"rank {RANK} local rank {LOCAL_RANK} on {t.device}"


@checks
def init_mesh_refuses_wrong_process_count() -> str:
    messages = []
    for shape in ((WORLD + 1,), (2, WORLD)):
        try:
            nd.init_mesh(shape)
        except ValueError as e:
            messages.append(str(e))
            assert f"needs {torch.Size(shape).numel()} processes" in str(e), e
            assert f"{WORLD} were launched" in str(e), e
        else:
            raise AssertionError(f"init_mesh{shape} accepted {WORLD} processes")
    return " | ".join(messages)


@checks
def all_reduce_over_the_launch() -> None:
    t = torch.full((3,), float(RANK + 1), device=dev())
    dist.all_reduce(t)
    assert_close(t.cpu(), torch.full((3,), WORLD * (WORLD + 1) / 2))


@checks
def across_nodes_fsdp2_training() -> str:
    from torch.distributed.fsdp import fully_shard

    mesh = nd.init_mesh((WORLD,), ("dp",))
    model = make_model().to(dev())
    for block in model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)

    def average(t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        return t

    losses, _ = train(model, STEPS, RANK, dev(), average)
    return assert_same_training((losses, full_params(model)), reference_fp32(STEPS, WORLD), 1e-5, 1e-4)


def mesh_2d():  # type: ignore[no-untyped-def]
    return nd.init_mesh((2, 2), ("dp", "tp"))


@checks
def mesh2d_named_dims() -> str:
    mesh = mesh_2d()
    dp, tp = mesh.get_local_rank("dp"), mesh.get_local_rank("tp")
    assert (dp, tp) == divmod(RANK, 2), (dp, tp)
    assert mesh["tp"].mesh.tolist() == [2 * dp, 2 * dp + 1], mesh["tp"].mesh
    assert mesh["dp"].mesh.tolist() == [tp, tp + 2], mesh["dp"].mesh
    for name, peers in (("tp", [2 * dp, 2 * dp + 1]), ("dp", [tp, tp + 2])):
        group = mesh.get_group(name)
        assert dist.get_backend(group) == "neuron"
        t = torch.full((2,), float(RANK), device=dev())
        dist.all_reduce(t, group=group)
        assert_close(t.cpu(), torch.full((2,), float(sum(peers))))
    return str(mesh)


@checks
def mesh2d_dtensor() -> None:
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    mesh = mesh_2d()
    dp, tp = mesh.get_local_rank("dp"), mesh.get_local_rank("tp")
    big = torch.arange(48.0).reshape(4, 12)
    d = distribute_tensor(big.to(dev()), mesh, [Shard(0), Shard(1)])
    assert torch.equal(d.to_local().cpu(), big.chunk(2, 0)[dp].chunk(2, 1)[tp])
    assert torch.equal(d.full_tensor().cpu(), big)
    r = d.redistribute(mesh, [Replicate(), Shard(0)])
    assert torch.equal(r.to_local().cpu(), big.chunk(2, 0)[tp])
    # a partial sum over tp, replicated over dp
    local = torch.full((2, 3), float(tp + 1), device=dev())
    p = DTensor.from_local(local, mesh, [Replicate(), Partial()])
    assert torch.equal(p.full_tensor().cpu(), torch.full((2, 3), 3.0))
    assert torch.equal((d @ d.T.redistribute(mesh, [Replicate(), Replicate()])).full_tensor().cpu(), big @ big.T)


@checks
def mesh2d_tp_fsdp_training() -> str:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = mesh_2d()
    model = parallelize_module(make_model().to(dev()), mesh["tp"], tp_plan(make_model()))
    for block in model.layers:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    dp_group = mesh.get_group("dp")

    def average(t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t, op=dist.ReduceOp.AVG, group=dp_group)
        return t

    # the two tp ranks of a dp rank see the same part of the batch
    losses, _ = train(model, STEPS, mesh.get_local_rank("dp"), dev(), average)
    placements = {str(p.placements) for p in model.parameters()}
    detail = assert_same_training((losses, full_params(model)), reference_fp32(STEPS, 2), 1e-5, 1e-4)
    return f"{detail}; placements {sorted(placements)}"



@checks
def group_made_again_after_destroy() -> str:
    """Last (it remakes the world group): destroy_process_group() then init_process_group() again, three times,
    each world with a subgroup whose members change from one world to the next (rank 0 alone, then every rank:
    c10d gives both the name "1") and a mesh. c10d reuses the group names and torchrun's store keeps the old groups'
    Gloo addresses: before each world had its own keys, about one launch in two failed ("Connection refused") or
    hung here, as plain "gloo" still does; with a count per group name, the changing subgroup hung (review rv32j)."""
    sums = []
    for phase in range(3):
        dist.destroy_process_group()
        dist.init_process_group("neuron")
        t = torch.full((2,), float(RANK + 1), device=dev())
        dist.all_reduce(t)
        assert_close(t.cpu(), torch.full((2,), WORLD * (WORLD + 1) / 2))
        members = [0] if phase % 2 == 0 else list(range(WORLD))
        sub = dist.new_group(members)  # every rank calls new_group; only members make its backend
        if RANK in members:
            v = torch.ones(2, device=dev())
            dist.all_reduce(v, group=sub)
            assert_close(v.cpu(), torch.full((2,), float(len(members))))
        mesh = mesh_2d() if WORLD == 4 else nd.init_mesh((WORLD,), ("dp",))  # 4 workers: subgroups made again
        u = torch.full((2,), 1.0, device=dev())
        dist.all_reduce(u, group=mesh.get_group(mesh.mesh_dim_names[-1]))
        assert_close(u.cpu(), torch.full((2,), float(mesh.size(-1))))
        sums.append(t[0].item())
    return f"world sums after each re-init: {sums}"

if __name__ == "__main__":
    checks.main(setup=lambda: dist.init_process_group("neuron"), teardown=dist.destroy_process_group, only=only)
