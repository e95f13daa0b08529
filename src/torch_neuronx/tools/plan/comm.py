"""The collectives one training step runs on one NeuronCore: which, how many, how many bytes, over which links.

Bytes are counted as ``torch_neuronx.distributed.comm_stats()`` counts them:
the full (gathered) buffer of an all-gather, the full input of a
reduce-scatter, the tensor of an all-reduce. FSDP2 all-gathers every group
in forward and again, for the groups that reshard, in backward;
reduce-scatters each group's gradients once per micro-batch; HSDP
all-reduces the sharded gradients across replicas once per optimizer step. Tensor parallelism all-reduces one activation
(tokens x hidden) per row-wise layer in forward and per column-wise layer's
input gradient in backward, plus the vocabulary-parallel embedding and LM
head, and all-gathers the logits.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from torch_neuronx.tools.plan.layouts import Hardware, Layout
from torch_neuronx.tools.plan.model import ModelSpec
from torch_neuronx.tools.plan.precision import Precision
from torch_neuronx.tools.plan.tensors import groups


@dataclass(frozen=True)
class Collective:
    collective: str  # the name comm_stats uses
    group: str  # "tp", "fsdp" or "dp"
    calls: int
    bytes: int  # per core, per step
    group_size: int
    scope: str  # "chip", "neuronlink" or "efa"

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def scope(hw: Hardware, stride: int, size: int) -> str:
    """Where a group of `size` cores, `stride` apart, talks: inside a chip, over NeuronLink, or across EFA."""
    span = stride * (size - 1) + 1
    if span <= hw.cores_per_chip:
        return "chip"
    return "neuronlink" if span <= hw.cores_per_instance else "efa"


def tp_all_reduces(m: ModelSpec, checkpointing: str) -> int:
    """Activation all-reduces per micro-batch: 2 row-wise forward + 5 column-wise backward per layer, +2."""
    # Full recomputation reruns the forward up to the last tensor backward needs (torch's non-reentrant checkpoint
    # stops early): o_proj's all-reduce feeds the saved norm input, down_proj's output is never saved.
    per_layer = 7 + (1 if checkpointing == "full" else 0)
    return per_layer * m.layers + 2  # embedding forward, LM head input gradient


def collectives(m: ModelSpec, hw: Hardware, layout: Layout, prec: Precision, micro_batch: int, seq_len: int,
                micro_steps: int, checkpointing: str = "none") -> list[Collective]:
    """Per-core collectives of one optimizer step (`micro_steps` micro-batches of gradient accumulation)."""
    out: list[Collective] = []
    if layout.fsdp > 1:
        gs = groups(m, layout)
        fwd = sum(g.count * g.padded_numel(layout.fsdp) for g in gs)
        bwd = sum(g.count * g.padded_numel(layout.fsdp) for g in gs if g.reshard)
        n_fwd, n_bwd = sum(g.count for g in gs), sum(g.count for g in gs if g.reshard)
        where = scope(hw, layout.tp, layout.fsdp)
        out.append(Collective("all_gather_into_tensor", "fsdp", (n_fwd + n_bwd) * micro_steps,
                              (fwd + bwd) * prec.compute * micro_steps, layout.fsdp, where))
        out.append(Collective("reduce_scatter_tensor", "fsdp", n_fwd * micro_steps, fwd * prec.reduce * micro_steps,
                              layout.fsdp, where))
    if layout.dp > 1:
        gs = groups(m, layout)
        shard = sum(g.count * g.padded_numel(layout.fsdp) // layout.fsdp for g in gs)
        # once per optimizer step: HSDP all-reduces only on the last micro-batch (set_requires_all_reduce)
        out.append(Collective("all_reduce", "dp", sum(g.count for g in gs), shard * prec.reduce, layout.dp,
                              scope(hw, layout.tp * layout.fsdp, layout.dp)))
    if layout.tp > 1:
        tokens = micro_batch * seq_len
        where = scope(hw, 1, layout.tp)
        calls = tp_all_reduces(m, checkpointing)
        out.append(Collective("all_reduce", "tp", calls * micro_steps,
                              calls * tokens * m.hidden * prec.compute * micro_steps, layout.tp, where))
        out.append(Collective("all_gather_into_tensor_coalesced", "tp", micro_steps,
                              tokens * m.vocab * prec.compute * micro_steps, layout.tp, where))
    return out
