"""Bytes per NeuronCore of one training step: parameters, gradients, optimizer state, activations, buffers.

Each parameter, gradient and AdamW moment is its own allocation, so each is
rounded to the caching allocator's size classes (as ``max_memory_allocated``
counts them). Activations are the tensors autograd saves in a Llama-style
decoder layer (RMSNorm in fp32, RoPE, SDPA, SwiGLU MLP), split by TP where the
layer is (and, under sequence parallelism, the token-wise parts too);
temporary buffers are FSDP2's gathered weights (the layer in use, the one
prefetched, the kept LM head) plus the loss's vocabulary-wide logits.

The peak is not the sum of everything: with ``zero_grad(set_to_none=True)``
no gradient exists when backward starts, which is when all activations and
the loss buffers are alive; gradients grow as activations are freed. So
``total = params + optimizer + max(activations + buffers, grads + the buffers
of one layer's gradient reduction)``: the second term is the peak under full
recomputation, when little activation memory is left. With gradient
accumulation (more than one micro-batch per step) the later micro-batches'
backward starts with the accumulated gradients alive, which the first term
then includes.

Pipeline parallelism: each stage holds its own layers; under 1F1B stage ``s``
of ``p`` keeps the activations of ``min(p - s, micro-batches)`` micro-batches
alive, so the first stage (most in flight, plus the embedding) or the last
(the LM head and the loss) peaks; the worse of the two is reported. ZeRO-1
keeps full parameters and gradients and, per rank, one flat master shard of
the parameters with AdamW's two moments (1/DP each); after backward the
gradients are copied into one flat buffer and reduce-scattered.

What runs out is not allocated bytes but what the caching allocator has
*reserved* (segments: 2 MiB for requests under 1 MiB, 20 MiB shared segments
for requests under 10 MiB, the request rounded to 2 MiB above) plus what the
Neuron runtime takes before PyTorch allocates anything (``reserve``): both
are estimated, and ``fits`` compares their sum with the core's HBM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch_neuronx.tools.plan.layouts import Layout
from torch_neuronx.tools.plan.model import ModelSpec
from torch_neuronx.tools.plan.precision import Precision
from torch_neuronx.tools.plan.tensors import allocated, groups

CHECKPOINTING = ("none", "selective", "full")
MIB = 1 << 20

# AWS's device-memory guide (neuron-runtime/explore/device-memory): the runtime's micro-code takes 96 MB per
# physical NeuronCore, and the shared scratchpad is allocated in pages of 512 MB by default
# (NEURON_SCRATCHPAD_PAGE_SIZE)
MICROCODE_PER_PHYSICAL_CORE = 96 * 1000 * 1000
SCRATCHPAD_PAGE = 512 * MIB
# The reserved estimate packs the live tensors at the peak into segments; freed blocks that the live requests cannot
# reuse hold more. docs/plan.md's measured table: the 20.2M model (vocabulary 8192) reserved 256 MiB against an
# estimate of 158 MiB (+98 MiB), 218 / 178 (+40), 272 / 244 (+28). A layout fits only with this much to spare
FRAGMENTATION_MARGIN = 128 * MIB


def runtime_reserve(lnc: int) -> int:
    """The default HBM the Neuron runtime holds per logical core: micro-code of its physical cores + one scratchpad
    page (compiled code, DMA rings and collectives' buffers are smaller and not counted)."""
    return MICROCODE_PER_PHYSICAL_CORE * lnc + SCRATCHPAD_PAGE


@dataclass
class Tally:
    """Allocations by the allocator's pools: what they hand out, and what segments they need for it."""

    small: int = 0  # requests < 1 MiB (2 MiB segments)
    medium: int = 0  # 1 MiB <= request < 10 MiB (20 MiB shared segments)
    large: int = 0  # >= 10 MiB: own segment, the request rounded to 2 MiB
    large_segments: int = 0

    def add(self, nbytes: int, count: int = 1) -> Tally:
        if count <= 0 or nbytes <= 0:
            return self
        a = allocated(nbytes)
        if nbytes < MIB:
            self.small += a * count
        elif nbytes < 10 * MIB:
            self.medium += a * count
        else:
            self.large += a * count
            self.large_segments += -(-nbytes // (2 * MIB)) * 2 * MIB * count
        return self

    def __add__(self, other: Tally) -> Tally:
        return Tally(self.small + other.small, self.medium + other.medium, self.large + other.large,
                     self.large_segments + other.large_segments)

    def times(self, k: int) -> Tally:
        return Tally(self.small * k, self.medium * k, self.large * k, self.large_segments * k)

    @property
    def total(self) -> int:
        return self.small + self.medium + self.large

    @property
    def reserved(self) -> int:
        """Segments holding these allocations: each pool's bytes packed into its segments, plus one 2 MiB segment
        of slack for the small pool (blocks freed earlier whose size the live requests cannot reuse: the
        fragmentation measured steps show), plus the large requests' own segments."""
        small = (-(-self.small // (2 * MIB)) + 1) * 2 * MIB if self.small else 0
        medium = -(-self.medium // (20 * MIB)) * 20 * MIB
        return small + medium + self.large_segments


@dataclass(frozen=True)
class Memory:
    params: int
    grads: int
    optimizer: int
    activations: int
    buffers: int
    capacity: int
    backward_end_buffers: int = 0  # alive with the full gradients, once the activations are gone
    reserve: int = 0  # the Neuron runtime's own HBM (micro-code, scratchpad)
    stage: int = 0  # the pipeline stage whose figures these are (the one that peaks)
    segments: int = 0  # estimated reserved bytes at the peak (see reserved)
    accumulated: int = 0  # gradients alive when the peak micro-batch's backward starts (gradient accumulation)

    @property
    def total(self) -> int:
        """The estimated peak of allocated bytes (see the module docstring)."""
        start_of_backward = self.activations + self.buffers + self.accumulated
        end_of_backward = self.grads + self.backward_end_buffers
        return self.params + self.optimizer + max(start_of_backward, end_of_backward)

    @property
    def reserved(self) -> int:
        """The estimated peak of the allocator's reserved bytes: never below allocated."""
        return max(self.segments, self.total)

    @property
    def fits(self) -> bool:
        return self.needed <= self.capacity

    @property
    def needed(self) -> int:
        """What a core must hold: the reserved estimate, the fragmentation it does not see, the runtime's share."""
        return self.reserved + FRAGMENTATION_MARGIN + self.reserve

    def as_dict(self) -> dict[str, int]:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer,
                "activations": self.activations, "buffers": self.buffers, "total": self.total,
                "accumulated_grads": self.accumulated, "reserved": self.reserved, "runtime_reserve": self.reserve,
                "fragmentation_margin": FRAGMENTATION_MARGIN, "needed": self.needed, "capacity": self.capacity,
                "stage": self.stage}


def state_tally(m: ModelSpec, layout: Layout, element: int, stage: int = 0, shard: int = 1) -> Tally:
    """One copy of this core's parameter shards (weights, or gradients, or one AdamW moment), as allocated.

    `shard` > 1 splits each tensor further (ZeRO-1's optimizer state over the data-parallel ranks)."""
    t = Tally()
    for g in groups(m, layout, stage):
        for s in g.shard_shapes(layout.fsdp):
            t.add(-(-element * _numel(s) // shard), g.count)
    return t


def state_bytes(m: ModelSpec, layout: Layout, element: int, stage: int = 0) -> int:
    return state_tally(m, layout, element, stage).total


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def layer_activations(m: ModelSpec, tp: int, tokens: int, a: int, checkpointing: str, sp: bool = False) -> Tally:
    """What autograd keeps for one decoder layer's backward (tokens = micro-batch x sequence).

    Under sequence parallelism (`sp`) the token-wise tensors outside attention and the MLP (the norms, the
    residual stream, the layer's input) are split over the TP ranks."""
    seq_tokens = -(-tokens // tp) if sp else tokens
    t = Tally()
    if checkpointing == "full":
        return t.add(seq_tokens * m.hidden * a)  # the layer's input only
    q, kv = m.heads * m.head_dim // tp, m.kv_heads * m.head_dim // tp
    width = (m.expert_intermediate * m.experts_per_token if m.experts else m.intermediate) // tp
    for _ in range(2):  # two RMSNorms
        t = t + rms_norm(seq_tokens, m.hidden, a)
    t.add(tokens * width * a, 4)  # SwiGLU: gate, up, act(gate), the product
    if checkpointing == "selective":  # attention internals recomputed: keep o_proj's input
        t.add(tokens * q * a)
    else:  # the RoPE outputs (autograd keeps cos and sin, not q and k); v; SDPA's output; its log-sum-exp
        t.add(tokens * q * a).add(tokens * kv * a, 2).add(tokens * q * a).add(tokens * (m.heads // tp) * 4)
    return t


def rms_norm(tokens: int, hidden: int, a: int) -> Tally:
    """What one RMSNorm keeps (snapshots of measured steps): its input in fp32 (a copy unless the model is fp32),
    the normalised input cast back to the compute dtype (the weight's multiply keeps it), the output (the next
    matmul keeps it), and the reciprocal root mean square per token."""
    return Tally().add(tokens * hidden * 4).add(tokens * hidden * a, 2).add(tokens * 4, 2)


def loss_buffers(m: ModelSpec, tp: int, tokens: int, a: int, vocab_parallel: bool = False,
                 sharded: bool = False) -> Tally:
    """The logits path at the loss's backward: the logits, log-softmax's output and the gradients.

    A vocabulary-parallel cross-entropy (Megatron / NxD, with sequence parallelism) never gathers the logits: each
    core keeps its vocabulary slice, an fp32 copy and its softmax (the gradient). `sharded`: FSDP2 is applied (FSDP
    x DP > 1)."""
    if vocab_parallel and tp > 1:
        local = tokens * (m.vocab // tp)
        return Tally().add(local * a).add(local * 4, 2).add(tokens * m.hidden * (4 + a))
    # the LM head's output (Transformers' output keeps it) and, under TP, the gathered logits; under TP with FSDP2
    # both are freed before the loss's backward (a snapshot of a measured 2x1x1x2 step: only log-softmax's output
    # and the gradients are alive there), and their moment is the LM head's forward (head_forward_buffers). Under
    # TP alone they count: the measured TP=4 peaks (docs/plan.md) are 5-9% above the estimate without them
    t = Tally()
    if tp == 1 or not sharded:
        t.add(tokens * (m.vocab // tp) * a)
        if tp > 1:
            t.add(tokens * m.vocab * a)  # gathered
    # log-softmax's output, and during its backward the incoming and the outgoing gradient (fp32; the fp32 copy of
    # the logits is freed before backward); the final norm
    return t.add(tokens * m.vocab * 4, 3) + rms_norm(tokens, m.hidden, a)


def head_forward_buffers(m: ModelSpec, tp: int, tokens: int, a: int) -> Tally:
    """The LM head's forward under TP without a vocabulary-parallel loss (Transformers' ``colwise_rep``): this
    rank's vocabulary slice of the logits, the all-gather's output and the logits concatenated from it, all alive at
    once (snapshots of measured steps: with a large vocabulary this, not the loss's backward, is the peak), and the
    final norm."""
    local = tokens * (m.vocab // tp) * a
    return Tally().add(local).add(tokens * m.vocab * a, 2) + rms_norm(tokens, m.hidden, a)


def _layer_numel(m: ModelSpec, layout: Layout) -> int:
    layer = next(g for g in groups(m, layout) if g.name == "decoder layer")
    return layer.padded_numel(layout.fsdp)


def fsdp_buffers(m: ModelSpec, layout: Layout, prec: Precision, stage: int = 0, layers: int = 2) -> Tally:
    """Gathered weights in the last layer's backward: the kept tail (the final norm and LM head, which FSDP2 does
    not reshard), the layer re-gathered for its backward and the one prefetched (`layers` of them); while the loss
    runs backward only the tail is gathered (memory snapshots of measured steps).

    FSDP2 is applied whenever FSDP x DP > 1 (without ZeRO-1), and gathers into new buffers even over a group of one
    (pure DP)."""
    t = Tally()
    if layout.data_parallel == 1:
        return t
    if layers:
        t.add(_layer_numel(m, layout) * prec.compute, layers)
    tail = next((g for g in groups(m, layout, stage) if g.name == "norm + lm_head"), None)
    if tail is not None:
        t.add(tail.padded_numel(layout.fsdp) * prec.compute)
    return t


def layer_backward(m: ModelSpec, tp: int, tokens: int, a: int) -> Tally:
    """Temporaries of a decoder layer's backward at its largest: gradients of three MLP-wide activations."""
    width = (m.expert_intermediate * m.experts_per_token if m.experts else m.intermediate) // tp
    return Tally().add(tokens * width * a, 3)


def backward_end_buffers(m: ModelSpec, layout: Layout, prec: Precision) -> Tally:
    """While FSDP2 reduces the first layer's gradients, the last reduction of backward (memory snapshots of measured
    steps show it): the layer's gathered weight, the flat reduce-scatter input (reduce dtype) and its output shard,
    which becomes the layer's sharded gradient. Over FSDP groups of two or more the gradients autograd produced
    (one tensor per parameter, compute dtype) are still referenced then; over a group of one (pure DP) FSDP2
    copies input to output and they are already freed."""
    t = Tally()
    if layout.data_parallel == 1:
        return t
    layer = next(g for g in groups(m, layout) if g.name == "decoder layer")
    if layout.fsdp > 1:
        for s in layer.shapes:
            t.add(s[0] * _numel(s[1:]) * prec.compute)
    return t.add(layer.padded_numel(layout.fsdp) * prec.compute) + reduction_buffers(m, layout, prec)


def reduction_buffers(m: ModelSpec, layout: Layout, prec: Precision) -> Tally:
    """FSDP2's reduce-scatter of one decoder layer's gradients: the flat input and this rank's output shard."""
    numel = _layer_numel(m, layout)
    return Tally().add(numel * prec.reduce).add(numel // layout.fsdp * prec.reduce)


def _layer_grads(m: ModelSpec, layout: Layout, element: int) -> Tally:
    layer = next(g for g in groups(m, layout) if g.name == "decoder layer")
    t = Tally()
    for s in layer.shard_shapes(layout.fsdp):
        t.add(element * _numel(s))
    return t


def zero1_numel(m: ModelSpec, layout: Layout, stage: int = 0) -> int:
    """Elements of ZeRO-1's flat buffers: the stage's parameters, padded to a multiple of DP."""
    total = sum(g.count * g.padded_numel(1) for g in groups(m, layout, stage))
    return -(-total // layout.dp) * layout.dp


def in_flight(layout: Layout, stage: int, micro_steps: int) -> int:
    """Micro-batches whose activations stage `stage` holds at once under 1F1B (all of them without pipelining:
    gradient accumulation frees each micro-batch's activations before the next starts, so 1)."""
    if layout.pp == 1:
        return 1
    return max(1, min(layout.pp - stage, micro_steps))


def memory_per_core(m: ModelSpec, layout: Layout, prec: Precision, micro_batch: int, seq_len: int,
                    checkpointing: str, capacity: int, *, micro_steps: int = 1, zero1: bool = False,
                    sp: bool = False, reserve: int = 0) -> Memory:
    """The estimated peak of one core: of the first or last pipeline stage, whichever is higher."""
    if checkpointing not in CHECKPOINTING:
        raise ValueError(f"checkpointing {checkpointing!r} is not one of {', '.join(CHECKPOINTING)}")
    stages = {0, layout.pp - 1}
    best: Memory | None = None
    for stage in sorted(stages):
        mem = _stage_memory(m, layout, prec, micro_batch, seq_len, checkpointing, capacity, stage, micro_steps,
                            zero1, sp and layout.tp > 1, reserve)
        if best is None or (mem.reserved, mem.total) > (best.reserved, best.total):
            best = mem
    assert best is not None
    return best


def _stage_memory(m: ModelSpec, layout: Layout, prec: Precision, micro_batch: int, seq_len: int, checkpointing: str,
                  capacity: int, stage: int, micro_steps: int, zero1: bool, sp: bool, reserve: int) -> Memory:
    tokens = micro_batch * seq_len
    a = prec.compute
    fsdp_applied = layout.data_parallel > 1 and not zero1
    lay = layout if fsdp_applied else Layout(layout.tp, 1, 1, layout.pp)  # buffers of FSDP2 only when it is applied
    params = state_tally(m, layout, prec.param, stage)
    grad_bytes = prec.reduce if prec.param == 4 else prec.param
    grads = state_tally(m, layout, grad_bytes, stage)
    if zero1:  # one flat master shard of the parameters and AdamW's two moments of it, 1/DP each
        padded = zero1_numel(m, layout, stage)
        moments = Tally().add(padded // layout.dp * prec.param, 3)
    else:
        moments = state_tally(m, layout, prec.param, stage).times(2)
    layers = next(g.count for g in groups(m, layout, stage) if g.name == "decoder layer")
    one = layer_activations(m, layout.tp, tokens, a, checkpointing, sp).times(layers)  # one micro-batch's, saved
    # full recomputation: during a layer's backward that layer's activations are alive again, one layer at a time
    recomputed = layer_activations(m, layout.tp, tokens, a, "none", sp) if checkpointing == "full" else Tally()
    k = in_flight(layout, stage, micro_steps)
    # two moments of backward hold everything saved: the last layer's (its recomputed activations, the gathered
    # weights, the MLP's gradients), and on the last stage, before it, the loss's
    acts = one.times(k) + recomputed
    if checkpointing == "full" and fsdp_applied:
        # every layer's backward then starts as high as the last one's, and FSDP2 frees a reduce-scatter's flat
        # input and output shard only when it issues the next: the layer above's are alive during the recomputation,
        # with this layer gathered (the next is prefetched later); its own gradients come as its recomputed
        # activations are freed
        buffers = fsdp_buffers(m, lay, prec, stage, layers=1) + reduction_buffers(m, lay, prec)
    else:
        buffers = fsdp_buffers(m, lay, prec, stage) + layer_backward(m, layout.tp, tokens, a)
    at_loss = False
    if stage == layout.pp - 1:
        # (with TP the gathered layers are still alive then: measured steps show it)
        loss = fsdp_buffers(m, lay, prec, stage, layers=2 if layout.tp > 1 else 0) + \
            loss_buffers(m, layout.tp, tokens, a, vocab_parallel=sp, sharded=fsdp_applied)
        if layout.tp > 1 and not sp:
            # the LM head's forward: the kept tail gathered, and the flat output of its all-gather, which FSDP2
            # frees only at its next all-gather (the last layer's, in backward)
            head = fsdp_buffers(m, lay, prec, stage, layers=0).times(2) + \
                head_forward_buffers(m, layout.tp, tokens, a)
            if head.total > loss.total:
                loss = head
        if one.times(k).total + loss.total > acts.total + buffers.total:
            acts, buffers, at_loss = one.times(k), loss, True
    if layout.pp > 1:  # the activation received from the previous stage and the gradient sent back
        buffers = buffers.add(tokens * m.hidden * a // (layout.tp if sp else 1), 2)
    if zero1:  # after backward the gradients are copied into one flat buffer for the reduce-scatter
        end = Tally().add(zero1_numel(m, layout, stage) * grad_bytes)
        end_total = end.total
    else:
        end = backward_end_buffers(m, lay, prec)
        # the first layer's sharded gradient is the reduce-scatter output counted in the buffers
        end_total = end.total - _layer_grads(m, lay, grad_bytes).total
    accumulated = Tally()
    if micro_steps > 1:  # gradient accumulation: a later micro-batch's backward starts with the gradients alive
        later = one.times(k if micro_steps > k else k - 1) + (Tally() if at_loss else recomputed)
        if grads.total + later.total > acts.total:
            acts, accumulated = later, grads
    start = acts.total + buffers.total + accumulated.total >= grads.total + end_total
    peak = params + moments + ((acts + buffers + accumulated) if start else (grads + end))
    return Memory(params=params.total, grads=grads.total, optimizer=moments.total, activations=acts.total,
                  buffers=buffers.total, capacity=capacity, backward_end_buffers=end_total, reserve=reserve,
                  stage=stage, segments=peak.reserved, accumulated=accumulated.total)
