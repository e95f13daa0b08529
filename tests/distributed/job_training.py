"""Rank side of test_parallel_training.py: FSDP2, tensor parallelism and checkpoints on 2 ranks vs one process."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
from _models import batch, loss_fn, make_model, tp_plan
from _training import (
    assert_same_training,
    full_params,
    global_batch,
    optimizer,
    reference_bf16,
    reference_fp32,
    train,
)
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.testing import assert_close

import torch_neuronx.distributed as nd
from torch_neuronx.testing.jobs import Checks

checks = Checks()
RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "2"))
STEPS = 4
OUT = Path(os.environ.get("JOB_OUT", "."))


def dev() -> torch.device:
    return torch.device("neuron", torch.neuron.current_device())


def mesh_1d():  # type: ignore[no-untyped-def]
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("neuron", (WORLD,), mesh_dim_names=("dp",))


def average(t: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    return t


def sharded_model(reshard_after_forward: bool = True, mp: MixedPrecisionPolicy | None = None,
                  seed: int = 0) -> torch.nn.Module:
    mesh = mesh_1d()
    model = make_model(seed).to(dev())
    kw = {"mesh": mesh, "reshard_after_forward": reshard_after_forward, "mp_policy": mp or MixedPrecisionPolicy()}
    for block in model.layers:
        fully_shard(block, **kw)
    fully_shard(model, **kw)
    return model


_REFERENCE: dict[str, tuple[list[float], dict[str, torch.Tensor]]] = {}


def reference(kind: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    if kind not in _REFERENCE:
        _REFERENCE[kind] = reference_fp32(STEPS, WORLD) if kind == "fp32" else reference_bf16(STEPS, WORLD, dev())
    return _REFERENCE[kind]


def gathers(stats: dict[str, dict[str, int]]) -> int:
    return sum(v["calls"] for k, v in stats.items() if k.startswith("all_gather"))


# ---------------------------------------------------------------- FSDP2

_GATHERS: dict[bool, int] = {}


def _fsdp_fp32(reshard_after_forward: bool) -> str:
    model = sharded_model(reshard_after_forward)
    local = next(iter(model.parameters())).to_local()
    assert local.device == dev(), local.device  # sharded onto this rank's core
    nd.reset_comm_stats()
    losses, _ = train(model, STEPS, RANK, dev(), average)
    _GATHERS[reshard_after_forward] = gathers(nd.comm_stats())
    return assert_same_training((losses, full_params(model)), reference("fp32"), 1e-5, 1e-4)


@checks
def fsdp2_fp32_reshard_after_forward() -> str:
    return _fsdp_fp32(True)


@checks
def fsdp2_fp32_keep_params_after_forward() -> str:
    detail = _fsdp_fp32(False)
    # resharding after forward gathers the parameters again for backward
    assert _GATHERS[True] > _GATHERS[False], _GATHERS
    return f"{detail}; all-gathers with/without reshard {_GATHERS[True]}/{_GATHERS[False]}"


@checks
def fsdp2_bf16_params_fp32_reduce() -> str:
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model = sharded_model(True, mp)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # sharded master weights stay fp32
    seen: list[torch.dtype] = []
    hook = model.layers[0].mlp.w1.register_forward_pre_hook(lambda m, _: seen.append(m.weight.dtype))
    losses, _ = train(model, STEPS, RANK, dev(), average)
    hook.remove()
    assert seen and set(seen) == {torch.bfloat16}, seen
    got = (losses, full_params(model))
    # tight against a single-process emulation of the same precision, loose against fp32
    tight = assert_same_training(got, reference("bf16"), 1e-3, 1e-3)
    # Adam turns tiny gradient differences into whole lr-sized steps, so against
    # fp32 compare the losses and the direction of the weight updates
    ref_losses, ref_weights = reference("fp32")
    loss_diff = max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True))
    assert loss_diff < 3e-2, (losses, ref_losses)
    init = dict(make_model().named_parameters())
    upd = torch.cat([(got[1][n] - init[n].detach()).flatten() for n in init])
    ref_upd = torch.cat([(ref_weights[n] - init[n].detach()).flatten() for n in init])
    rel = ((upd - ref_upd).norm() / ref_upd.norm()).item()
    assert rel < 0.2, f"weight updates differ from fp32 training by {rel:.1%}"
    return f"vs bf16 reference: {tight} | vs fp32: loss diff {loss_diff:.2e}, update diff {rel:.1%}"


@checks
def fsdp2_gradient_divide_factor_uses_premul_sum() -> str:
    model = sharded_model()
    for m in model.modules():
        if isinstance(m, FSDPModule):
            # 2*WORLD is neither 1 nor the group size: FSDP2 reduces with PREMUL_SUM(1 / factor)
            m.set_gradient_divide_factor(2.0 * WORLD)
    ids, targets = batch(0, RANK)
    loss_fn(model(ids.to(dev())), targets.to(dev())).backward()
    ref = make_model()
    ids, targets = global_batch(0, WORLD)
    loss_fn(ref(ids), targets).backward()
    worst = 0.0
    for (n, p), r in zip(model.named_parameters(), ref.parameters(), strict=True):
        g = p.grad.full_tensor().cpu()
        assert_close(g, r.grad / 2, atol=1e-6, rtol=1e-4, msg=lambda m, n=n: f"{n}: {m}")
        worst = max(worst, (g - r.grad / 2).abs().max().item())
    return f"grads = reference / 2 within {worst:.2e}"


# ---------------------------------------------------------------- tensor parallelism


@checks
def tensor_parallel_colwise_rowwise_sequence() -> str:
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = mesh_1d()
    model = parallelize_module(make_model().to(dev()), mesh, tp_plan(make_model()))
    ref = make_model()
    # every tensor-parallel rank sees the same batch
    ids, targets = batch(0, 0, size=4)
    nd.reset_comm_stats()
    logits = model(ids.to(dev()))
    want = ref(ids)
    assert_close(logits.cpu(), want, atol=1e-5, rtol=1e-4)
    loss = loss_fn(logits, targets.to(dev()))
    ref_loss = loss_fn(want, targets)
    loss.backward()
    ref_loss.backward()
    ref_params = dict(ref.named_parameters())
    for n, p in model.named_parameters():
        assert type(p).__name__ == "DTensor", (n, type(p))
        assert_close(p.grad.full_tensor().cpu(), ref_params[n].grad, atol=1e-5, rtol=1e-4,
                     msg=lambda m, n=n: f"grad of {n}: {m}")
    opt, ref_opt = optimizer(model), optimizer(ref)
    opt.step()
    ref_opt.step()
    for n, w in full_params(model).items():
        assert_close(w, ref_params[n].detach(), atol=1e-5, rtol=1e-4, msg=lambda m, n=n: f"{n} after step: {m}")
    # the second step runs on updated, still-sharded weights
    assert_close(model(ids.to(dev())).cpu(), ref(ids), atol=1e-5, rtol=1e-4)
    stats = nd.comm_stats()
    assert stats, "tensor parallelism ran no collectives"
    return f"loss {loss.item():.5f} vs {ref_loss.item():.5f}; collectives {sorted(stats)}"


# ---------------------------------------------------------------- checkpoints


@checks
def dcp_sharded_round_trip() -> str:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model = sharded_model()
    _, opt = train(model, 2, RANK, dev(), average)
    msd, osd = get_state_dict(model, opt)
    path = OUT / "dcp"
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(path))
    saved = {n: p.to_local().clone() for n, p in model.named_parameters()}

    other = sharded_model(seed=1)  # different weights, fresh optimizer
    other_opt = optimizer(other)
    msd2, osd2 = get_state_dict(other, other_opt)
    state = {"model": msd2, "optim": osd2}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(other, other_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    for n, p in other.named_parameters():
        assert torch.equal(p.to_local().cpu(), saved[n].cpu()), n
    for p, q in zip(model.parameters(), other.parameters(), strict=True):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            a, b = opt.state[p][key], other_opt.state[q][key]
            a, b = (x.to_local() if hasattr(x, "to_local") else x for x in (a, b))
            assert torch.equal(a.cpu(), b.cpu()), key
    # and they train on identically
    a, _ = train(model, 1, RANK, dev(), average)
    b, _ = train(other, 1, RANK, dev(), average)
    assert a == b, (a, b)
    return f"{len(saved)} sharded params and AdamW state round-tripped; files {sorted(p.name for p in path.iterdir())}"


@checks
def full_state_dict_for_plain_cpu() -> str:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    model = sharded_model()
    train(model, 2, RANK, dev(), average)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    ids, _ = batch(99, 0)
    logits = model(ids.to(dev())).detach().cpu()  # every rank takes part in the forward...
    params = full_params(model)  # ...and in the gathers
    if RANK != 0:
        assert full == {}, sorted(full)  # cpu_offload gathers onto rank 0 only
        return "rank 0 holds it"
    for n, t in full.items():
        assert type(t) is torch.Tensor and t.device.type == "cpu", (n, type(t), t.device)
        assert torch.equal(t, params[n]), n
    torch.save(full, OUT / "full_state.pt")
    torch.save({"ids": ids, "logits": logits}, OUT / "expected.pt")
    return f"{len(full)} tensors on CPU"


def setup() -> None:
    dist.init_process_group("neuron")


if __name__ == "__main__":
    import sys

    OUT = Path(sys.argv[sys.argv.index("--out") + 1])
    checks.main(setup=setup, teardown=dist.destroy_process_group)
