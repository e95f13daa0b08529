"""Tensor parallel x FSDP2 on emulated NeuronCores: a tiny transformer on a (dp, tp) mesh.

    torchrun --standalone --nproc-per-node 4 examples/distributed_tp_fsdp.py [--tp 2] [--steps 10] [--bf16]

Each worker binds neuron:LOCAL_RANK. Tensor parallelism splits attention heads
and MLP units within a tp group (Megatron-style, with sequence parallelism
around the norms); FSDP2 shards what is left over the dp groups. On a
trn2.48xlarge the same script runs as --nproc-per-node 32 --tp 8 (a 4 x 8 mesh).
"""

from __future__ import annotations

import argparse
import os
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

import torch_neuronx.distributed as nd


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds heads / tp of them
        q, k, v = (w(x).view(b, t, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.w1, self.w2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.attn_norm, self.attn = nn.LayerNorm(dim), Attention(dim, heads)
        self.mlp_norm, self.mlp = nn.LayerNorm(dim), MLP(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 128, dim: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.tok_emb(ids)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h))


def tensor_parallel(model: TinyLM, tp_mesh) -> None:  # type: ignore[no-untyped-def]
    # Activations stay sequence-sharded between blocks: the norms run on their
    # shard (SequenceParallel); attention and the MLP gather the sequence once,
    # compute on their heads / units (Colwise) and reduce-scatter back (Rowwise).
    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    plan: dict[str, object] = {
        "tok_emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
    for i in range(len(model.layers)):
        p = f"layers.{i}."
        plan |= {
            p + "attn_norm": SequenceParallel(),
            p + "attn": gather,
            p + "attn.wq": ColwiseParallel(),
            p + "attn.wk": ColwiseParallel(),
            p + "attn.wv": ColwiseParallel(),
            p + "attn.wo": RowwiseParallel(output_layouts=Shard(1)),
            p + "mlp_norm": SequenceParallel(),
            p + "mlp": gather,
            p + "mlp.w1": ColwiseParallel(),
            p + "mlp.w2": RowwiseParallel(output_layouts=Shard(1)),
        }
    parallelize_module(model, tp_mesh, plan)


def batch(step: int, part: int, size: int, seq: int, vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + part)
    start = torch.randint(0, vocab, (size, 1), generator=g)
    stride = torch.randint(1, 4, (size, 1), generator=g)
    return (start + stride * torch.arange(seq + 1)) % vocab  # a learnable toy language


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel degree (the rest is FSDP)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=4, help="sequences per dp rank")
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--bf16", action="store_true", help="bf16 compute, fp32 gradient reduction")
    parser.add_argument("--save", help="write a full (unsharded, CPU) state dict here")
    args = parser.parse_args()
    # FSDP2 warns that the root returns a view (the gathered logits); it matters
    # only for in-place ops on the output, which this loop does not do
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")

    world = int(os.environ.get("WORLD_SIZE", "1"))
    # init_mesh says so, naming both numbers, when the launch does not fill the mesh
    mesh = nd.init_mesh((max(world // args.tp, 1), args.tp), ("dp", "tp"))
    rank = dist.get_rank()
    device = torch.device("neuron", torch.neuron.current_device())  # neuron:LOCAL_RANK, from init_process_group

    torch.manual_seed(0)  # the same initial weights on every rank
    model = TinyLM().to(device)
    tensor_parallel(model, mesh["tp"])
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if args.bf16 else None
    for block in model.layers:
        fully_shard(block, mesh=mesh["dp"], mp_policy=mp or MixedPrecisionPolicy())
    fully_shard(model, mesh=mesh["dp"], mp_policy=mp or MixedPrecisionPolicy())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    dp_rank, dp_group = mesh.get_local_rank("dp"), mesh.get_group("dp")
    for step in range(args.steps):
        ids = batch(step, dp_rank, args.batch, args.seq, 128).to(device)  # tp peers share their dp rank's data
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG, group=dp_group)
        if rank == 0:
            print(f"step {step:3d}  loss {mean.item():.4f}", flush=True)

    if rank == 0:
        print(f"mesh {mesh}; rank 0 on {device}")
        for dim in ("dp", "tp"):
            stats = nd.comm_stats(mesh.get_group(dim))
            moved = sum(s["bytes"] for s in stats.values()) / 2**20
            print(f"  {dim}: {sum(s['calls'] for s in stats.values())} collectives, {moved:.2f} MiB "
                  + ", ".join(f"{k}={v['calls']}" for k, v in sorted(stats.items())))
    if args.save:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if rank == 0:
            torch.save(full, args.save)  # plain CPU tensors: loads without torch_neuronx
            print(f"saved {len(full)} tensors to {args.save}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
