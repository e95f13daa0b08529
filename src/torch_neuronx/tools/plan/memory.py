"""Bytes per NeuronCore of one training step: parameters, gradients, optimizer state, activations, buffers.

Each parameter, gradient and AdamW moment is its own allocation, so each is
rounded to the caching allocator's size classes (as ``max_memory_allocated``
counts them). Activations are the tensors autograd saves in a Llama-style
decoder layer (RMSNorm in fp32, RoPE, SDPA, SwiGLU MLP), split by TP where the
layer is; temporary buffers are FSDP2's gathered weights (the layer in use,
the one prefetched, the kept LM head) plus the loss's vocabulary-wide logits.

The peak is not the sum of everything: with ``zero_grad(set_to_none=True)``
no gradient exists when backward starts, which is when all activations and
the loss buffers are alive; gradients grow as activations are freed. So
``total = params + optimizer + max(activations + buffers, grads + the buffers
of one layer's gradient reduction)``: the second term is the peak under full
recomputation, when little activation memory is left. Measured peaks agree
within 7% (docs/plan.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from torch_neuronx.tools.plan.layouts import Layout
from torch_neuronx.tools.plan.model import ModelSpec
from torch_neuronx.tools.plan.precision import Precision
from torch_neuronx.tools.plan.tensors import allocated, groups

CHECKPOINTING = ("none", "selective", "full")


@dataclass(frozen=True)
class Memory:
    params: int
    grads: int
    optimizer: int
    activations: int
    buffers: int
    capacity: int
    backward_end_buffers: int = 0  # alive with the full gradients, once the activations are gone

    @property
    def total(self) -> int:
        """The estimated peak (see the module docstring)."""
        start_of_backward = self.activations + self.buffers
        end_of_backward = self.grads + self.backward_end_buffers
        return self.params + self.optimizer + max(start_of_backward, end_of_backward)

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def as_dict(self) -> dict[str, int]:
        d = asdict(self)
        d.pop("backward_end_buffers")
        return {**d, "total": self.total}


def state_bytes(m: ModelSpec, layout: Layout, element: int) -> int:
    """One copy of this core's parameter shards (weights, or gradients, or one AdamW moment), as allocated."""
    return sum(g.count * sum(allocated(element * _numel(s)) for s in g.shard_shapes(layout.fsdp))
               for g in groups(m, layout))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def layer_activations(m: ModelSpec, tp: int, tokens: int, a: int, checkpointing: str) -> int:
    """Bytes autograd keeps for one decoder layer's backward (tokens = micro-batch x sequence)."""
    if checkpointing == "full":
        return allocated(tokens * m.hidden * a)  # the layer's input only
    q, kv = m.heads * m.head_dim // tp, m.kv_heads * m.head_dim // tp
    width = (m.expert_intermediate * m.experts_per_token if m.experts else m.intermediate) // tp
    norms = 2 * (allocated(tokens * m.hidden * 4) + allocated(tokens * m.hidden * a) + 2 * allocated(tokens * 4))
    mlp = 4 * allocated(tokens * width * a)
    # q and k, rotate_half(q, k) and the RoPE outputs; v; SDPA's output and o_proj's (contiguous) input; log-sum-exp
    attention = (3 * allocated(tokens * (q + kv) * a) + allocated(tokens * kv * a) + 2 * allocated(tokens * q * a)
                 + allocated(tokens * (m.heads // tp) * 4))
    if checkpointing == "selective":  # attention internals recomputed: keep its input and output projections' inputs
        attention = allocated(tokens * q * a)
    return norms + mlp + attention


def loss_buffers(m: ModelSpec, tp: int, tokens: int, a: int) -> int:
    """The logits path: local and gathered logits, their fp32 copy, log-softmax and its gradient."""
    local = allocated(tokens * (m.vocab // tp) * a)
    gathered = allocated(tokens * m.vocab * a) if tp > 1 else 0
    fp32 = allocated(tokens * m.vocab * 4)
    return local + gathered + (fp32 if a != 4 else 0) + 2 * fp32 + allocated(tokens * m.hidden * (4 + a))


def _gathered_layer(m: ModelSpec, layout: Layout, element: int) -> int:
    layer = next(g for g in groups(m, layout) if g.name == "decoder layer")
    return allocated(layer.padded_numel(layout.fsdp) * element)


def fsdp_buffers(m: ModelSpec, layout: Layout, prec: Precision) -> int:
    """Gathered weights when backward starts: the kept tail, the last layer and the one prefetched.

    FSDP2 is applied whenever FSDP x DP > 1, and gathers into new buffers even over a group of one (pure DP).
    """
    if layout.data_parallel == 1:
        return 0
    tail = next(g for g in groups(m, layout) if g.name == "norm + lm_head")
    return 2 * _gathered_layer(m, layout, prec.compute) + allocated(tail.padded_numel(layout.fsdp) * prec.compute)


def backward_end_buffers(m: ModelSpec, layout: Layout, prec: Precision) -> int:
    """While FSDP2 reduces the first layer's gradients, the last reduction of backward (memory snapshots of measured
    steps show it): the layer's gathered weight, the flat reduce-scatter input (reduce dtype) and its output shard,
    which becomes the layer's sharded gradient. Over FSDP groups of two or more the gradients autograd produced
    (one tensor per parameter, compute dtype) are still referenced then; over a group of one (pure DP) FSDP2
    copies input to output and they are already freed."""
    if layout.data_parallel == 1:
        return 0
    layer = next(g for g in groups(m, layout) if g.name == "decoder layer")
    autograd = sum(allocated(s[0] * _numel(s[1:]) * prec.compute) for s in layer.shapes) if layout.fsdp > 1 else 0
    shard = allocated(layer.padded_numel(layout.fsdp) // layout.fsdp * prec.reduce)
    return _gathered_layer(m, layout, prec.compute) + autograd + _gathered_layer(m, layout, prec.reduce) + shard


def _layer_grads(m: ModelSpec, layout: Layout, element: int) -> int:
    layer = next(g for g in groups(m, layout) if g.name == "decoder layer")
    return sum(allocated(element * _numel(s)) for s in layer.shard_shapes(layout.fsdp))


def memory_per_core(m: ModelSpec, layout: Layout, prec: Precision, micro_batch: int, seq_len: int,
                    checkpointing: str, capacity: int) -> Memory:
    if checkpointing not in CHECKPOINTING:
        raise ValueError(f"checkpointing {checkpointing!r} is not one of {', '.join(CHECKPOINTING)}")
    tokens = micro_batch * seq_len
    params = state_bytes(m, layout, prec.param)
    acts = m.layers * layer_activations(m, layout.tp, tokens, prec.compute, checkpointing)
    if checkpointing == "full":  # one layer recomputed at a time during backward
        acts += layer_activations(m, layout.tp, tokens, prec.compute, "none")
    buffers = fsdp_buffers(m, layout, prec) + loss_buffers(m, layout.tp, tokens, prec.compute)
    grad_bytes = prec.reduce if prec.param == 4 else prec.param
    return Memory(params=params, grads=state_bytes(m, layout, grad_bytes),
                  optimizer=2 * params, activations=acts, buffers=buffers, capacity=capacity,
                  # the first layer's sharded gradient is the reduce-scatter output counted in the buffers
                  backward_end_buffers=backward_end_buffers(m, layout, prec) - _layer_grads(m, layout, grad_bytes))
