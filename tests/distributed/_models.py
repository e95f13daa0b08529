"""A tiny transformer and its data, in plain torch.

Plain on purpose: a fresh process without torch_neuronx imports it to load a
checkpoint saved by a distributed neuron job.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, HEADS, LAYERS, SEQ = 64, 32, 4, 2, 8


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape

        def heads(y: torch.Tensor) -> torch.Tensor:
            # -1, not the head count: under tensor parallelism a rank holds some heads
            return y.view(b, t, -1, self.head_dim).transpose(1, 2)

        o = F.scaled_dot_product_attention(heads(self.wq(x)), heads(self.wk(x)), heads(self.wv(x)), is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, 4 * dim)
        self.w2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.mlp_norm = nn.LayerNorm(dim)
        self.mlp = MLP(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = VOCAB, dim: int = DIM, heads: int = HEADS, layers: int = LAYERS) -> None:
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


def make_model(seed: int = 0) -> TinyTransformer:
    torch.manual_seed(seed)
    return TinyTransformer()


def batch(step: int, part: int, size: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and next-token targets of one data-parallel part at one step (CPU)."""
    g = torch.Generator().manual_seed(1000 * step + part)
    # a learnable toy language: each token is the previous one plus a small stride
    start = torch.randint(0, VOCAB, (size, 1), generator=g)
    stride = torch.randint(1, 4, (size, 1), generator=g)
    ids = (start + stride * torch.arange(SEQ + 1)) % VOCAB
    return ids[:, :-1], ids[:, 1:]


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def tp_plan(model: TinyTransformer) -> dict[str, object]:
    """Megatron-style tensor parallelism with sequence parallelism around the norms.

    Activations between blocks stay sharded on the sequence dim; attention and
    the MLP gather them, split heads / hidden units column-wise and reduce-scatter
    back row-wise.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    plan: dict[str, object] = {
        "tok_emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
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
    return plan
