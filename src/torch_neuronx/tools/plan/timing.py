"""An estimated step time from a roofline of the instance: an estimate, calibrated, never a measurement.

Per micro-batch and pipeline stage:

* compute, by op class, each the larger of its compute time and its HBM
  traffic over the bandwidth. Matmuls: the stage's training FLOPs (6 per
  parameter per token for forward and backward, attention's 12 x sequence x heads x head_dim per layer, the LM
  head on the last stage, one more forward under full recomputation) split
  over TP, at the chip's dense peak per core times ``COMPUTE_EFFICIENCY``, or
  the stage's weights read three times at HBM bandwidth if that is slower.
  Matmuls of an FP32 model run at the BF16 peak when the compiler casts them
  (neuronx-cc's default ``--auto-cast matmult``; ``autocast="none"`` times
  them at the FP32 peak). The memory-bound classes (norms, residual adds,
  the activation, RoPE, eager attention's softmax, the loss; and per step
  the optimizer with the precision recipe's casts): their HBM bytes at the
  core's bandwidth times ``HBM_EFFICIENCY`` (:func:`vector_bytes`), with
  the activation's passes by architecture (``ACTIVATION_PASSES``) and, for
  FP32 activations whose matmuls the compiler casts, the casts of every
  matmul operand (:func:`cast_bytes`);
* tensor-parallel collectives and pipeline sends: on the critical path;
* FSDP's gathers and reduce-scatters: overlapped with the micro-batch's
  compute (FSDP2 prefetches), only the excess is exposed.

A step is ``micro-batches + stages - 1`` slots of the slowest stage's
micro-batch (1F1B: the pipeline fills and drains once per step), then the
data-parallel gradient reduction (HSDP's all-reduce overlaps the last
micro-batch's backward unless ``grad_overlap`` is False, as with torch-xla's
``xm.reduce_gradients`` after the backward; ZeRO-1's reduce-scatter and
parameter all-gather do not), then the gradient clipping (``CLIP_PASSES``)
and AdamW's pass over the state, with the gradient accumulation's reads and
the precision recipe's casts (:func:`optimizer_bytes_moved`).

A collective's time is the sum over the links it crosses of the bytes each
core moves there (``comm.level_bytes``: a hierarchical ring) over the core's
share of that link's bandwidth (HBM inside a chip, NeuronLink per chip /
cores per chip, EFA per instance / cores per instance: every core runs its
own group's collective at once) times ``COMM_EFFICIENCY``.

``COMPUTE_EFFICIENCY`` and ``HBM_EFFICIENCY`` are fitted to part of AWS's
published Trn1 training results and checked against the rest
(``calibration.py``, docs/plan.md); ``COMM_EFFICIENCY`` is assumed.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_neuronx.tools.plan.comm import Collective, level_bytes
from torch_neuronx.tools.plan.layouts import Hardware, Layout
from torch_neuronx.tools.plan.model import ModelSpec
from torch_neuronx.tools.plan.precision import Precision
from torch_neuronx.tools.plan.tensors import stage_layers

# Fitted by torch_neuronx.tools.plan.calibration.fit on the rows marked "fitted" there (docs/plan.md).
COMPUTE_EFFICIENCY = 0.39  # share of the tensor engine's dense peak the matmuls attain
HBM_EFFICIENCY = 0.75  # share of the HBM bandwidth the memory-bound passes (norms, activations, optimizer) attain
COMM_EFFICIENCY = 0.70  # share of the link bandwidth a ring collective attains
AUTOCAST = ("matmult", "none")
# Passes over the attention scores (heads x S per token) by attention path. "flash": a kernel keeps them on chip (none).
# "eager": materialised in HBM with attention dropout, as Transformers' eager path runs BERT (dropout 0.1): written by
# the QK matmul, scaled (read, write), masked (read, write), softmax (read, write), dropout (read, mask written, output
# written), read by the PV matmul. NeMo's core attention (neuronx-nemo-megatron's CoreAttention, its only path before
# SDK 2.19 and its default after) makes the same passes: baddbmm writes them scaled by its alpha (1/(sqrt(head_dim) x
# layer number) with apply_query_key_layer_scaling), apex's FusedScaleMaskSoftmax, unfused on Neuron, multiplies by the
# layer-number coefficient again (read, write), masks and takes the softmax, then dropout and the PV bmm.
# "eager_no_dropout": the same without the dropout's three (attention dropout 0, as in NeMo's Llama recipe: ATen's
# dropout returns its input at p=0).
# "eager_no_scale_no_dropout": also without the coefficient's two (apply_query_key_layer_scaling False, as NeMo's SDK
# 2.14 Llama2-13B recipe sets).
# "fused": the same graph with every pass kept on chip by the compiler (a row of scores fits in SBUF); no published
# source says neuronx-cc does this, and the calibration reports it only as a sensitivity. Only "flash" skips a causal
# mask's upper half
SCORE_PASSES = {"flash": 0, "eager": 11, "eager_no_dropout": 8, "eager_no_scale_no_dropout": 6, "fused": 0}
# Clipping the gradients by their global norm before the update: the norm reads every gradient, the scaling reads and
# writes it. Every recipe calibrated here clips (the Hugging Face BERT script's clip_grad_norm_(..., 1.0), NxD's and
# NeMo's max-norm 1.0), as does Transformers' Trainer by default (max_grad_norm=1.0)
CLIP_PASSES = 3
# The MLP's activation, in passes over the planner's 3-matrix MLP width per token: SwiGLU (Llama) reads the gate and
# the up projection and writes silu(gate) and the product (five passes); a GELU MLP (BERT, GPT-3) of the same
# parameters is 1.5x as wide with one read and one write (2 x 1.5 = three passes of the 3-matrix width)
ACTIVATION_PASSES = {"swiglu": 5, "gelu": 3}


@dataclass(frozen=True)
class StepTime:
    compute: float
    comm: float  # all communication, overlapped or not
    exposed_comm: float  # the part that adds to the step
    total: float
    tokens_per_s: float
    bubble: float = 0.0  # pipeline fill and drain
    optimizer: float = 0.0
    comm_by_scope: tuple[tuple[str, float], ...] = ()  # seconds per step, by links
    by_class: tuple[tuple[str, float], ...] = ()  # seconds per step of the slowest stage, by op class

    def as_dict(self) -> dict[str, object]:
        return {"compute": self.compute, "comm": self.comm, "exposed_comm": self.exposed_comm,
                "pipeline_bubble": self.bubble, "optimizer": self.optimizer, "total": self.total,
                "tokens_per_s": self.tokens_per_s, "comm_by_scope": dict(self.comm_by_scope),
                "compute_by_class": dict(self.by_class)}


def layer_flops_per_token(m: ModelSpec, seq_len: int, causal: bool = True) -> float:
    """Forward FLOPs per token of one decoder layer (only the routed experts of an MoE layer run).

    Attention's two matmuls (scores, weighted values) cost 4 x S x heads x head_dim per token over the whole
    sequence; a causal kernel (flash attention, SDPA's is_causal) skips the masked half."""
    mlp = m.mlp_params
    if m.experts:
        mlp = m.experts_per_token * 3 * m.hidden * m.expert_intermediate + m.hidden * m.experts
    return 2 * (m.attention_params + mlp) + (2 if causal else 4) * seq_len * m.heads * m.head_dim


FORWARDS = {"none": 3.0, "selective": 3.0, "full": 4.0}  # forwards per step, by checkpointing


def passes(checkpointing: str) -> float:
    """Forward + backward = 3 forwards; +1 forward when every layer is recomputed."""
    if checkpointing not in FORWARDS:
        raise ValueError(f"checkpointing {checkpointing!r} is not one of {', '.join(FORWARDS)}")
    return FORWARDS[checkpointing]


def attention_passes(checkpointing: str, attention: str) -> float:
    """:func:`passes` for attention's core (QK, the score passes, PV): selective checkpointing recomputes it in the
    backward (Megatron's core-attention recompute), +1 forward where the scores are materialised; a flash kernel's
    backward recomputes them on chip, inside the three."""
    if attention not in SCORE_PASSES:
        raise ValueError(f"attention {attention!r} is not one of {', '.join(SCORE_PASSES)} (timing.SCORE_PASSES)")
    return passes(checkpointing) + (1.0 if checkpointing == "selective" and attention != "flash" else 0.0)


def flops_per_token(m: ModelSpec, seq_len: int, checkpointing: str, causal: bool = True) -> float:
    """Training FLOPs per token of the whole model (the embedding is a lookup)."""
    return passes(checkpointing) * (m.layers * layer_flops_per_token(m, seq_len, causal) + 2 * m.vocab * m.hidden)


def link_bandwidth(hw: Hardware, where: str) -> float:
    """Bytes per second one core gets on links of this scope when every core communicates at once."""
    chip = hw.instance.chip
    if where == "chip":
        return chip.hbm_bandwidth_gbps * 1e9 / hw.cores_per_chip
    if where == "neuronlink":
        return chip.neuronlink_gbps * 1e9 / hw.cores_per_chip
    return hw.instance.efa_gbps / 8 * 1e9 / hw.cores_per_instance


def collective_split(c: Collective, hw: Hardware, comm_efficiency: float | None = None) -> dict[str, float]:
    """Seconds of collective `c` (all its calls in the step) on each kind of link."""
    eff = COMM_EFFICIENCY if comm_efficiency is None else comm_efficiency
    return {where: b / (link_bandwidth(hw, where) * eff) for where, b in level_bytes(c.collective, c.bytes,
                                                                                     c.levels).items() if b}


def collective_seconds(c: Collective, hw: Hardware, comm_efficiency: float | None = None) -> float:
    return sum(collective_split(c, hw, comm_efficiency).values())


def core_peak(hw: Hardware, prec: Precision, autocast: str) -> float:
    """Dense matmul FLOP/s of one core: BF16 when the model computes in BF16 or the compiler casts FP32 matmuls."""
    chip = hw.instance.chip
    bf16 = prec.bf16_compute or autocast == "matmult"
    return (chip.bf16_tflops if bf16 else chip.fp32_tflops) * 1e12 / hw.cores_per_chip


def hbm_per_core(hw: Hardware) -> float:
    """Bytes per second of HBM one core gets when every core streams at once."""
    return hw.instance.chip.hbm_bandwidth_gbps * 1e9 / hw.cores_per_chip


def vector_bytes(m: ModelSpec, layout: Layout, prec: Precision, micro_batch: int, seq_len: int, checkpointing: str,
                 stage: int, sp: bool = False, attention: str = "flash", mlp: str = "swiglu",
                 rope: bool = True, autocast: str = "matmult") -> dict[str, float]:
    """HBM bytes one core moves for one micro-batch's memory-bound passes on pipeline stage `stage`, by op class.

    Every pass reads its inputs and writes its output once at its element size (``prec.compute``; a norm's or a
    softmax's FP32 intermediates stay on chip, in the compiler's fused kernel). Per decoder layer, forward: two
    norms (read, write), two residual adds (two reads, one write), the activation (``ACTIVATION_PASSES[mlp]``:
    SwiGLU's silu of the gate and its product with up, five MLP-wide passes; GELU three), RoPE on q and k (read,
    write, cos/sin; none with `rope` False: learned absolute positions are added once, with the embedding), and
    the attention scores (``SCORE_PASSES[attention]`` over them: none with a flash kernel, which keeps them on
    chip). Backward moves twice the forward's bytes (the incoming gradient and the saved input read, the outgoing
    gradient written), full recomputation one forward more. H-wide passes are split over TP under sequence
    parallelism; the loss upcasts the vocabulary-wide logits (last stage).

    FP32 activations with the compiler's matmul auto-cast (or torch.autocast: AMP) add the casts (:func:`cast_bytes`):
    every matmul operand is read in FP32 and written as the BF16 copy the tensor engine reads."""
    tp = layout.tp
    x = prec.compute
    tokens = micro_batch * seq_len
    h_tokens = tokens / tp if sp and tp > 1 else tokens
    q, kv = m.heads * m.head_dim / tp, m.kv_heads * m.head_dim / tp
    width = (m.expert_intermediate * m.experts_per_token if m.experts else m.intermediate) / tp
    fwd = {
        "norms": 2 * h_tokens * m.hidden * 2 * x,
        "residual": 2 * h_tokens * m.hidden * 3 * x,
        "activation": tokens * width * ACTIVATION_PASSES[mlp] * x,
        "rope": tokens * (q + kv) * 3 * x if rope else 0.0,
    }
    layers = stage_layers(m.layers, layout.pp, stage)
    out = {k: v * passes(checkpointing) * layers for k, v in fwd.items()}
    core = attention_passes(checkpointing, attention)  # refuses an unknown path
    out["softmax"] = tokens * (m.heads / tp) * seq_len * SCORE_PASSES[attention] * x * core * layers
    if prec.compute == 4 and autocast == "matmult":
        out["autocast"] = cast_bytes(m, layout, micro_batch, seq_len, checkpointing, stage, sp, attention)
    if stage == layout.pp - 1:  # cross-entropy: the logits read and upcast, softmax and its gradient in FP32
        out["loss"] = tokens * m.vocab / tp * (2 * x + 4 * 4)
    return out


def cast_bytes(m: ModelSpec, layout: Layout, micro_batch: int, seq_len: int, checkpointing: str, stage: int,
               sp: bool = False, attention: str = "flash") -> float:
    """HBM bytes one core moves for one micro-batch casting FP32 matmul operands to BF16 (read 4 bytes, write 2).

    Per layer, forward: the inputs of the QKV, output, MLP-in and MLP-down matmuls and q, k, v; backward: the
    gradients arriving at each of them (used by both the input-gradient and the weight-gradient matmul); with eager
    attention also the probabilities (forward) and the scores' gradient (backward), heads x S per token. Each cast
    once per pass (the forward's copies are reused by the backward's weight gradients); the stage's weights once per
    micro-batch (one graph holds the forward and the backward, so the backward reuses the forward's BF16 copy)."""
    tp = layout.tp
    tokens = micro_batch * seq_len
    h = m.hidden / tp if sp and tp > 1 else m.hidden
    q, kv = m.heads * m.head_dim / tp, m.kv_heads * m.head_dim / tp
    width = (m.expert_intermediate * m.experts_per_token if m.experts else m.intermediate) / tp
    again = attention_passes(checkpointing, attention) - passes(checkpointing)  # selective's recomputed core
    scores = (m.heads / tp) * seq_len if SCORE_PASSES[attention] else 0.0
    forward = 3 * h + width + q + 2 * kv + scores
    backward = (q + 2 * kv) + 2 * h + 2 * width + q + scores
    recompute = 1.0 if checkpointing == "full" else 0.0
    core = (q + 2 * kv + scores) * again  # the recomputed QK and PV cast q, k, v and the probabilities again
    layers = stage_layers(m.layers, layout.pp, stage)
    elements = layers * tokens * ((1 + recompute) * forward + backward + core) + layers * m.layer_params / tp
    return elements * (4 + 2)


def optimizer_bytes_moved(state_elements: float, prec: Precision, micro_steps: int, gathered_elements: float) -> float:
    """HBM bytes of one optimizer step on one core, with the precision recipe's casts.

    AdamW reads the weight, its gradient and two moments and writes the weight and the moments: ``6 p + g`` bytes
    per element of this core's optimizer state (`state_elements`; ``p`` the state's, ``g`` the gradient's element
    size). BF16 compute with FP32 state (bf16-mixed) also casts the weights it computes with (read FP32, write
    BF16) and the gradients back to FP32 for the reduction (read BF16, write FP32), per micro-batch, over the
    `gathered_elements` it computes with. Gradient clipping by global norm (``CLIP_PASSES``) before the update. Gradient
    accumulation: every micro-batch after the first reads the
    accumulated gradient (at ``g`` bytes) to add its own, and, when the gradient is kept at the compute precision,
    writes it back (the mixed recipe's cast already writes it)."""
    g = prec.reduce if prec.param == 4 else prec.param
    moved = state_elements * (6 * prec.param + g + CLIP_PASSES * g)
    if prec.param != prec.compute:
        moved += micro_steps * gathered_elements * 2 * (prec.param + prec.compute)
    moved += max(0, micro_steps - 1) * gathered_elements * g * (1 if prec.param != prec.compute else 2)
    return moved


def stage_compute(m: ModelSpec, hw: Hardware, layout: Layout, prec: Precision, micro_batch: int, seq_len: int,
                  checkpointing: str, stage: int, autocast: str, efficiency: float, causal: bool = True,
                  sp: bool = False, attention: str = "flash", hbm_efficiency: float | None = None,
                  mlp: str = "swiglu", rope: bool = True) -> float:
    """Seconds of one micro-batch's forward and backward on a core of pipeline stage `stage`."""
    return sum(stage_classes(m, hw, layout, prec, micro_batch, seq_len, checkpointing, stage, autocast, efficiency,
                             causal, sp, attention, hbm_efficiency, mlp, rope).values())


def stage_classes(m: ModelSpec, hw: Hardware, layout: Layout, prec: Precision, micro_batch: int, seq_len: int,
                  checkpointing: str, stage: int, autocast: str, efficiency: float, causal: bool = True,
                  sp: bool = False, attention: str = "flash", hbm_efficiency: float | None = None,
                  mlp: str = "swiglu", rope: bool = True) -> dict[str, float]:
    """Seconds of one micro-batch on a core of stage `stage`, by op class: each the larger of its compute time and
    its HBM traffic over the bandwidth. Matmuls: FLOPs at the dense peak x `efficiency`, or the weights read three
    times; the memory-bound classes (:func:`vector_bytes`): their bytes at HBM bandwidth x `hbm_efficiency` (their
    arithmetic intensity, a few operations per element, is far below the chip's balance of ~115 FLOP per byte at
    BF16, so the bandwidth term is the larger)."""
    tokens = micro_batch * seq_len
    layers = stage_layers(m.layers, layout.pp, stage)
    # only a flash kernel skips a causal mask's upper half: materialised scores are computed whole, then masked
    skip = causal and attention == "flash"
    fwd = layers * layer_flops_per_token(m, seq_len, skip) + (2 * m.vocab * m.hidden if stage == layout.pp - 1 else 0)
    core = layers * (2 if skip else 4) * seq_len * m.heads * m.head_dim  # attention's two matmuls, in `fwd`
    flops = tokens * (fwd * passes(checkpointing)
                      + core * (attention_passes(checkpointing, attention) - passes(checkpointing))) / layout.tp
    hbm = hbm_per_core(hw)
    params = layers * m.layer_params + (m.embedding_params if stage == layout.pp - 1 else 0)
    weight_traffic = 3 * params / layout.tp * prec.compute  # weights read in forward and twice in backward
    out = {"matmul": max(flops / (core_peak(hw, prec, autocast) * efficiency), weight_traffic / hbm)}
    eff = HBM_EFFICIENCY if hbm_efficiency is None else hbm_efficiency
    for name, nbytes in vector_bytes(m, layout, prec, micro_batch, seq_len, checkpointing, stage, sp,
                                     attention, mlp, rope, autocast).items():
        out[name] = nbytes / (hbm * eff)
    return out


def step_time(m: ModelSpec, hw: Hardware, layout: Layout, prec: Precision, global_batch: int, seq_len: int,
              micro_steps: int, stage_comms: dict[int, list[Collective]], checkpointing: str, optimizer_bytes: int,
              *, micro_batch: int = 1, autocast: str = "matmult", zero1: bool = False,
              compute_efficiency: float | None = None, comm_efficiency: float | None = None,
              causal: bool = True, sp: bool = False, attention: str = "flash",
              hbm_efficiency: float | None = None, mlp: str = "swiglu", rope: bool = True,
              grad_overlap: bool = True) -> StepTime:
    """The estimated time of one optimizer step of `global_batch` sequences.

    `stage_comms`: the collectives of a core of each pipeline stage considered (the first and the last);
    `optimizer_bytes`: the HBM bytes one optimizer step moves per core (:func:`optimizer_bytes_moved`); `mlp`,
    `rope`: the architecture's element-wise passes (:func:`vector_bytes`); `grad_overlap` False: the data-parallel
    gradient all-reduce starts after the backward (torch-xla's ``xm.optimizer_step`` reduces every gradient in one
    call once ``loss.backward()`` has returned), True: it overlaps the last micro-batch's backward (DDP's and
    FSDP's buckets)."""
    eff = COMPUTE_EFFICIENCY if compute_efficiency is None else compute_efficiency
    hbm = hbm_per_core(hw) * (HBM_EFFICIENCY if hbm_efficiency is None else hbm_efficiency)
    slot = compute_mb = 0.0
    classes: dict[str, float] = {}
    comm_total = exposed_step = 0.0
    by_scope: dict[str, float] = {}
    per_stage_step_comm: list[float] = []
    for stage, comms in stage_comms.items():
        by_class = stage_classes(m, hw, layout, prec, micro_batch, seq_len, checkpointing, stage, autocast, eff,
                                 causal, sp, attention, hbm_efficiency, mlp, rope)
        c_mb = sum(by_class.values())
        critical = overlapped = 0.0
        step_level = 0.0
        stage_comm = 0.0
        for c in comms:
            split = collective_split(c, hw, comm_efficiency)
            t = sum(split.values())
            stage_comm += t
            if stage == min(stage_comms):
                for k, v in split.items():
                    by_scope[k] = by_scope.get(k, 0.0) + v
            if not c.per_micro_batch:
                # HSDP's all-reduce overlaps the last micro-batch's backward (2/3 of its compute); ZeRO-1's does not,
                # nor one that starts only once the backward is done (`grad_overlap` False)
                step_level += t if zero1 or not grad_overlap else max(0.0, t - c_mb * 2 / 3)
            elif c.group in ("tp", "pp"):
                critical += t / micro_steps
            else:
                overlapped += t / micro_steps
        s = c_mb + critical + max(0.0, overlapped - c_mb)
        if s > slot:
            slot, compute_mb, classes = s, c_mb, by_class
        per_stage_step_comm.append(step_level)
        comm_total = max(comm_total, stage_comm)
    exposed_step = max(per_stage_step_comm)
    slots = micro_steps + layout.pp - 1
    optimizer = optimizer_bytes / hbm
    total = slots * slot + exposed_step + optimizer
    compute = micro_steps * compute_mb
    bubble = (layout.pp - 1) * slot
    exposed = total - compute - bubble - optimizer
    tokens = global_batch * seq_len
    per_step = tuple((k, v * micro_steps) for k, v in classes.items()) + (("optimizer", optimizer),)
    return StepTime(compute, comm_total, max(0.0, exposed), total, tokens / total, bubble, optimizer,
                    tuple(sorted(by_scope.items())), per_step)
