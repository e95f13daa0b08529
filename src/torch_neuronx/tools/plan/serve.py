"""The serving model: time to first token, time per output token and HBM per core of one bucket, from physics.

Why it exists: a serving team chooses a TP degree, a batch size and static
buckets before it rents Inf2/Trn1/Trn2 instances; this module predicts what
each choice costs, from the same model reader, hardware table and comm model
as the training planner.

* Context encoding (TTFT) is compute-bound: the prompt's FLOPs per core
  (each core holds ``ceil(heads / TP)`` query heads and ``ceil(width / TP)``
  of the MLP: Transformers NeuronX pads what does not divide) over the core's
  dense peak times ``COMPUTE_EFFICIENCY`` (or the weights read once, if
  slower), plus two all-reduces of ``batch x prompt x hidden`` per layer,
  plus a fixed overhead.
* Token generation (TPOT) is memory-bound: the weight bytes of a core plus
  the KV-cache bytes it reads per step (every slot of the bucket: a static
  cache attends over its whole length), over the core's HBM bandwidth times
  ``HBM_EFFICIENCY``, plus two all-reduces of ``batch x hidden`` per layer,
  plus a fixed overhead.
* A collective costs its bytes over the links it crosses (``comm.level_bytes``,
  ``timing.link_bandwidth``, ``timing.COMM_EFFICIENCY``).
* KV heads: a core holds ``ceil(kv_heads / TP)`` of them; when TP exceeds the
  KV heads they are replicated, one per core (NxD Inference's and
  Transformers NeuronX's GQA sharding).

The five efficiency and overhead factors are fitted on AWS's published Inf2 decoder tables only
(``serve_calibration.py``; docs/serve.md has every row, held-out Trn1/Trn2 included).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch_neuronx.tools.plan.comm import level_bytes, levels
from torch_neuronx.tools.plan.layouts import Hardware
from torch_neuronx.tools.plan.memory import runtime_reserve
from torch_neuronx.tools.plan.model import ModelSpec
from torch_neuronx.tools.plan.timing import COMM_EFFICIENCY, link_bandwidth

# Fitted by serve_calibration.fit() on the Inf2 rows of AWS's decoder tables (docs/serve.md regenerates them).
COMPUTE_EFFICIENCY = 0.230
HBM_EFFICIENCY = 0.473  # of 880.47 GB/s per Inf2 chip (AWS: 820 GiB/s); 0.508 of the 820 GB/s used before
# Seconds per all-reduce call beyond its bytes: not fitted -- the published tables cannot tell it from the per-call
# overheads (a fit drives it to zero), so those carry it; Factors(allreduce_latency=...) adds it.
ALLREDUCE_LATENCY = 0.0
CONTEXT_OVERHEAD = 23.5e-3  # seconds per context-encoding call (host dispatch, input transfer, sampling)
STEP_OVERHEAD = 5.19e-3  # seconds per token-generation step (host dispatch, sampling, cache update)
ATTENTION_EFFICIENCY = 0.0509  # share of the peak the prompt's attention attains (softmax on the vector engines)
ATTENTION_FLOPS = 4  # per prompt token x key x head x head_dim: the full masked score matrix (no causal skipping)

PRECISIONS = ("bf16", "fp16")
WEIGHTS = {"bf16": 2, "int8": 1}
COMPUTE_BYTES = 2  # bf16 and fp16 activations and KV cache


@dataclass(frozen=True)
class Factors:
    compute_efficiency: float = COMPUTE_EFFICIENCY
    attention_efficiency: float = ATTENTION_EFFICIENCY
    hbm_efficiency: float = HBM_EFFICIENCY
    allreduce_latency: float = ALLREDUCE_LATENCY
    context_overhead: float = CONTEXT_OVERHEAD
    step_overhead: float = STEP_OVERHEAD


@dataclass(frozen=True)
class Shard:
    """What one core of a TP group holds of each layer (padded up where TP does not divide)."""

    heads: int
    kv_heads: int
    intermediate: int
    vocab: int


def shard(m: ModelSpec, tp: int) -> Shard:
    kv = 1 if tp >= m.kv_heads else math.ceil(m.kv_heads / tp)
    width = m.expert_intermediate if m.experts else m.intermediate
    return Shard(math.ceil(m.heads / tp), kv, math.ceil(width / tp), math.ceil(m.vocab / tp))


def weight_bytes(m: ModelSpec, tp: int, weights: str = "bf16", element: int = COMPUTE_BYTES) -> int:
    """Bytes of weights one core holds: the layers' matmul weights at the storage dtype, the vocabulary-parallel
    embedding and LM head and the norms at 16 bits."""
    s = shard(m, tp)
    experts = m.experts or 1
    per_layer = m.hidden * m.head_dim * (2 * s.heads + 2 * s.kv_heads) + experts * 3 * m.hidden * s.intermediate
    embeddings = (1 if m.tied_embeddings else 2) * s.vocab * m.hidden
    return m.layers * per_layer * WEIGHTS.get(weights, element) + (embeddings + (2 * m.layers + 1) * m.hidden) * element


def active_weight_bytes(m: ModelSpec, tp: int, weights: str = "bf16") -> int:
    """Weight bytes one decode step reads per core: the embedding row is a lookup, only routed experts run."""
    s = shard(m, tp)
    experts = min(m.experts, m.experts_per_token) if m.experts else 1
    per_layer = m.hidden * m.head_dim * (2 * s.heads + 2 * s.kv_heads) + experts * 3 * m.hidden * s.intermediate
    return m.layers * per_layer * WEIGHTS[weights] + s.vocab * m.hidden * COMPUTE_BYTES


def kv_bytes(m: ModelSpec, tp: int, batch: int, length: int, element: int = COMPUTE_BYTES) -> int:
    """Bytes of one core's static KV cache: K and V, every layer, `batch` rows of `length` slots."""
    return 2 * m.layers * batch * length * shard(m, tp).kv_heads * m.head_dim * element


def prefill_flops(m: ModelSpec, tp: int, batch: int, prompt: int) -> tuple[float, float]:
    """One core's FLOPs of a context-encoding pass: (matmuls, attention). The matmuls: the layers' weights for every
    prompt token and the LM head for the last token only; attention: 4 x prompt x heads x head_dim per token (the
    scores and the weighted values over the whole masked prompt)."""
    s = shard(m, tp)
    experts = m.experts_per_token if m.experts else 1
    matmul = 2 * (m.hidden * m.head_dim * (2 * s.heads + 2 * s.kv_heads) + experts * 3 * m.hidden * s.intermediate)
    attention = ATTENTION_FLOPS * prompt * s.heads * m.head_dim
    return batch * (prompt * m.layers * matmul + 2 * s.vocab * m.hidden), batch * prompt * m.layers * attention


def allreduce_seconds(hw: Hardware, tp: int, nbytes: float, calls: int, f: Factors) -> float:
    """`calls` all-reduces of `nbytes` each over a TP group of consecutive cores (a hierarchical ring)."""
    if tp <= 1:
        return 0.0
    lv = levels(hw.cores_per_chip, hw.cores_per_instance, 1, tp)
    moved = level_bytes("all_reduce", nbytes, lv)
    per_call = sum(b / (link_bandwidth(hw, where) * COMM_EFFICIENCY) for where, b in moved.items() if b)
    return calls * (f.allreduce_latency + per_call)


def core_peak(hw: Hardware) -> float:
    """Dense BF16/FP16 FLOP/s of one (logical) core."""
    return hw.instance.chip.bf16_tflops * 1e12 / hw.cores_per_chip


def core_hbm_bandwidth(hw: Hardware) -> float:
    return hw.instance.chip.hbm_bandwidth_gbps * 1e9 / hw.cores_per_chip


def ttft_seconds(m: ModelSpec, hw: Hardware, tp: int, batch: int, prompt: int, weights: str = "bf16",
                 f: Factors | None = None) -> float:
    """Time to first token of a context-encoding bucket of length `prompt` at batch `batch`."""
    f = f or Factors()
    matmul, attention = prefill_flops(m, tp, batch, prompt)
    compute = (matmul / f.compute_efficiency + attention / f.attention_efficiency) / core_peak(hw)
    reads = weight_bytes(m, tp, weights) / (core_hbm_bandwidth(hw) * f.hbm_efficiency)
    comm = allreduce_seconds(hw, tp, batch * prompt * m.hidden * COMPUTE_BYTES, 2 * m.layers, f)
    return max(compute, reads) + comm + f.context_overhead


def tpot_seconds(m: ModelSpec, hw: Hardware, tp: int, batch: int, cache_len: int, weights: str = "bf16",
                 f: Factors | None = None) -> float:
    """Time per output token of a token-generation bucket whose cache holds `cache_len` slots."""
    f = f or Factors()
    read = active_weight_bytes(m, tp, weights) + kv_bytes(m, tp, batch, cache_len)
    memory = read / (core_hbm_bandwidth(hw) * f.hbm_efficiency)
    comm = allreduce_seconds(hw, tp, batch * m.hidden * COMPUTE_BYTES, 2 * m.layers, f)
    return memory + comm + f.step_overhead


@dataclass(frozen=True)
class Memory:
    weights: int
    kv_cache: int
    activations: int
    reserve: int
    capacity: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.activations + self.reserve

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def as_dict(self) -> dict[str, int | bool]:
        return {"weights": self.weights, "kv_cache": self.kv_cache, "activations": self.activations,
                "runtime_reserve": self.reserve, "total": self.total, "capacity": self.capacity, "fits": self.fits}


def activation_bytes(m: ModelSpec, tp: int, batch: int, prompt: int, element: int = COMPUTE_BYTES) -> int:
    """The largest live activations of a context-encoding pass on one core: the residual stream and a layer's
    normed input (full width), its sharded MLP intermediates (gate, up, product) and the last token's logits
    (fp32); attention is a flash kernel (no prompt x prompt scores)."""
    s = shard(m, tp)
    tokens = batch * prompt
    return tokens * (2 * m.hidden + 3 * s.intermediate) * element + batch * s.vocab * 4


def memory(m: ModelSpec, hw: Hardware, tp: int, batch: int, cache_len: int, prompt: int, weights: str = "bf16",
           capacity: int | None = None, reserve: int | None = None, element: int = COMPUTE_BYTES) -> Memory:
    """HBM per core with a token-generation bucket of `cache_len` slots and context buckets up to `prompt`
    (`element`: bytes of an activation / cache element and of an unquantised weight)."""
    return Memory(weight_bytes(m, tp, weights, element), kv_bytes(m, tp, batch, cache_len, element),
                  activation_bytes(m, tp, batch, prompt, element),
                  runtime_reserve(hw.lnc) if reserve is None else reserve,
                  hw.hbm_per_core if capacity is None else capacity)


def tp_problems(m: ModelSpec, hw: Hardware, tp: int) -> list[str]:
    """Why a TP degree cannot serve this model on this instance (empty when it can). Heads, KV heads and widths
    that TP does not divide are padded, as Transformers NeuronX and NxD Inference do (:func:`padded`)."""
    if not 1 <= tp <= hw.cores_per_instance:
        return [f"TP={tp} is outside 1..{hw.cores_per_instance} (the NeuronCores of one {hw.instance.name})"]
    if tp > m.heads:
        return [f"TP={tp} exceeds the model's {m.heads} attention heads"]
    return []


def padded(m: ModelSpec, tp: int) -> list[str]:
    """What TP pads (each core then holds, and computes on, a padded share)."""
    width = m.expert_intermediate if m.experts else m.intermediate
    checks = (("attention heads", m.heads), ("KV heads", m.kv_heads if tp < m.kv_heads else tp),
              ("MLP width", width), ("vocabulary", m.vocab))
    return [f"{what} {n} padded to {math.ceil(n / tp) * tp}" for what, n in checks if n % tp]


# The TP degrees the Neuron inference stacks run, per instance family. Transformers NeuronX: "tensor-parallelism
# degrees 2, 8, and 32 on Trn1 and ... 2, 4, 8, 12 and 24 on Inf2" (aws-neuron-sdk
# about-neuron/transformers/generative-llm-inference-with-neuron.rst, the memory-footprint example); AWS's Inf2
# benchmark rows all use TP=24 (8 and 12 too for smaller models). Trn2: NxD Inference runs a power of two up to the
# logical NeuronCores (TP=64 at LNC=2 on trn2.48xlarge in its model cards,
# libraries/nxd-inference/models/llama3/data/card_llama33_70b.yml; 32 and 16 in its tutorials). TP=1 (one
# NeuronCore, no collective) is added everywhere: a model that fits one core runs there without a TP group.
SUPPORTED_TP = {"inf2": (1, 2, 4, 8, 12, 24), "trn1": (1, 2, 8, 32), "trn2": (1, 2, 4, 8, 16, 32, 64, 128)}


def family_tp_degrees(hw: Hardware) -> tuple[str, tuple[int, ...]]:
    """The instance family (trn1n is a Trn1) and the TP degrees the Neuron stacks run on it (:data:`SUPPORTED_TP`;
    a family without a quoted list: every degree up to its NeuronCores)."""
    family = hw.instance.name.split(".")[0].rstrip("n")
    return family, SUPPORTED_TP.get(family, tuple(range(1, hw.cores_per_instance + 1)))


def unsupported_tp(hw: Hardware, tp: int) -> str | None:
    """Why an explicit TP degree is one AWS's inference stacks do not run on this family (None when they do)."""
    family, degrees = family_tp_degrees(hw)
    if tp in degrees:
        return None
    fitting = [d for d in degrees if d <= hw.cores_per_instance]
    return (f"TP={tp} is not one of the supported TP degrees on {family.capitalize()} "
            f"({', '.join(map(str, fitting))} on {hw.instance.name}; AWS's Transformers NeuronX / NxD Inference "
            "docs); give one of those, or leave --tp out to search them")


def supported_tp_degrees(m: ModelSpec, hw: Hardware) -> list[int]:
    """TP degrees a search considers: those the Neuron stacks support on this instance family (:data:`SUPPORTED_TP`)
    that fit its NeuronCores and the model's heads (heads TP does not divide are padded, as TNx/NxDI do)."""
    degrees = family_tp_degrees(hw)[1]
    return [tp for tp in degrees if not tp_problems(m, hw, tp)]  # a group smaller than the cores leaves some idle
