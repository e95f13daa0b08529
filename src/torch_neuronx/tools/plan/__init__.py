"""``torch-neuronx plan``: choose the parallel layout and the padding policy before renting the instance.

    >>> from torch_neuronx.tools.plan import plan
    >>> result = plan("config.json", instance="trn1.32xlarge", global_batch=32, seq_len=4096)  # doctest: +SKIP
    >>> result.best.layout, result.as_dict()["layouts"][0]["step_time_s"]  # doctest: +SKIP

For a model (a Hugging Face config or model directory, a config object, or
``module:function``) and instances, it enumerates every TP x PP x FSDP x DP
layout the model allows (optionally with ZeRO-1 or sequence parallelism; KV
heads replicated when TP exceeds them, as NeuronX Distributed does),
estimates each one's memory per core (allocated, the allocator's reserved
bytes and the Neuron runtime's share), collectives per step split by links
(chip, NeuronLink, EFA) and step time (a roofline by op class with two
efficiency factors fitted to part of AWS's published results and checked on
the rest: ``calibration.py``), ranks them, and
compares padding policies for a length distribution. ``measure=True`` runs
the top layouts for real on emulated cores and sets the measured figures
beside the estimates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch_neuronx.runtime.config import format_bytes
from torch_neuronx.tools.plan.comm import Collective, collectives
from torch_neuronx.tools.plan.layouts import (
    MAX_INSTANCES,
    Hardware,
    Layout,
    PlanError,
    check_layout,
    enumerate_layouts,
    hardware,
)
from torch_neuronx.tools.plan.memory import (
    CHECKPOINTING,
    FRAGMENTATION_MARGIN,
    Memory,
    memory_per_core,
    runtime_reserve,
    zero1_numel,
)
from torch_neuronx.tools.plan.model import ModelSpec, load
from torch_neuronx.tools.plan.padding import policies
from torch_neuronx.tools.plan.precision import precision as get_precision
from torch_neuronx.tools.plan.timing import AUTOCAST, StepTime, optimizer_bytes_moved, step_time

__all__ = ["LayoutPlan", "Plan", "PlanError", "plan"]

ESTIMATE_NOTE = ("step times are a roofline estimate (documented peaks x efficiency factors calibrated on published "
                 "Trainium results), not a measurement: use them to rank layouts, not to promise throughput")


@dataclass
class LayoutPlan:
    layout: Layout
    memory: Memory
    comm: list[Collective]
    time: StepTime
    micro_steps: int
    measured: dict[str, Any] | None = None
    comm_stage: int = 0  # the pipeline stage whose collectives `comm` lists

    @property
    def fits(self) -> bool:
        return self.memory.fits

    @property
    def reason(self) -> str:
        if self.fits:
            return ""
        mem = self.memory
        stage = f" (pipeline stage {mem.stage})" if self.layout.pp > 1 else ""
        return (f"needs {format_bytes(mem.reserved)} reserved by the allocator + {format_bytes(FRAGMENTATION_MARGIN)} "
                f"fragmentation margin + {format_bytes(mem.reserve)} for the Neuron runtime per core{stage}, the core "
                f"has {format_bytes(mem.capacity)}")

    def as_dict(self) -> dict[str, Any]:
        lay = self.layout
        d: dict[str, Any] = {
            "layout": lay.name, "tp": lay.tp, "pp": lay.pp, "fsdp": lay.fsdp, "dp": lay.dp, "fits": self.fits,
            "reason": self.reason, "micro_steps": self.micro_steps, "memory_per_core": self.memory.as_dict(),
            "comm_stage": self.comm_stage, "comm_per_step": [c.as_dict() for c in self.comm],
            "step_time_s": self.time.as_dict(),
        }
        if self.measured is not None:
            d["measured"] = self.measured
        return d


@dataclass
class Plan:
    model: ModelSpec
    hardware: Hardware
    settings: dict[str, Any]
    layouts: list[LayoutPlan]
    padding: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=lambda: [ESTIMATE_NOTE])

    @property
    def best(self) -> LayoutPlan:
        return self.layouts[0]

    def find(self, tp: int, fsdp: int, dp: int = 1, pp: int = 1) -> LayoutPlan:
        for lp in self.layouts:
            if lp.layout == Layout(tp, fsdp, dp, pp):
                return lp
        raise KeyError(f"no layout {Layout(tp, fsdp, dp, pp)} in this plan")

    def as_dict(self) -> dict[str, Any]:
        hw = self.hardware
        return {
            "model": self.model.as_dict(),
            "hardware": {"instance": hw.instance.name, "instances": hw.count, "lnc": hw.lnc, "cores": hw.world,
                         "cores_per_instance": hw.cores_per_instance, "cores_per_chip": hw.cores_per_chip,
                         "hbm_per_core": hw.hbm_per_core},
            "settings": self.settings,
            "layouts": [lp.as_dict() for lp in self.layouts],
            "padding": self.padding,
            "notes": self.notes,
        }


def evaluate(m: ModelSpec, hw: Hardware, layout: Layout, *, precision: str, global_batch: int, seq_len: int,
             micro_batch: int, checkpointing: str, capacity: int, zero1: bool = False,
             sequence_parallel: bool = False, autocast: str = "matmult", reserve: int = 0,
             compute_efficiency: float | None = None, comm_efficiency: float | None = None,
             causal: bool = True, attention: str = "flash", hbm_efficiency: float | None = None,
             mlp: str = "swiglu", rope: bool = True, grad_overlap: bool = True) -> LayoutPlan:
    """Memory, collectives and estimated time of one layout (`attention`: :data:`timing.SCORE_PASSES`, "flash"
    keeps the scores on chip, "eager" writes them to HBM; `mlp`, `rope`, `grad_overlap`: see
    :func:`timing.step_time`)."""
    prec = get_precision(precision)
    kv_replicas = m.kv_replication(layout.tp)
    m = m.replicated(layout.tp)  # what the TP group stores and computes: KV heads replicated when TP exceeds them
    micro_steps = global_batch // (micro_batch * layout.data_parallel)
    sp = sequence_parallel and layout.tp > 1
    zero = zero1 and layout.dp > 1
    mem = memory_per_core(m, layout, prec, micro_batch, seq_len, checkpointing, capacity, micro_steps=micro_steps,
                          zero1=zero, sp=sp, reserve=reserve)
    stages = sorted({0, layout.pp - 1})
    comms = {s: collectives(m, hw, layout, prec, micro_batch, seq_len, micro_steps, checkpointing, zero1=zero,
                            sp=sp, stage=s, kv_replicas=kv_replicas) for s in stages}
    gathered = zero1_numel(m, layout, mem.stage)  # the TP-local parameters this core computes with
    state = gathered // layout.dp if zero else mem.params // prec.param
    opt_bytes = optimizer_bytes_moved(state, prec, micro_steps, gathered)
    time = step_time(m, hw, layout, prec, global_batch, seq_len, micro_steps, comms, checkpointing, opt_bytes,
                     micro_batch=micro_batch, autocast=autocast, zero1=zero, compute_efficiency=compute_efficiency,
                     comm_efficiency=comm_efficiency, causal=causal, sp=sp, attention=attention,
                     hbm_efficiency=hbm_efficiency, mlp=mlp, rope=rope, grad_overlap=grad_overlap)
    return LayoutPlan(layout, mem, comms[0], time, micro_steps)


MAX_SEQ_LEN = 1 << 24  # 16,777,216 tokens: longer than any model's context; beyond it the figures mean nothing
MAX_BATCH = 1 << 31


def check_inputs(*, global_batch: int, micro_batch: int, seq_len: int | None, lengths: Sequence[int] | None,
                 max_graphs: int, instances: int) -> None:
    """Refuse what no plan can come from, with what to change (a :class:`PlanError`)."""
    def whole(name: str, value: object, low: int, high: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise PlanError(f"{name} must be a whole number from {low:,} to {high:,}; got {value!r}")

    whole("--global-batch", global_batch, 1, MAX_BATCH)
    whole("--micro-batch", micro_batch, 1, MAX_BATCH)
    whole("--max-graphs", max_graphs, 1, 1 << 16)
    whole("--instances", instances, 1, MAX_INSTANCES)
    if seq_len is not None:
        whole("--seq-len", seq_len, 1, MAX_SEQ_LEN)
    if lengths is not None:
        if len(lengths) == 0:
            raise PlanError("the length distribution is empty: give at least one sequence length")
        for n in lengths:
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SEQ_LEN:
                raise PlanError(f"sequence length {n!r} is not a whole number from 1 to {MAX_SEQ_LEN:,}")
        longest = max(lengths)
        if seq_len is not None and longest > seq_len:
            over = sum(1 for n in lengths if n > seq_len)
            raise PlanError(f"{over} of {len(lengths)} lengths exceed --seq-len {seq_len} (longest {longest}): "
                            "truncate the data to --seq-len first, or raise --seq-len (or leave it out to plan for "
                            "the longest)")
    if global_batch % micro_batch:
        raise PlanError(f"global batch {global_batch} is not a multiple of micro-batch {micro_batch}")


def plan(model: str | Path | Any, *, instance: str = "trn1.32xlarge", instances: int = 1, lnc: int | None = None,
         global_batch: int = 32, seq_len: int | None = None, lengths: Sequence[int] | None = None,
         max_graphs: int = 4, precision: str = "bf16-mixed", checkpointing: str = "none", micro_batch: int = 1,
         layouts: Sequence[tuple[int, ...]] | None = None, hbm_per_core: int | None = None,
         hbm_reserve: int | None = None, zero1: bool = False, sequence_parallel: bool = False,
         pipeline: bool = True, autocast: str = "matmult", measure: bool | int = False,
         workdir: Path | None = None) -> Plan:
    """Plan `model` on `instances` x `instance`; see the module docstring and docs/plan.md.

    `layouts` restricts the plan to these (tp, fsdp, dp) or (tp, fsdp, dp, pp) tuples, each checked (a
    :class:`PlanError` says why one cannot exist). `hbm_per_core` overrides the core's capacity (what-if);
    `hbm_reserve` the bytes the Neuron runtime keeps per core (default :func:`memory.runtime_reserve`). `zero1`
    shards the optimizer state over DP instead of FSDP (layouts have FSDP = 1); `sequence_parallel` splits
    activations over TP (Megatron / NxD style); `pipeline=False` leaves out PP > 1 when enumerating; `autocast`
    is the compiler's FP32 matmul policy ("matmult": cast to BF16, neuronx-cc's default; "none"). `measure`
    (True, or how many of the top layouts) runs them for real on emulated cores.
    """
    if seq_len is None and not lengths:
        raise PlanError("give the sequence length (seq_len) or a length distribution (lengths)")
    check_inputs(global_batch=global_batch, micro_batch=micro_batch, seq_len=seq_len, lengths=lengths,
                 max_graphs=max_graphs, instances=instances)
    if not isinstance(measure, bool) and (not isinstance(measure, int) or measure < 0):
        raise PlanError(f"measure={measure!r}: give True, False or how many of the best layouts to run (>= 0)")
    if autocast not in AUTOCAST:
        raise PlanError(f"autocast {autocast!r} is not one of {', '.join(AUTOCAST)}")
    if checkpointing not in CHECKPOINTING:
        raise PlanError(f"checkpointing {checkpointing!r} is not one of {', '.join(CHECKPOINTING)}")
    seq = seq_len or max(lengths or [0])
    m = load(model)
    hw = hardware(instance, instances, lnc)
    get_precision(precision)
    if hbm_per_core is not None and not 1 <= hbm_per_core <= 1 << 50:
        raise PlanError(f"--hbm-per-core {hbm_per_core} is not a positive size")
    capacity = hbm_per_core or hw.hbm_per_core
    reserve = runtime_reserve(hw.lnc) if hbm_reserve is None else hbm_reserve
    if not 0 <= reserve < capacity:
        raise PlanError(f"--hbm-reserve {format_bytes(reserve) if reserve >= 0 else reserve} must be at least 0 and "
                        f"less than the core's {format_bytes(capacity)}")
    if layouts is not None:
        chosen = []
        for t in layouts:
            if len(t) not in (3, 4):
                raise PlanError(f"layout {t!r}: give (tp, fsdp, dp) or (tp, fsdp, dp, pp)")
            lay = Layout(*t)
            check_layout(m, hw, lay, global_batch, micro_batch)
            if zero1 and lay.fsdp > 1:
                raise PlanError(f"layout {lay}: ZeRO-1 shards the optimizer over DP in place of FSDP; give FSDP=1")
            if lay not in chosen:
                chosen.append(lay)
    else:
        chosen = [lay for lay in enumerate_layouts(m, hw, global_batch, micro_batch, pipeline)
                  if not (zero1 and lay.fsdp > 1)]
    dropped: list[Layout] = []
    if sequence_parallel:
        problems = {lay: sp_problem(lay, seq) for lay in chosen}
        if layouts is not None:
            bad = [f"{lay.name}: {why}" for lay, why in problems.items() if why]
            if bad:
                raise PlanError("; ".join(bad))
        dropped = [lay for lay, why in problems.items() if why]
        chosen = [lay for lay in chosen if not problems[lay]]
        if not chosen:
            raise PlanError(f"sequence parallelism splits the sequence over TP, and {seq} tokens divide by no TP "
                            "degree this model allows above 1: pad the sequence to a multiple of TP, or plan "
                            "without --sequence-parallel")
    evaluated = [evaluate(m, hw, lay, precision=precision, global_batch=global_batch, seq_len=seq,
                          micro_batch=micro_batch, checkpointing=checkpointing, capacity=capacity, zero1=zero1,
                          sequence_parallel=sequence_parallel, autocast=autocast, reserve=reserve) for lay in chosen]
    evaluated.sort(key=lambda lp: (not lp.fits, -lp.time.tokens_per_s, lp.memory.total))
    settings = {"global_batch": global_batch, "seq_len": seq, "micro_batch": micro_batch, "precision": precision,
                "checkpointing": checkpointing, "optimizer": "AdamW", "max_graphs": max_graphs, "zero1": zero1,
                "sequence_parallel": sequence_parallel, "autocast": autocast, "hbm_reserve": reserve,
                "pipeline_schedule": "1F1B"}
    result = Plan(m, hw, settings, evaluated)
    if not prec_is_bf16(precision):
        result.notes.append("FP32 matmuls are timed at the BF16 peak: neuronx-cc casts them by default "
                            "(--auto-cast matmult); pass autocast='none' (--autocast none) if you compile with "
                            "--auto-cast none" if autocast == "matmult" else
                            "FP32 matmuls are timed at the FP32 peak (--autocast none)")
    replicated = sorted({lp.layout.tp for lp in evaluated if m.kv_replication(lp.layout.tp) > 1})
    if replicated:
        result.notes.append(f"TP {', '.join(map(str, replicated))}: above the {m.kv_heads} key/value heads, each KV "
                            "head is replicated over TP / KV heads ranks, as NeuronX Distributed does "
                            "(GQAQKVColumnParallelLinear, kv_size_multiplier); Transformers' tp_plan cannot, so run "
                            "these layouts with NxD (--measure runs them with --sequence-parallel, TP alone)")
    if dropped:
        result.notes.append(f"left out {', '.join(lay.name for lay in dropped)}: sequence parallelism splits the "
                            f"{seq} tokens of a sequence over TP, and they do not divide (NxD requires it; pad to a "
                            "multiple of TP to plan them)")
    if lengths:
        result.padding = {"lengths": len(lengths), "policies": policies(lengths, max_graphs)}
    if measure:
        _measure(result, int(measure) if not isinstance(measure, bool) else 3, hbm_per_core, workdir)
    return result


def sp_problem(layout: Layout, seq_len: int) -> str:
    """Why sequence parallelism cannot run `layout` at `seq_len` tokens ("" when it can): the sequence is split over
    the TP ranks (NxD and Megatron require it to divide; ``plan --measure`` refuses the same)."""
    if layout.tp > 1 and seq_len % layout.tp:
        return f"sequence parallelism splits the sequence over TP: {seq_len} tokens do not divide by {layout.tp}"
    return ""


def prec_is_bf16(name: str) -> bool:
    return get_precision(name).bf16_compute


def _measure(result: Plan, top: int, hbm_per_core: int | None, workdir: Path | None) -> None:
    from torch_neuronx.tools.plan.measure import compare, measurable, measure_layouts

    config = result.model.transformers_config()
    if config is None:
        raise PlanError("--measure builds the model with Transformers from its config's model_type, and this config "
                        "has none: add \"model_type\" (e.g. \"llama\") to the config")
    s = result.settings
    fitting = [lp for lp in result.layouts if lp.fits]
    why = {lp.layout: measurable(lp.layout, s["zero1"], s["precision"], s["checkpointing"], s["sequence_parallel"],
                                 s["seq_len"], result.model.kv_replication(lp.layout.tp)) for lp in fitting}
    todo = [lp for lp in fitting if not why[lp.layout]][:top]
    if not todo:
        reasons = "; ".join(sorted({w for w in why.values() if w})) or "no layout fits"
        raise PlanError(f"--measure found no layout it can run ({reasons}): give --layout, or plan without it")
    if result.hardware.world > 8:
        raise PlanError(f"--measure runs one process per core: {result.hardware.world} cores is too many for one "
                        "host; plan a smaller instance (trn1.2xlarge, trn2.3xlarge) or lower --instances")
    runs = measure_layouts(config, [lp.layout for lp in todo], micro_batch=s["micro_batch"],
                           seq_len=s["seq_len"], precision=s["precision"], checkpointing=s["checkpointing"],
                           instance=result.hardware.instance.name, lnc=result.hardware.lnc,
                           hbm_per_core=hbm_per_core, workdir=workdir, zero1=s["zero1"],
                           sequence_parallel=s["sequence_parallel"],
                           global_batch=s["global_batch"])
    for lp, run in zip(todo, runs, strict=True):
        lp.measured = compare(lp, run)
    last = fitting.index(todo[-1])
    for lp in fitting[:last]:  # ranked above a measured layout, yet not run: say why
        if why[lp.layout]:
            result.notes.append(f"--measure skipped {lp.layout.name}: {why[lp.layout]}")
