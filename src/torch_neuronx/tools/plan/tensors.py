"""The parameter tensors one NeuronCore holds under a layout, grouped the way FSDP2 groups them.

Memory and communication both follow from this inventory. Transformers
applies the model's ``tp_plan`` first (column-wise q/k/v/gate/up split their
rows, row-wise o/down their columns, the embedding and LM head their
vocabulary), then ``fully_shard`` per decoder layer, the embedding, and a
final group of the norm and LM head that keeps its full weight after forward.
FSDP2 shards dim 0 of each TP-local tensor, padded up to a multiple of the
FSDP size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch_neuronx.tools.plan.layouts import Layout
from torch_neuronx.tools.plan.model import ModelSpec

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Group:
    """One ``fully_shard`` unit: its TP-local tensor shapes, how many there are, whether it reshards after forward."""

    name: str
    shapes: tuple[Shape, ...]
    count: int
    reshard: bool

    def padded_numel(self, fsdp: int) -> int:
        """Elements of the group once all-gathered (each tensor's dim 0 padded to a multiple of `fsdp`)."""
        return sum(math.ceil(s[0] / fsdp) * fsdp * math.prod(s[1:]) for s in self.shapes)

    def shard_shapes(self, fsdp: int) -> list[Shape]:
        return [(math.ceil(s[0] / fsdp), *s[1:]) for s in self.shapes]


def layer_shapes(m: ModelSpec, tp: int) -> tuple[Shape, ...]:
    q, kv = m.heads * m.head_dim // tp, m.kv_heads * m.head_dim // tp
    attn = ((q, m.hidden), (kv, m.hidden), (kv, m.hidden), (m.hidden, q))
    if m.experts:
        width = m.expert_intermediate // tp
        mlp: tuple[Shape, ...] = ((m.experts, m.hidden), (m.experts, 2 * width, m.hidden),
                                  (m.experts, m.hidden, width))
    else:
        width = m.intermediate // tp
        mlp = ((width, m.hidden), (width, m.hidden), (m.hidden, width))
    return attn + mlp + ((m.hidden,), (m.hidden,))


def groups(m: ModelSpec, layout: Layout, stage: int = 0) -> list[Group]:
    """The FSDP groups of `m` on one core of pipeline stage `stage` of `layout`, TP-local shapes (vocabulary split
    when TP > 1). The first stage holds the embedding, the last the final norm and LM head; with pipeline stages a
    tied embedding is held twice (once on each end), as pipelining splits it."""
    first, last = stage == 0, stage == layout.pp - 1
    vocab = m.vocab // layout.tp if layout.tp > 1 else m.vocab
    embed = (vocab, m.hidden)
    out = []
    if first and (layout.pp > 1 or not m.tied_embeddings):
        out.append(Group("embedding", (embed,), 1, True))
    out.append(Group("decoder layer", layer_shapes(m, layout.tp), stage_layers(m.layers, layout.pp, stage), True))
    if last:
        out.append(Group("norm + lm_head", ((m.hidden,), embed), 1, False))  # final norm and LM head (or the tied
    return out                                                                  # embedding)


def stage_layers(layers: int, pp: int, stage: int) -> int:
    """Decoder layers of pipeline stage `stage` of `pp`: as even as possible, the first stages take the remainder."""
    return layers // pp + (1 if stage < layers % pp else 0)


# The caching allocator's size classes (csrc/runtime/allocator.cpp): what one tensor of n bytes really takes.
_MIN_BLOCK, _ALIGN, _ROUNDED_BELOW, _DIVISIONS = 256, 512, 16 << 20, 4


def allocated(nbytes: int) -> int:
    """Bytes the allocator hands out for a request of `nbytes` (TorchNeuron's size classes)."""
    if nbytes <= _MIN_BLOCK:
        return _MIN_BLOCK
    if nbytes >= _ROUNDED_BELOW:
        return -(-nbytes // _ALIGN) * _ALIGN
    upper = 1 << (nbytes - 1).bit_length()
    step = max(upper // 2 // _DIVISIONS, _ALIGN)
    return min(upper, -(-nbytes // step) * step)
