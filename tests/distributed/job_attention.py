"""Rank side of test_attention.py: context parallelism (the SDPA ring) and flex attention on neuron ranks.

Every rank makes the full q, k, v and output gradient from one seed, so the
reference is the unsharded attention computed locally on CPU; the
context-parallel run shards them along the sequence, and its output and
gradients, unsharded, must equal the reference.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel
from torch.distributed.tensor.experimental._attention import context_parallel_unshard, set_rotate_method
from torch.testing import assert_close

from torch_neuronx.testing.jobs import Checks

checks = Checks()
WORLD = int(os.environ.get("WORLD_SIZE", "2"))
B, H, D = 2, 4, 16
SEQ = 64 * WORLD  # per rank 64 queries: a multiple of 32 (efficient attention's LSE blocks) and of 2 * WORLD


def full_inputs(dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return [torch.randn(B, H, SEQ, D, generator=g).to(dtype) for _ in range(4)]  # q, k, v, grad of the output


def reference(is_causal: bool, dtype: torch.dtype) -> list[torch.Tensor]:
    q, k, v, grad = (t.float() for t in full_inputs(dtype))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    out.backward(grad)
    return [out.detach(), q.grad, k.grad, v.grad]


def ring(is_causal: bool, rotate: str, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    mesh = init_device_mesh("neuron", (WORLD,))
    set_rotate_method(rotate)
    q, k, v, grad = (t.to("neuron") for t in full_inputs(dtype))
    with context_parallel(mesh, buffers=[q, k, v, grad], buffer_seq_dims=[2, 2, 2, 2]):
        assert q.shape[2] == SEQ // WORLD, q.shape  # the buffers now hold this rank's shard
        for t in (q, k, v):
            t.requires_grad_()
        out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        out.backward(grad)
        local = [out.detach(), q.grad, k.grad, v.grad]
        for t in (q, k, v):
            t.requires_grad_(False)  # the buffers are restored to full length on exit
    assert all(t.device.type == "neuron" for t in local)
    return context_parallel_unshard(mesh, local, [2, 2, 2, 2])


def compare(got: list[torch.Tensor], want: list[torch.Tensor], dtype: torch.dtype) -> str:
    tol = {"atol": 2e-5, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 3e-2}
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        assert g.shape == w.shape, (name, g.shape, w.shape)
        assert_close(g.cpu().float(), w, **tol, msg=lambda m, name=name: f"{name}: {m}")
    return f"{WORLD} ranks, seq {SEQ}, max |out diff| {(got[0].cpu().float() - want[0]).abs().max().item():.2e}"


@checks
def causal_allgather() -> str:
    return compare(ring(True, "allgather"), reference(True, torch.float32), torch.float32)


@checks
def causal_alltoall() -> str:
    return compare(ring(True, "alltoall"), reference(True, torch.float32), torch.float32)


@checks
def causal_bf16() -> str:
    return compare(ring(True, "allgather", torch.bfloat16), reference(True, torch.bfloat16), torch.bfloat16)


@checks
def sdpa_picks_efficient_attention() -> str:
    # The op the ring and DTensor know; it runs CPU's flash kernel, so results equal CPU's bit for bit.
    q, k, v, _ = full_inputs()
    choice = torch._fused_sdp_choice(q.to("neuron"), k.to("neuron"), v.to("neuron"), is_causal=True)
    assert choice == 2, choice  # SDPBackend EFFICIENT_ATTENTION
    got = F.scaled_dot_product_attention(q.to("neuron"), k.to("neuron"), v.to("neuron"), is_causal=True)
    assert torch.equal(got.cpu(), F.scaled_dot_product_attention(q, k, v, is_causal=True))
    return f"choice {choice}"


def setup() -> None:
    dist.init_process_group()
    torch.neuron.set_device(int(os.environ["LOCAL_RANK"]))


if __name__ == "__main__":
    checks.main(setup=setup, teardown=dist.destroy_process_group)
