"""Megatron / NeuronX Distributed sequence parallelism for a Hugging Face Llama, so ``plan --measure`` can run it.

The planner's ``--sequence-parallel`` is the tensor parallelism NeuronX
Distributed (NxD) and Megatron-LM run: between the tensor-parallel blocks
the residual stream is split along the sequence over the TP ranks, an
all-gather rebuilds the whole sequence in front of each column-parallel
block (fused QKV, fused gate-up, the LM head) and a reduce-scatter replaces
the all-reduce behind each row-parallel one. A column-parallel block keeps
only its sequence shard for backward and gathers it again there for the
weight gradient (NxD's ``ColumnParallelLinear(sequence_parallel_enabled=
True)``); the embedding is vocabulary-parallel, its partial sums
reduce-scattered; the loss is a vocabulary-parallel cross-entropy (three
fp32 all-reduces per token: the max, the sum of exponentials, the target
logit); the norms' weights are replicated and their gradients, partial per
sequence shard, are all-reduced once per step. With more TP ranks than KV
heads, each KV head is replicated over TP / KV heads ranks, which sum the
gradients of its K and V outputs in backward (NxD's
``GQAQKVColumnParallelLinear(kv_size_multiplier=...)``).

:class:`SequenceParallelLlama` builds this from a loaded Llama with plain
``torch.distributed`` collectives over one TP group, so
``torch_neuronx.distributed.comm_stats`` counts every byte the planner
predicts. It is a measuring instrument, not a training library: a run that
wants sequence parallelism uses NxD or PyTorch's ``SequenceParallel``.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.autograd import Function


def gather_sequence(x: torch.Tensor, group: Any) -> torch.Tensor:
    """[b, s/t, h] on each rank -> [b, s, h]: one all-gather of the whole sequence."""
    t = dist.get_world_size(group)
    out = x.new_empty((t, *x.shape))
    dist.all_gather_single(out, x.contiguous(), group=group)
    b, s, h = x.shape
    return out.transpose(0, 1).reshape(b, t * s, h)


def scatter_sequence(x: torch.Tensor, group: Any) -> torch.Tensor:
    """[b, s, h] partial sums on each rank -> this rank's [b, s/t, h] of their sum: one reduce-scatter."""
    t = dist.get_world_size(group)
    b, s, h = x.shape
    out = x.new_empty((b, s // t, h))
    dist.reduce_scatter_single(out, x.view(b, t, s // t, h).transpose(0, 1).contiguous(), group=group)
    return out


class _ScatterSequence(Function):
    """Behind a row-parallel block: reduce-scatter forward, all-gather backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return scatter_sequence(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return gather_sequence(grad, ctx.group), None


class _ColumnParallel(Function):
    """In front of column-parallel blocks sharing one input (fused QKV, fused gate-up, the LM head): all-gather the
    sequence, multiply; keep only the shard, gather it again for the weight gradients, reduce-scatter the input's."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, *weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.group = group
        ctx.save_for_backward(x, *weights)
        full = gather_sequence(x, group)
        return tuple(F.linear(full, w) for w in weights)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, *weights = ctx.saved_tensors
        grad_in = grads[0] @ weights[0]
        for g, w in zip(grads[1:], weights[1:], strict=True):
            grad_in += g @ w
        grad_in = scatter_sequence(grad_in, ctx.group)
        full = gather_sequence(x, ctx.group).flatten(0, 1)
        grad_w = tuple(g.flatten(0, 1).t() @ full for g in grads)
        return (grad_in, None, *grad_w)


class _GQAColumnParallel(Function):
    """Fused QKV with each KV head replicated over `replicas` ranks (NxD's ``GQAQKVColumnParallelLinear`` with
    ``kv_size_multiplier``, neuronx_distributed/modules/qkv_linear.py): as :class:`_ColumnParallel`, but in backward
    the K and V outputs' gradients (partial: only this rank's query heads read its copy) are first summed over the
    ranks holding the same head, and their part of the input's gradient is divided by `replicas`, since the
    reduce-scatter over TP then adds every copy's."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, kv_group: Any, replicas: int, wq: torch.Tensor,
                wk: torch.Tensor, wv: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.group, ctx.kv_group, ctx.replicas = group, kv_group, replicas
        ctx.save_for_backward(x, wq, wk, wv)
        full = gather_sequence(x, group)
        return F.linear(full, wq), F.linear(full, wk), F.linear(full, wv)

    @staticmethod
    def backward(ctx: Any, gq: torch.Tensor, gk: torch.Tensor, gv: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, wq, wk, wv = ctx.saved_tensors
        # summed in fp32 whatever the compute dtype, as NxD does (qkv_linear_utils.py: grad_output_k/v cast to
        # reduce_dtype, float32 by default, around the all-reduce)
        gk32, gv32 = gk.float().contiguous(), gv.float().contiguous()
        dist.all_reduce(gk32, group=ctx.kv_group)
        dist.all_reduce(gv32, group=ctx.kv_group)
        gk, gv = gk32.to(gk.dtype), gv32.to(gv.dtype)
        grad_in = gq @ wq + (gk @ wk + gv @ wv) / ctx.replicas
        grad_in = scatter_sequence(grad_in, ctx.group)
        full = gather_sequence(x, ctx.group).flatten(0, 1)
        grad_w = tuple(g.flatten(0, 1).t() @ full for g in (gq, gk, gv))
        return (grad_in, None, None, None, *grad_w)


def kv_shared_groups(group: Any, kv_heads: int) -> Any:
    """The process group of the ranks of `group` (TP) that hold the same replicated KV head: TP ranks ``kv_heads``
    apart, as NxD's ``arrange_kv_groups`` builds them off Trn2 (on Trn2 it puts a head's replicas on adjacent ranks,
    which the planner's links model; this measured model keeps the interleaved arrangement). Every TP group of the
    world must be a contiguous block of ranks (TP innermost, as the DeviceMesh lays it out): each rank creates every
    KV group, as new_group requires."""
    t, world = dist.get_world_size(group), dist.get_world_size()
    ranks = sorted(dist.get_process_group_ranks(group)) if group is not None else list(range(world))
    if ranks != list(range(ranks[0], ranks[0] + t)) or ranks[0] % t:
        raise ValueError("KV-head replication needs each TP group to be a contiguous block of ranks (TP innermost)")
    mine = None
    for block in range(0, world, t):
        for j in range(kv_heads):
            members = [block + j + i * kv_heads for i in range(t // kv_heads)]
            pg = dist.new_group(members)
            if dist.get_rank() in members:
                mine = pg
    return mine


class _VocabParallelCrossEntropy(Function):
    """Mean cross-entropy of vocabulary-sharded logits [b, s, V/t]; targets of -100 are ignored."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, group: Any, lo: int) -> torch.Tensor:
        n = logits.shape[-1]
        z = logits.to(torch.float32, copy=True)
        top = z.amax(-1)
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        z.sub_(top.unsqueeze(-1))
        valid = target != -100
        local = target - lo
        mine = valid & (local >= 0) & (local < n)
        local = local.clamp(0, n - 1).unsqueeze(-1)
        picked = z.gather(-1, local).squeeze(-1).masked_fill_(~mine, 0.0)
        z.exp_()
        total = z.sum(-1)
        dist.all_reduce(total, group=group)
        dist.all_reduce(picked, group=group)
        count = valid.sum().clamp(min=1)
        loss = ((total.log() - picked) * valid).sum() / count
        z.div_(total.unsqueeze(-1))  # the softmax: its gradient, less the one-hot target
        ctx.save_for_backward(z, local, mine, valid, count)
        ctx.dtype = logits.dtype
        return loss

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        z, local, mine, valid, count = ctx.saved_tensors
        z.scatter_add_(-1, local, -mine.unsqueeze(-1).to(z.dtype))
        z.mul_((valid.to(z.dtype) * (grad / count)).unsqueeze(-1))
        return z.to(ctx.dtype), None, None, None


def _rows(w: torch.Tensor, rank: int, t: int) -> nn.Parameter:
    n = w.shape[0] // t
    return nn.Parameter(w.detach()[rank * n:(rank + 1) * n].clone())


def _cols(w: torch.Tensor, rank: int, t: int) -> nn.Parameter:
    n = w.shape[1] // t
    return nn.Parameter(w.detach()[:, rank * n:(rank + 1) * n].clone())


def _heads(w: torch.Tensor, heads: list[int], d: int, dim: int = 0) -> nn.Parameter:
    """The rows (dim 0) or columns (dim 1) of these attention heads of `d` each."""
    index = torch.cat([torch.arange(h * d, (h + 1) * d) for h in heads])
    return nn.Parameter(w.detach().index_select(dim, index).clone())


class _Layer(nn.Module):
    def __init__(self, layer: Any, rank: int, t: int, kv_group: Any = None) -> None:
        super().__init__()
        attn, mlp = layer.self_attn, layer.mlp
        # copies: the shard never aliases the model it was cut from
        self.input_layernorm = copy.deepcopy(layer.input_layernorm)
        self.post_attention_layernorm = copy.deepcopy(layer.post_attention_layernorm)
        d = attn.head_dim
        kv_heads = attn.k_proj.weight.shape[0] // d
        self.kv_group, self.replicas = kv_group, max(1, t // kv_heads)
        if self.replicas > 1:
            # NxD's layout: rank r holds KV head r mod KV (the K and V weights repeated, then split over TP) and a
            # block of that head's query heads (o_proj's matching columns)
            group_size, per_rank = attn.q_proj.weight.shape[0] // d // kv_heads, attn.q_proj.weight.shape[0] // d // t
            head, block = rank % kv_heads, rank // kv_heads
            first = head * group_size + block * per_rank
            queries = list(range(first, first + per_rank))
            self.q, self.o = _heads(attn.q_proj.weight, queries, d), _heads(attn.o_proj.weight, queries, d, dim=1)
            self.k, self.v = _heads(attn.k_proj.weight, [head], d), _heads(attn.v_proj.weight, [head], d)
        else:
            self.q, self.k, self.v = (_rows(p.weight, rank, t) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
            self.o = _cols(attn.o_proj.weight, rank, t)
        self.gate, self.up = _rows(mlp.gate_proj.weight, rank, t), _rows(mlp.up_proj.weight, rank, t)
        self.down = _cols(mlp.down_proj.weight, rank, t)
        self.act = mlp.act_fn
        self.head_dim = attn.head_dim

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, group: Any) -> torch.Tensor:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        b, s, d = h.shape[0], cos.shape[1], self.head_dim
        if self.replicas > 1:
            q, k, v = _GQAColumnParallel.apply(self.input_layernorm(h), group, self.kv_group, self.replicas, self.q,
                                               self.k, self.v)
        else:
            q, k, v = _ColumnParallel.apply(self.input_layernorm(h), group, self.q, self.k, self.v)
        q, k, v = (y.view(b, s, -1, d).transpose(1, 2) for y in (q, k, v))
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=d ** -0.5,
                                           enable_gqa=q.shape[1] != k.shape[1])
        o = o.transpose(1, 2).reshape(b, s, -1)
        h = h + _ScatterSequence.apply(F.linear(o, self.o), group)
        gate, up = _ColumnParallel.apply(self.post_attention_layernorm(h), group, self.gate, self.up)
        return h + _ScatterSequence.apply(F.linear(self.act(gate) * up, self.down), group)


class _VocabParallelEmbedding(nn.Module):
    """This rank's rows of the embedding: ids outside them look up zeros, and the partial sums are reduce-scattered
    along the sequence."""

    def __init__(self, embedding: nn.Embedding, rank: int, t: int) -> None:
        super().__init__()
        self.weight = _rows(embedding.weight, rank, t)
        self.rows = n = self.weight.shape[0]
        self.lo = rank * n
        pad = embedding.padding_idx  # its row gets no gradient, as in nn.Embedding
        self.padding_idx = pad - self.lo if pad is not None and 0 <= pad - self.lo < n else None

    def forward(self, ids: torch.Tensor, group: Any) -> torch.Tensor:
        local = ids - self.lo
        outside = (local < 0) | (local >= self.rows)
        e = F.embedding(local.masked_fill(outside, 0), self.weight, self.padding_idx)
        return _ScatterSequence.apply(e.masked_fill(outside.unsqueeze(-1), 0.0), group)


class _VocabParallelHead(nn.Module):
    """This rank's rows of the LM head: its slice of the vocabulary's logits, for the whole sequence."""

    def __init__(self, head: nn.Linear, rank: int, t: int) -> None:
        super().__init__()
        self.weight = _rows(head.weight, rank, t)
        self.lo = rank * self.weight.shape[0]  # the first vocabulary id of this rank's slice

    def forward(self, h: torch.Tensor, group: Any) -> torch.Tensor:
        (logits,) = _ColumnParallel.apply(h, group, self.weight)
        return logits


class SequenceParallelLlama(nn.Module):
    """This rank's shard of a Hugging Face Llama (or Mistral) under Megatron / NxD sequence parallelism over `group`
    (default: the whole world). ``forward(ids, target)`` returns the mean next-token loss.

    The submodules carry Transformers' names (``embed_tokens``, ``layers``, ``norm``, ``lm_head``), so FSDP2 can
    shard them as Transformers' ``fsdp_plan`` does."""

    def __init__(self, model: Any, group: Any = None, checkpointing: bool = False) -> None:
        super().__init__()
        self.group = group
        t, rank = dist.get_world_size(group), dist.get_rank(group)
        inner = model.model
        vocab = model.config.vocab_size
        kv_heads = model.config.num_key_value_heads
        if vocab % t or (kv_heads % t and t % kv_heads):
            raise ValueError(f"sequence parallelism over {t} ranks needs the vocabulary ({vocab}) to divide evenly "
                             f"and the key/value heads ({kv_heads}) to divide by {t} or {t} by them (replicated)")
        # TP above the KV heads: each is replicated over t / kv_heads ranks, which sum its gradients (NxD)
        kv_group = kv_shared_groups(group, kv_heads) if t > kv_heads else None
        self.embed_tokens = _VocabParallelEmbedding(inner.embed_tokens, rank, t)
        self.layers = nn.ModuleList(_Layer(layer, rank, t, kv_group) for layer in inner.layers)
        # copies: the shard never aliases the model it was cut from
        self.norm, self.rotary = copy.deepcopy(inner.norm), copy.deepcopy(inner.rotary_emb)
        self.lm_head = _VocabParallelHead(model.lm_head, rank, t)
        self.checkpointing = checkpointing

    def norm_weights(self) -> list[nn.Parameter]:
        """The replicated weights whose gradients each rank sees only for its part of the sequence."""
        out = [self.norm.weight]
        for layer in self.layers:
            out += [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
        return out

    def all_reduce_norm_grads(self) -> None:
        """Sum the norms' partial gradients over the group: one all-reduce of one flat buffer, once per step (of
        this rank's FSDP shards of them, when FSDP2 shards the model)."""
        grads = [p.grad for p in self.norm_weights() if p.grad is not None]
        local = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
        if not local:
            return
        flat = torch.cat([g.reshape(-1) for g in local])
        dist.all_reduce(flat, group=self.group)
        off = 0
        for g in local:
            g.copy_(flat[off:off + g.numel()].view_as(g))
            off += g.numel()

    def forward(self, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        t = dist.get_world_size(self.group)
        s = ids.shape[1]
        if s % t:
            raise ValueError(f"sequence parallelism splits the sequence over {t} ranks: {s} tokens do not divide")
        vocab = self.embed_tokens.rows * t
        if bool(((ids < 0) | (ids >= vocab)).any()) or bool(((target < -100) | (target >= vocab) |
                                                             ((target < 0) & (target != -100))).any()):
            # a vocabulary-sharded lookup would silently read zeros for them: refuse, as nn.Embedding does
            raise ValueError(f"token ids must lie in [0, {vocab}) (targets may also be -100, ignored)")
        h = self.embed_tokens(ids, self.group)
        pos = torch.arange(s, device=ids.device).unsqueeze(0)
        cos, sin = self.rotary(h, pos)
        for layer in self.layers:
            if self.checkpointing:
                h = torch.utils.checkpoint.checkpoint(layer, h, cos, sin, self.group, use_reentrant=False)
            else:
                h = layer(h, cos, sin, self.group)
        logits = self.lm_head(self.norm(h), self.group)
        return _VocabParallelCrossEntropy.apply(logits, target, self.group, self.lm_head.lo)
