"""The collectives one training step runs on one NeuronCore: which, how many, how many bytes, over which links.

Bytes are counted as ``torch_neuronx.distributed.comm_stats()`` counts them:
the full (gathered) buffer of an all-gather, the full input of a
reduce-scatter, the tensor of an all-reduce, the tensor of a send or recv.

* FSDP2 all-gathers every group in forward and again, for the groups that
  reshard, in backward; reduce-scatters each group's gradients once per
  micro-batch; HSDP all-reduces the sharded gradients across replicas once per
  optimizer step.
* ZeRO-1 (optimizer state sharded over DP, parameters replicated)
  reduce-scatters the gradients over DP once per step and all-gathers the
  updated parameters after the optimizer step.
* Tensor parallelism as Transformers' ``tp_plan`` runs it all-reduces one
  activation (tokens x hidden) per row-wise layer in forward and per
  column-wise layer's input gradient in backward, plus the
  vocabulary-parallel embedding and LM head, and all-gathers the logits.
* Sequence parallelism (Megatron / NeuronX Distributed, fused QKV and
  gate-up) replaces each all-reduce by a reduce-scatter after the row-wise
  layers and an all-gather before the column-wise ones (in forward; the
  reverse in backward, plus the re-gathered input of the column-wise layers'
  weight gradients); its vocabulary-parallel cross-entropy all-reduces three
  fp32 numbers per token instead of gathering the logits, and the norms'
  replicated weights have their gradients all-reduced once per step.
* KV heads replicated over TP (TP above their number, NxD's
  ``kv_size_multiplier``): backward all-reduces the K and V projections'
  output gradients (tokens x head_dim each, per layer, in fp32 as NxD does)
  over the ranks that hold the same head (adjacent ranks on Trn2,
  interleaved elsewhere, as NxD arranges them).
* Pipeline stages send the boundary activation forward and receive its
  gradient back, once per micro-batch.

Each collective also carries where its traffic goes: a ring over a group
that spans chips and instances is run hierarchically (inside each chip,
then over NeuronLink, then over EFA), so only ``(e - 1) / n`` of the buffer
crosses EFA for a group of ``n`` cores on ``e`` instances (:func:`level_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from torch_neuronx.tools.plan.layouts import Hardware, Layout
from torch_neuronx.tools.plan.model import ModelSpec
from torch_neuronx.tools.plan.precision import Precision
from torch_neuronx.tools.plan.tensors import groups

SCOPES = ("chip", "neuronlink", "efa")


@dataclass(frozen=True)
class Collective:
    collective: str  # the name comm_stats uses
    group: str  # "tp", "pp", "fsdp" or "dp"
    calls: int
    bytes: int  # per core, per step
    group_size: int
    scope: str  # the widest links it crosses: "chip", "neuronlink" or "efa"
    levels: tuple[int, int, int] = (1, 1, 1)  # members per chip, chips per instance, instances
    per_micro_batch: bool = True  # repeated each micro-batch (False: once per optimizer step)
    scope_bytes: dict[str, int] = field(default_factory=dict, compare=False)  # per core, per step, by links

    def as_dict(self) -> dict[str, object]:
        return {"collective": self.collective, "group": self.group, "calls": self.calls, "bytes": self.bytes,
                "group_size": self.group_size, "scope": self.scope, "levels": list(self.levels),
                "scope_bytes": self.scope_bytes}


@lru_cache(maxsize=4096)
def levels(cores_per_chip: int, cores_per_instance: int, stride: int, size: int) -> tuple[int, int, int]:
    """(members per chip, chips per instance, instances) of a group of `size` cores `stride` apart."""
    members = range(0, stride * size, stride)
    chips = len({r // cores_per_chip for r in members})
    instances = len({r // cores_per_instance for r in members})
    return max(1, size // chips), max(1, chips // instances), instances


def scope(hw: Hardware, stride: int, size: int) -> str:
    """Where a group of `size` cores, `stride` apart, talks: inside a chip, over NeuronLink, or across EFA."""
    a, b, e = levels(hw.cores_per_chip, hw.cores_per_instance, stride, size)
    return "efa" if e > 1 else "neuronlink" if b > 1 else "chip"


def level_bytes(kind: str, nbytes: float, lv: tuple[int, int, int]) -> dict[str, float]:
    """Bytes one core moves over each level for a hierarchical ring collective of `nbytes` (comm_stats' count).

    An all-gather of a buffer of B bytes over n = a x b x e cores gathers over EFA first, while each core's part
    is smallest ((e - 1) B / n), then over NeuronLink ((b - 1) e B / n), then inside the chip ((a - 1) b e B / n):
    (n - 1) B / n in all, as a flat ring. A reduce-scatter is the mirror image; an all-reduce is both. A send or
    recv moves its tensor once over the widest level."""
    a, b, e = lv
    n = a * b * e
    if kind in ("send", "recv"):
        where = "efa" if e > 1 else "neuronlink" if b > 1 else "chip"
        return {where: float(nbytes)}
    factor = 2.0 if kind.startswith("all_reduce") else 1.0
    return {"chip": factor * nbytes * (a - 1) * b * e / n, "neuronlink": factor * nbytes * (b - 1) * e / n,
            "efa": factor * nbytes * (e - 1) / n}


def _make(hw: Hardware, name: str, group: str, calls: int, nbytes: int, size: int, stride: int,
          per_micro_batch: bool = True) -> Collective:
    lv = levels(hw.cores_per_chip, hw.cores_per_instance, stride, size)
    where = "efa" if lv[2] > 1 else "neuronlink" if lv[1] > 1 else "chip"
    split = {k: round(v) for k, v in level_bytes(name, nbytes, lv).items() if v}
    return Collective(name, group, calls, nbytes, size, where, lv, per_micro_batch, split)


# NxD all-reduces the replicated KV heads' output gradients in its reduce dtype, float32 by default
# (aws-neuron/neuronx-distributed src/neuronx_distributed/modules/qkv_linear.py: reduce_dtype=torch.float32)
KV_REDUCE_BYTES = 4


def kv_group_stride(hw: Hardware, tp: int, kv_replicas: int) -> int:
    """Rank distance between the TP ranks that hold the same replicated KV head, as NxD arranges them
    (neuronx_distributed/parallel_layers/parallel_state.py, ``arrange_kv_groups``): on Trn2 a head's replicas are
    adjacent ranks (``(K0, K0, ..., K1, K1, ...)``: inside one chip while they fit in it), elsewhere interleaved,
    ``TP / replicas`` apart (``(K0, K1, ..., K0, K1, ...)``)."""
    return 1 if hw.instance.chip.name == "trn2" else tp // kv_replicas


def tp_all_reduces(m: ModelSpec, checkpointing: str) -> int:
    """Activation all-reduces per micro-batch: 2 row-wise forward + 5 column-wise backward per layer, +2."""
    # Full recomputation reruns the forward up to the last tensor backward needs (torch's non-reentrant checkpoint
    # stops early): o_proj's all-reduce feeds the saved norm input, down_proj's output is never saved.
    per_layer = 7 + (1 if checkpointing == "full" else 0)
    return per_layer * m.layers + 2  # embedding forward, LM head input gradient


def sp_collectives(layers: int, checkpointing: str) -> tuple[int, int]:
    """(all-gathers, reduce-scatters) of tokens x hidden per micro-batch under sequence parallelism.

    Per layer, forward: all-gather before attention and before the MLP, reduce-scatter after each; backward: the
    mirror images (2 + 2) and the re-gathered inputs of the two column-wise layers' weight gradients (2). Full
    recomputation repeats the forward's up to the last tensor backward needs (torch's non-reentrant checkpoint stops
    there): both gathers and the attention's reduce-scatter, not the MLP's (its output is never saved)."""
    gathers, scatters = 2 + 2 + 2, 2 + 2
    if checkpointing == "full":
        gathers, scatters = gathers + 2, scatters + 1
    return gathers * layers, scatters * layers


def collectives(m: ModelSpec, hw: Hardware, layout: Layout, prec: Precision, micro_batch: int, seq_len: int,
                micro_steps: int, checkpointing: str = "none", *, zero1: bool = False, sp: bool = False,
                stage: int = 0, kv_replicas: int = 1) -> list[Collective]:
    """Per-core collectives of one optimizer step (`micro_steps` micro-batches of gradient accumulation) on a core
    of pipeline stage `stage`.

    `m` is the model as the TP group runs it (:meth:`ModelSpec.replicated`); `kv_replicas` > 1: each KV head is
    held by that many TP ranks, and backward all-reduces the gradients of the K and V projections' outputs over
    them (NxD's "KV shared group", :func:`kv_group_stride`; neuronx_distributed/modules/qkv_linear.py)."""
    out: list[Collective] = []
    tp, fsdp, dp, pp = layout.tp, layout.fsdp, layout.dp, layout.pp
    first, last = stage == 0, stage == pp - 1
    gs = groups(m, layout, stage)
    layers = next(g.count for g in gs if g.name == "decoder layer")
    if fsdp > 1 and not zero1:
        fwd = sum(g.count * g.padded_numel(fsdp) for g in gs)
        bwd = sum(g.count * g.padded_numel(fsdp) for g in gs if g.reshard)
        n_fwd, n_bwd = sum(g.count for g in gs), sum(g.count for g in gs if g.reshard)
        out.append(_make(hw, "all_gather_into_tensor", "fsdp", (n_fwd + n_bwd) * micro_steps,
                         (fwd + bwd) * prec.compute * micro_steps, fsdp, tp))
        out.append(_make(hw, "reduce_scatter_tensor", "fsdp", n_fwd * micro_steps, fwd * prec.reduce * micro_steps,
                         fsdp, tp))
    if dp > 1:
        stride = tp * fsdp
        if zero1:  # one flat buffer of the parameters, padded to a multiple of DP
            full = -(-sum(g.count * g.padded_numel(1) for g in gs) // dp) * dp
            out.append(_make(hw, "reduce_scatter_tensor", "dp", 1, full * prec.reduce, dp, stride, False))
            out.append(_make(hw, "all_gather_into_tensor", "dp", 1, full * prec.param, dp, stride, False))
        else:
            shard = sum(g.count * g.padded_numel(fsdp) // fsdp for g in gs)
            # once per optimizer step: HSDP all-reduces only on the last micro-batch (set_requires_all_reduce)
            out.append(_make(hw, "all_reduce", "dp", sum(g.count for g in gs), shard * prec.reduce, dp, stride,
                             False))
    if tp > 1:
        tokens = micro_batch * seq_len
        act = tokens * m.hidden * prec.compute
        ends = int(first) + int(last)  # the embedding's forward all-reduce, the LM head's input gradient
        if sp:
            gathers, scatters = sp_collectives(layers, checkpointing)
            # the embedding's output reduce-scattered (its gradient gathered back); the final norm's output gathered
            # for the LM head, gathered again for its weight gradient, its input gradient reduce-scattered
            gathers, scatters = gathers + ends + int(last), scatters + ends
            out.append(_make(hw, "all_gather_into_tensor", "tp", gathers * micro_steps, gathers * act * micro_steps,
                             tp, 1))
            out.append(_make(hw, "reduce_scatter_tensor", "tp", scatters * micro_steps,
                             scatters * act * micro_steps, tp, 1))
        else:
            calls = (tp_all_reduces(m, checkpointing) - 2) // m.layers * layers + ends
            out.append(_make(hw, "all_reduce", "tp", calls * micro_steps, calls * act * micro_steps, tp, 1))
        if sp:
            # the norms' weights are replicated and see a sequence shard each: their gradients are summed over TP
            # once per step (one flat buffer); a vocabulary-parallel cross-entropy all-reduces the max, the sum of
            # exponentials and the target logit, fp32 per token
            # (this rank's FSDP shard of each norm, when FSDP2 shards them)
            norm_numel = -(-m.hidden // fsdp) if fsdp > 1 and not zero1 else m.hidden
            norms = (2 * layers + int(last)) * norm_numel * (prec.reduce if prec.param == 4 else prec.param)
            out.append(_make(hw, "all_reduce", "tp", 1, norms, tp, 1, False))
            if last:
                out.append(_make(hw, "all_reduce", "tp", 3 * micro_steps, 3 * tokens * 4 * micro_steps, tp, 1))
        if kv_replicas > 1:
            # per layer, in backward only (a recomputed forward adds none): K's and V's output gradients, the whole
            # sequence of this rank's KV heads, summed over the ranks that hold the same head, in fp32 whatever the
            # compute dtype (NxD: qkv_linear_utils.py _qkvlinear_autograd_base_setup_bwd casts grad_output_k/v to
            # ctx.reduce_dtype before xm.all_reduce; GQAQKVColumnParallelLinear's reduce_dtype defaults to
            # torch.float32)
            kv_bytes = tokens * (m.kv_heads // tp) * m.head_dim * KV_REDUCE_BYTES
            calls = 2 * layers
            out.append(_make(hw, "all_reduce", "tp", calls * micro_steps, calls * kv_bytes * micro_steps,
                             kv_replicas, kv_group_stride(hw, tp, kv_replicas)))
        if last and not sp:  # the LM head gathers the logits
            out.append(_make(hw, "all_gather_into_tensor_coalesced", "tp", micro_steps,
                             tokens * m.vocab * prec.compute * micro_steps, tp, 1))
    if pp > 1:
        boundary = micro_batch * seq_len * m.hidden * prec.compute // (tp if sp and tp > 1 else 1)
        links = int(not first) + int(not last)  # neighbours: activations forward, their gradients back
        stride = tp * fsdp * dp
        out.append(_make(hw, "send", "pp", links * micro_steps, links * boundary * micro_steps, 2, stride))
        out.append(_make(hw, "recv", "pp", links * micro_steps, links * boundary * micro_steps, 2, stride))
    return out
