"""Rank side of test_collectives.py: every collective, the 1-D mesh and DTensor, on the neuron backend.

Each rank can make every rank's input, so the reference is computed locally
with plain tensor ops; the collective's result must equal it.
"""

from __future__ import annotations

import os
import warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.testing import assert_close

import torch_neuronx.distributed as nd
from torch_neuronx.testing.jobs import Checks

checks = Checks()
RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "2"))
SHAPE = (4, 6)  # the first dim divides by the world size: scatter-style collectives split it


def dev() -> torch.device:
    return torch.device("neuron", torch.neuron.current_device())


def data(rank: int, shape: tuple[int, ...] = SHAPE, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + rank)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-5, 6, shape, generator=g, dtype=dtype)


def mine(shape: tuple[int, ...] = SHAPE, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return data(RANK, shape, dtype).to(dev())


def every(shape: tuple[int, ...] = SHAPE, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    return [data(r, shape, dtype) for r in range(WORLD)]


def same(got: torch.Tensor, want: torch.Tensor, exact: bool = False) -> None:
    assert got.device.type == "neuron" or want.device.type == "cpu", got.device
    if exact:
        assert torch.equal(got.cpu(), want.cpu()), f"{got.cpu()}\n!=\n{want.cpu()}"
    else:
        assert_close(got.cpu(), want.cpu())


REDUCE = {
    "sum": lambda ts: torch.stack(ts).sum(0),
    "avg": lambda ts: torch.stack(ts).sum(0) / len(ts),
    "max": lambda ts: torch.stack(ts).amax(0),
    "min": lambda ts: torch.stack(ts).amin(0),
    "product": lambda ts: torch.stack(ts).prod(0),
}
OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX,
       "min": dist.ReduceOp.MIN, "product": dist.ReduceOp.PRODUCT}


# ---------------------------------------------------------------- process group


@checks
def default_backend_is_neuron() -> str:
    # the job called init_process_group() with no backend
    assert dist.get_backend() == "neuron", dist.get_backend()
    assert torch.neuron.current_device() == int(os.environ["LOCAL_RANK"]), torch.neuron.current_device()
    return f"{dist.get_backend()} neuron:{torch.neuron.current_device()}"


def _all_reduce(op: str, dtype: torch.dtype) -> None:
    t = mine(dtype=dtype)
    dist.all_reduce(t, op=OPS[op])
    same(t, REDUCE[op](every(dtype=dtype)).to(dtype), exact=op in ("max", "min") or not dtype.is_floating_point)


@checks
def all_reduce_sum() -> None:
    _all_reduce("sum", torch.float32)
    _all_reduce("sum", torch.int64)


@checks
def all_reduce_avg() -> None:
    _all_reduce("avg", torch.float32)


@checks
def all_reduce_max() -> None:
    _all_reduce("max", torch.float32)
    _all_reduce("max", torch.int32)


@checks
def all_reduce_min() -> None:
    _all_reduce("min", torch.float32)
    _all_reduce("min", torch.int32)


@checks
def all_reduce_product() -> None:
    _all_reduce("product", torch.float32)
    _all_reduce("product", torch.int64)


@checks
def all_reduce_bf16() -> None:
    t = mine(dtype=torch.bfloat16)
    dist.all_reduce(t)
    want = every(dtype=torch.bfloat16)[0]
    for other in every(dtype=torch.bfloat16)[1:]:
        want = want + other  # the same bf16 rounding, pair by pair
    same(t, want, exact=WORLD == 2)


@checks
def all_reduce_view_with_offset() -> None:
    # FSDP reduces views into flat buffers: the offset must be honoured and the rest untouched
    buf = torch.full((30,), -7.0, device=dev())
    view = buf[3:27].view(SHAPE)
    view.copy_(mine())
    dist.all_reduce(view)
    same(view, REDUCE["sum"](every()))
    same(buf[:3], torch.full((3,), -7.0), exact=True)
    same(buf[27:], torch.full((3,), -7.0), exact=True)


@checks
def all_reduce_async() -> None:
    t = mine()
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    same(t, REDUCE["sum"](every()))


@checks
def broadcast() -> None:
    for src in range(WORLD):
        t = mine()
        dist.broadcast(t, src=src)
        same(t, data(src), exact=True)


@checks
def all_gather() -> None:
    out = [torch.empty(SHAPE, device=dev()) for _ in range(WORLD)]
    dist.all_gather(out, mine())
    for got, want in zip(out, every(), strict=True):
        same(got, want, exact=True)


@checks
def all_gather_into_tensor() -> None:
    flat = torch.empty((WORLD * SHAPE[0], SHAPE[1]), device=dev())
    dist.all_gather_into_tensor(flat, mine())
    same(flat, torch.cat(every()), exact=True)
    stacked = torch.empty((WORLD, *SHAPE), device=dev())  # the layout NCCL also takes
    dist.all_gather_into_tensor(stacked, mine())
    same(stacked, torch.stack(every()), exact=True)


@checks
def reduce_scatter_tensor() -> None:
    for op in ("sum", "avg", "max"):
        out = torch.empty((SHAPE[0] // WORLD, SHAPE[1]), device=dev())
        dist.reduce_scatter_tensor(out, mine(), op=OPS[op])
        same(out, REDUCE[op](every()).chunk(WORLD)[RANK])
    out = torch.empty(SHAPE, device=dev())
    dist.reduce_scatter_tensor(out, torch.stack([mine() * (j + 1) for j in range(WORLD)]))  # stacked input
    same(out, REDUCE["sum"](every()) * (RANK + 1))


@checks
def reduce_scatter_list() -> None:
    out = torch.empty(SHAPE, device=dev())
    inputs = [data(10 * RANK + j).to(dev()) for j in range(WORLD)]
    dist.reduce_scatter(out, inputs)
    same(out, REDUCE["sum"]([data(10 * r + RANK) for r in range(WORLD)]))


@checks
def premul_sum() -> None:
    make = dist._make_nccl_premul_sum  # what FSDP2 uses for gradient_divide_factor
    t = mine()
    dist.all_reduce(t, op=make(0.25))
    same(t, REDUCE["sum"](every()) * 0.25)
    t = mine()
    dist.all_reduce(t, op=make(torch.tensor(0.5, device=dev())))
    same(t, REDUCE["sum"](every()) * 0.5)
    x = mine()
    out = torch.empty((SHAPE[0] // WORLD, SHAPE[1]), device=dev())
    dist.reduce_scatter_tensor(out, x, op=make(1 / 3))
    same(out, (REDUCE["sum"](every()) / 3).chunk(WORLD)[RANK])
    same(x, data(RANK), exact=True)  # the input is the caller's: not scaled in place
    out = torch.empty(SHAPE, device=dev())
    dist.reduce_scatter(out, [data(10 * RANK + j).to(dev()) for j in range(WORLD)], op=make(2.0))
    same(out, REDUCE["sum"]([data(10 * r + RANK) for r in range(WORLD)]) * 2.0)


@checks
def all_to_all_single() -> None:
    out = torch.empty(SHAPE, device=dev())
    dist.all_to_all_single(out, mine())
    same(out, torch.cat([x.chunk(WORLD)[RANK] for x in every()]), exact=True)
    # uneven splits: rank r sends r + j + 1 rows to rank j
    rows = [[r + j + 1 for j in range(WORLD)] for r in range(WORLD)]
    inputs = [data(r, (sum(rows[r]), 3)) for r in range(WORLD)]
    out = torch.empty((sum(rows[r][RANK] for r in range(WORLD)), 3), device=dev())
    dist.all_to_all_single(out, inputs[RANK].to(dev()), [rows[r][RANK] for r in range(WORLD)], rows[RANK])
    same(out, torch.cat([inputs[r].split(rows[r])[RANK] for r in range(WORLD)]), exact=True)


@checks
def all_to_all() -> None:
    out = [torch.empty((1, SHAPE[1]), device=dev()) for _ in range(WORLD)]
    dist.all_to_all(out, list(mine()[:WORLD].split(1)))
    for r, got in enumerate(out):
        same(got, data(r)[RANK : RANK + 1], exact=True)


@checks
def reduce() -> None:
    for dst in range(WORLD):
        t = mine()
        dist.reduce(t, dst=dst, op=dist.ReduceOp.MAX)
        if RANK == dst:
            same(t, REDUCE["max"](every()), exact=True)


@checks
def gather() -> None:
    dst = WORLD - 1
    out = [torch.empty(SHAPE, device=dev()) for _ in range(WORLD)] if RANK == dst else None
    dist.gather(mine(), out, dst=dst)
    if out is not None:
        for got, want in zip(out, every(), strict=True):
            same(got, want, exact=True)


@checks
def scatter() -> None:
    src = WORLD - 1
    out = torch.empty(SHAPE, device=dev())
    dist.scatter(out, [data(50 + r).to(dev()) for r in range(WORLD)] if RANK == src else None, src=src)
    same(out, data(50 + RANK), exact=True)


@checks
def barrier() -> None:
    dist.barrier()
    dist.barrier(device_ids=[torch.neuron.current_device()])


@checks
def send_recv() -> None:
    peer = (RANK + 1) % WORLD
    prev = (RANK - 1) % WORLD
    if RANK % 2 == 0:
        dist.send(mine(), peer)
        got = torch.empty(SHAPE, device=dev())
        dist.recv(got, prev)
    else:
        got = torch.empty(SHAPE, device=dev())
        dist.recv(got, prev)
        dist.send(mine(), peer)
    same(got, data(prev), exact=True)
    got = torch.empty(SHAPE, device=dev())
    ops = [dist.P2POp(dist.isend, mine(), peer), dist.P2POp(dist.irecv, got, prev)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    same(got, data(prev), exact=True)


@checks
def coalesced() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated in favour of the coalescing manager
        ts = [mine(), mine((5,)) * 2]
        dist.all_reduce_coalesced(ts)
    same(ts[0], REDUCE["sum"](every()))
    same(ts[1], REDUCE["sum"](every((5,))) * 2)
    ts = [mine(), mine((5,)) * 2]
    with dist._coalescing_manager(async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    cm.wait()
    same(ts[0], REDUCE["sum"](every()))
    same(ts[1], REDUCE["sum"](every((5,))) * 2)
    gathered = [torch.empty((WORLD * SHAPE[0], SHAPE[1]), device=dev()) for _ in range(2)]
    with dist._coalescing_manager():
        dist.all_gather_into_tensor(gathered[0], mine())
        dist.all_gather_into_tensor(gathered[1], mine() * 3)
    same(gathered[0], torch.cat(every()), exact=True)
    same(gathered[1], torch.cat(every()) * 3)
    scattered = [torch.empty((SHAPE[0] // WORLD, SHAPE[1]), device=dev()) for _ in range(2)]
    with dist._coalescing_manager():  # one op for the batch: torch takes the first op's
        dist.reduce_scatter_tensor(scattered[0], mine(), op=dist._make_nccl_premul_sum(0.5))
        dist.reduce_scatter_tensor(scattered[1], mine() * 3, op=dist._make_nccl_premul_sum(0.5))
    same(scattered[0], (REDUCE["sum"](every()) * 0.5).chunk(WORLD)[RANK])
    same(scattered[1], (REDUCE["sum"](every()) * 1.5).chunk(WORLD)[RANK])


@checks
def functional_collectives() -> None:
    group = dist.group.WORLD
    got = funcol.all_reduce(mine(), "sum", group)
    same(funcol.wait_tensor(got), REDUCE["sum"](every()))
    got = funcol.all_gather_tensor(mine(), 0, group)
    same(funcol.wait_tensor(got), torch.cat(every()), exact=True)
    got = funcol.reduce_scatter_tensor(mine(), "avg", 0, group)
    same(funcol.wait_tensor(got), REDUCE["avg"](every()).chunk(WORLD)[RANK])
    split = [SHAPE[0] // WORLD] * WORLD
    got = funcol.all_to_all_single(mine(), split, split, group)
    same(funcol.wait_tensor(got), torch.cat([x.chunk(WORLD)[RANK] for x in every()]), exact=True)
    got = funcol.broadcast(mine(), WORLD - 1, group)
    same(funcol.wait_tensor(got), data(WORLD - 1), exact=True)
    gots = funcol.all_reduce_coalesced([mine(), mine() * 2], "max", group)
    same(funcol.wait_tensor(gots[0]), REDUCE["max"](every()))
    same(funcol.wait_tensor(gots[1]), REDUCE["max"](every()) * 2)
    # the autograd variant: the gradient of an all-gather is a reduce-scatter
    x = mine().requires_grad_()
    y = funcol.all_gather_tensor_autograd(x, 0, group)
    (funcol.wait_tensor(y) * torch.arange(1.0, WORLD * SHAPE[0] + 1, device=dev())[:, None]).sum().backward()
    weights = torch.arange(1.0, WORLD * SHAPE[0] + 1).chunk(WORLD)[RANK]
    same(x.grad, (WORLD * weights)[:, None].expand(SHAPE))


@checks
def cpu_tensors_on_the_same_group() -> None:
    t = data(RANK)
    dist.all_reduce(t)
    same(t, REDUCE["sum"](every()))
    flat = torch.empty((WORLD * SHAPE[0], SHAPE[1]))
    dist.all_gather_into_tensor(flat, data(RANK))
    same(flat, torch.cat(every()), exact=True)
    out = torch.empty((SHAPE[0] // WORLD, SHAPE[1]))
    dist.reduce_scatter_tensor(out, data(RANK), op=dist._make_nccl_premul_sum(0.5))
    same(out, (REDUCE["sum"](every()) * 0.5).chunk(WORLD)[RANK])
    # device and host tensors interleaved, as DCP and object collectives do
    d = mine()
    dist.all_reduce(d)
    objs: list[object] = [None] * WORLD
    dist.all_gather_object(objs, {"rank": RANK})
    assert objs == [{"rank": r} for r in range(WORLD)], objs
    box: list[object] = [("from", RANK)]
    dist.broadcast_object_list(box, src=WORLD - 1)
    assert box == [("from", WORLD - 1)], box
    same(d, REDUCE["sum"](every()))


@checks
def comm_stats_count_calls_and_bytes() -> dict[str, dict[str, int]]:
    f32 = 4
    numel = SHAPE[0] * SHAPE[1]
    nd.reset_comm_stats()
    assert nd.comm_stats() == {}, nd.comm_stats()
    dist.all_reduce(mine())
    dist.all_reduce(data(RANK))  # host tensors count too: same group, same backend
    dist.all_gather_into_tensor(torch.empty((WORLD * SHAPE[0], SHAPE[1]), device=dev()), mine())
    dist.reduce_scatter_tensor(torch.empty((SHAPE[0] // WORLD, SHAPE[1]), device=dev()), mine())
    dist.broadcast(mine(), src=0)
    dist.barrier()
    stats = nd.comm_stats()
    want = {
        "all_reduce": {"calls": 2, "bytes": 2 * numel * f32},
        "all_gather_into_tensor": {"calls": 1, "bytes": WORLD * numel * f32},  # what each rank receives
        "reduce_scatter_tensor": {"calls": 1, "bytes": numel * f32},  # what each rank contributes
        "broadcast": {"calls": 1, "bytes": numel * f32},
        "barrier": {"calls": 1, "bytes": 0},
    }
    assert stats == want, f"{stats}\n!=\n{want}"
    # per group: a collective on a new group shows there only
    sub = dist.new_group(list(range(WORLD)))
    nd.reset_comm_stats(sub)
    dist.all_reduce(mine(), group=sub)
    assert nd.comm_stats(sub) == {"all_reduce": {"calls": 1, "bytes": numel * f32}}, nd.comm_stats(sub)
    assert nd.comm_stats() == want, nd.comm_stats()
    nd.reset_comm_stats()
    assert nd.comm_stats() == {}
    return stats


# ---------------------------------------------------------------- 1-D mesh, DTensor


def mesh_1d():  # type: ignore[no-untyped-def]
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("neuron", (WORLD,), mesh_dim_names=("dp",))


@checks
def device_mesh_1d() -> str:
    mesh = mesh_1d()
    assert mesh.device_type == "neuron" and mesh.mesh_dim_names == ("dp",)
    assert mesh.get_local_rank("dp") == RANK and mesh.size() == WORLD
    group = mesh.get_group("dp")
    assert dist.get_backend(group) == "neuron", dist.get_backend(group)
    t = mine()
    dist.all_reduce(t, group=group)
    same(t, REDUCE["sum"](every()))
    return str(mesh)


@checks
def dtensor_distribute_redistribute_full() -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = mesh_1d()
    big = data(0, (WORLD * 2, WORLD * 3))  # every rank distributes the same tensor
    for dim in (0, 1):
        d = distribute_tensor(big.to(dev()), mesh, [Shard(dim)])
        assert d.to_local().device == dev(), d.to_local().device
        same(d.to_local(), big.chunk(WORLD, dim)[RANK], exact=True)
        same(d.full_tensor(), big, exact=True)
        same(d.redistribute(mesh, [Replicate()]).to_local(), big, exact=True)
        same(d.redistribute(mesh, [Shard(1 - dim)]).to_local(), big.chunk(WORLD, 1 - dim)[RANK], exact=True)
    r = distribute_tensor(big.to(dev()), mesh, [Replicate()])
    same(r.redistribute(mesh, [Shard(0)]).to_local(), big.chunk(WORLD)[RANK], exact=True)


@checks
def dtensor_partial_reductions() -> None:
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    mesh = mesh_1d()
    for op in ("sum", "avg", "max", "min"):
        p = DTensor.from_local(mine(), mesh, [Partial(op)])
        same(p.full_tensor(), REDUCE[op](every()))
        same(p.redistribute(mesh, [Shard(0)]).to_local(), REDUCE[op](every()).chunk(WORLD)[RANK])
        same(p.redistribute(mesh, [Replicate()]).to_local(), REDUCE[op](every()))


@checks
def dtensor_compute_matches_single_process() -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = mesh_1d()
    a, b = data(1, (WORLD * 3, 5)), data(2, (5, 4))
    da = distribute_tensor(a.to(dev()), mesh, [Shard(0)])
    db = distribute_tensor(b.to(dev()), mesh, [Replicate()])
    same((da @ db).full_tensor(), a @ b)
    # a reduction over the sharded dim leaves a Partial that the full tensor sums up
    same(da.sum(0).full_tensor(), a.sum(0))
    # contracting over the sharded dim, Shard(1) @ Shard(0), leaves a Partial sum
    wide, tall = data(3, (3, WORLD * 2)), data(4, (WORLD * 2, 4))
    dw = distribute_tensor(wide.to(dev()), mesh, [Shard(1)])
    dt = distribute_tensor(tall.to(dev()), mesh, [Shard(0)])
    prod = dw @ dt
    assert prod.placements[0].is_partial(), prod.placements
    same(prod.full_tensor(), wide @ tall)


@checks
def dtensor_random_init_is_the_unsharded_draw() -> str:
    # DTensor's RNG tracker shifts each shard's (seed, offset) as for CUDA's Philox; the neuron generator puts the
    # engine at that point of the seed's stream, so a row-sharded init is the unsharded init, sliced.
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = mesh_1d()
    inits = {
        "uniform_": lambda t: t.uniform_(-1, 1),
        "normal_": lambda t: t.normal_(),
        "trunc_normal_": lambda t: torch.nn.init.trunc_normal_(t, std=0.02),
        "kaiming_uniform_": lambda t: torch.nn.init.kaiming_uniform_(t),
    }
    for name, init in inits.items():
        draws = []
        for placement in (Replicate(), Shard(0)):
            torch.manual_seed(5)
            first = distribute_tensor(torch.empty(WORLD * 8, 16, device=dev()), mesh, [placement])
            second = distribute_tensor(torch.empty(WORLD * 4, 32, device=dev()), mesh, [placement])
            init(first)
            init(second)  # the offset moved on by the first init: the second starts where it should
            draws.append([first.full_tensor().cpu(), second.full_tensor().cpu()])
        for replicated, sharded in zip(*draws, strict=True):
            assert torch.equal(replicated, sharded), f"{name}: shards are not slices of the unsharded draw"
        assert not torch.equal(draws[0][0][:8], draws[0][0][8:16]), name
    return ", ".join(inits)


@checks
def default_timeout_can_be_changed() -> str:
    # What torch.distributed's timeout setters (and TorchTitan's set_timeout) call on a backend.
    import time
    from datetime import timedelta

    group = dist.new_group(list(range(WORLD)))
    group._get_backend(dev())._set_default_timeout(timedelta(seconds=1))
    if RANK != 0:
        return "rank 0 waits"
    start = time.monotonic()
    try:
        dist.recv(torch.empty(1, device=dev()), src=1, group=group)  # rank 1 never sends
    except RuntimeError as exc:
        waited = time.monotonic() - start
        assert waited < 20, waited  # the default timeout is 30 minutes
        return f"timed out after {waited:.1f} s: {str(exc)[:60]}"
    raise AssertionError("recv without a sender returned")


def setup() -> None:
    dist.init_process_group()  # no backend: neuron is the accelerator, so "neuron"


if __name__ == "__main__":
    checks.main(setup=setup, teardown=dist.destroy_process_group)
