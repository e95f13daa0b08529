"""An estimated step time from a roofline of the instance: an estimate, calibrated, never a measurement.

Compute: training FLOPs (6 per parameter per token for forward and backward,
plus attention's 12 x layers x sequence x heads x head_dim, plus one more
forward under full recomputation) at the chip's dense BF16 or FP32 peak times
an efficiency factor, or the HBM traffic of the weights at the chip's HBM
bandwidth if that is slower; then AdamW's pass over the state, bound by HBM.
Communication: each collective's ring traffic ((n-1)/n of the buffer, twice
for an all-reduce) over the bandwidth of its scope: HBM inside a chip,
NeuronLink inside an instance, EFA across instances. FSDP's gathers and
reduce-scatters overlap with compute (FSDP2 prefetches); tensor-parallel
all-reduces sit on the critical path. The efficiency factors are calibrated
against AWS's published Trainium training results (docs/plan.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_neuronx.tools.plan.comm import Collective
from torch_neuronx.tools.plan.layouts import Hardware, Layout
from torch_neuronx.tools.plan.model import ModelSpec
from torch_neuronx.tools.plan.precision import Precision

# Fitted to AWS's Llama-3.1-8B result on 32 x trn1.32xlarge (docs/plan.md, "Calibration").
COMPUTE_EFFICIENCY = 0.32
COMM_EFFICIENCY = 0.70  # share of the link bandwidth a ring collective attains


@dataclass(frozen=True)
class StepTime:
    compute: float
    comm: float  # all communication, overlapped or not
    exposed_comm: float  # the part that adds to the step
    total: float
    tokens_per_s: float

    def as_dict(self) -> dict[str, float]:
        return {"compute": self.compute, "comm": self.comm, "exposed_comm": self.exposed_comm, "total": self.total,
                "tokens_per_s": self.tokens_per_s}


def flops_per_token(m: ModelSpec, seq_len: int, checkpointing: str) -> float:
    """Training FLOPs per token: forward + backward (3 forwards), + 1 forward if fully recomputed."""
    active = m.total_params - (0 if m.tied_embeddings else m.embedding_params)  # the embedding is a lookup
    if m.experts:  # only the routed experts run
        active -= m.layers * (m.experts - m.experts_per_token) * 3 * m.hidden * m.expert_intermediate
    forward = 2 * active + 4 * m.layers * seq_len * m.heads * m.head_dim
    passes = {"none": 3.0, "selective": 3.0, "full": 4.0}[checkpointing]
    return forward * passes


def link_bandwidth(hw: Hardware, where: str) -> float:
    """Bytes per second one core gets on links of this scope."""
    chip = hw.instance.chip
    if where == "chip":
        return chip.hbm_bandwidth_gbps * 1e9 / hw.cores_per_chip
    if where == "neuronlink":
        return chip.neuronlink_gbps * 1e9 / hw.cores_per_chip
    return hw.instance.efa_gbps / 8 * 1e9 / hw.cores_per_instance


def collective_seconds(c: Collective, hw: Hardware) -> float:
    n = c.group_size
    # a ring all-reduce is a reduce-scatter then an all-gather: the buffer crosses the links twice
    traffic = c.bytes * (n - 1) / n * (2 if c.collective.startswith("all_reduce") else 1)
    return traffic / (link_bandwidth(hw, c.scope) * COMM_EFFICIENCY)


def step_time(m: ModelSpec, hw: Hardware, layout: Layout, prec: Precision, global_batch: int, seq_len: int,
              micro_steps: int, comms: list[Collective], checkpointing: str, state_bytes: int) -> StepTime:
    """The estimated time of one optimizer step of `global_batch` sequences; `state_bytes`: per-core weight state."""
    chip = hw.instance.chip
    peak = (chip.bf16_tflops if prec.bf16_compute else chip.fp32_tflops) * 1e12 / hw.cores_per_chip
    hbm = chip.hbm_bandwidth_gbps * 1e9 / hw.cores_per_chip
    tokens = global_batch * seq_len
    flops = tokens * flops_per_token(m, seq_len, checkpointing) / layout.world
    weight_traffic = 3 * micro_steps * m.total_params / layout.tp * prec.compute  # read weights fwd, bwd x2
    compute = max(flops / (peak * COMPUTE_EFFICIENCY), weight_traffic / hbm) + 4 * state_bytes / hbm
    comm_times = [(c, collective_seconds(c, hw)) for c in comms]
    comm = sum(t for _, t in comm_times)
    overlapped = sum(t for c, t in comm_times if c.group in ("fsdp", "dp"))
    exposed = comm - overlapped + max(0.0, overlapped - compute)
    total = compute + exposed
    return StepTime(compute, comm, exposed, total, tokens / total)
