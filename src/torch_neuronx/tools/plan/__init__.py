"""``torch-neuronx plan``: choose the parallel layout and the padding policy before renting the instance.

    >>> from torch_neuronx.tools.plan import plan
    >>> result = plan("config.json", instance="trn1.32xlarge", global_batch=32, seq_len=4096)  # doctest: +SKIP
    >>> result.best.layout, result.as_dict()["layouts"][0]["step_time_s"]  # doctest: +SKIP

For a model (a Hugging Face config or model directory, a config object, or
``module:function``) and instances, it enumerates every TP x FSDP x DP
layout the model allows, estimates each one's memory per core, collectives
per step and step time, ranks them, and compares padding policies for a
length distribution. ``measure=True`` runs the top layouts for real on
emulated cores and sets the measured figures beside the estimates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch_neuronx.runtime.config import format_bytes
from torch_neuronx.tools.plan.comm import Collective, collectives
from torch_neuronx.tools.plan.layouts import Hardware, Layout, PlanError, check_layout, enumerate_layouts, hardware
from torch_neuronx.tools.plan.memory import Memory, memory_per_core
from torch_neuronx.tools.plan.model import ModelSpec, load
from torch_neuronx.tools.plan.padding import policies
from torch_neuronx.tools.plan.precision import precision as get_precision
from torch_neuronx.tools.plan.timing import StepTime, step_time

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

    @property
    def fits(self) -> bool:
        return self.memory.fits

    @property
    def reason(self) -> str:
        if self.fits:
            return ""
        return (f"needs {format_bytes(self.memory.total)} per core, the core has "
                f"{format_bytes(self.memory.capacity)}")

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "tp": self.layout.tp, "fsdp": self.layout.fsdp, "dp": self.layout.dp, "fits": self.fits,
            "reason": self.reason, "micro_steps": self.micro_steps, "memory_per_core": self.memory.as_dict(),
            "comm_per_step": [c.as_dict() for c in self.comm], "step_time_s": self.time.as_dict(),
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

    def find(self, tp: int, fsdp: int, dp: int = 1) -> LayoutPlan:
        for lp in self.layouts:
            if (lp.layout.tp, lp.layout.fsdp, lp.layout.dp) == (tp, fsdp, dp):
                return lp
        raise KeyError(f"no layout TP={tp} x FSDP={fsdp} x DP={dp} in this plan")

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
             micro_batch: int, checkpointing: str, capacity: int) -> LayoutPlan:
    """Memory, collectives and estimated time of one layout."""
    prec = get_precision(precision)
    micro_steps = global_batch // (micro_batch * layout.data_parallel)
    mem = memory_per_core(m, layout, prec, micro_batch, seq_len, checkpointing, capacity)
    comms = collectives(m, hw, layout, prec, micro_batch, seq_len, micro_steps, checkpointing)
    state = mem.params + mem.grads + mem.optimizer
    time = step_time(m, hw, layout, prec, global_batch, seq_len, micro_steps, comms, checkpointing, state)
    return LayoutPlan(layout, mem, comms, time, micro_steps)


def plan(model: str | Path | Any, *, instance: str = "trn1.32xlarge", instances: int = 1, lnc: int | None = None,
         global_batch: int = 32, seq_len: int | None = None, lengths: Sequence[int] | None = None,
         max_graphs: int = 4, precision: str = "bf16-mixed", checkpointing: str = "none", micro_batch: int = 1,
         layouts: Sequence[tuple[int, int, int]] | None = None, hbm_per_core: int | None = None,
         measure: bool | int = False, workdir: Path | None = None) -> Plan:
    """Plan `model` on `instances` x `instance`; see the module docstring and docs/plan.md.

    `layouts` restricts the plan to these (tp, fsdp, dp) triples, each checked (a :class:`PlanError` says why one
    cannot exist). `hbm_per_core` overrides the core's capacity (what-if). `measure` (True, or how many of the
    top layouts) runs them for real on emulated cores.
    """
    if seq_len is None and not lengths:
        raise PlanError("give the sequence length (seq_len) or a length distribution (lengths)")
    if global_batch < 1 or micro_batch < 1:
        raise PlanError(f"global batch ({global_batch}) and micro-batch ({micro_batch}) must be >= 1")
    seq = seq_len or max(lengths or [0])
    m = load(model)
    hw = hardware(instance, instances, lnc)
    get_precision(precision)
    if layouts is not None:
        chosen = [Layout(*t) for t in layouts]
        for lay in chosen:
            check_layout(m, hw, lay, global_batch, micro_batch)
    else:
        chosen = enumerate_layouts(m, hw, global_batch, micro_batch)
    capacity = hbm_per_core or hw.hbm_per_core
    evaluated = [evaluate(m, hw, lay, precision=precision, global_batch=global_batch, seq_len=seq,
                          micro_batch=micro_batch, checkpointing=checkpointing, capacity=capacity) for lay in chosen]
    evaluated.sort(key=lambda lp: (not lp.fits, -lp.time.tokens_per_s, lp.memory.total))
    settings = {"global_batch": global_batch, "seq_len": seq, "micro_batch": micro_batch, "precision": precision,
                "checkpointing": checkpointing, "optimizer": "AdamW", "max_graphs": max_graphs}
    result = Plan(m, hw, settings, evaluated)
    if lengths:
        result.padding = {"lengths": len(lengths), "policies": policies(lengths, max_graphs)}
    if measure:
        _measure(result, int(measure) if not isinstance(measure, bool) else 3, hbm_per_core, workdir)
    return result


def _measure(result: Plan, top: int, hbm_per_core: int | None, workdir: Path | None) -> None:
    from torch_neuronx.tools.plan.measure import compare, measure_layouts

    if result.model.config is None:
        raise PlanError("--measure needs a Hugging Face config (config.json, model directory or a config object) to "
                        "build the model from")
    if result.hardware.world > 8:
        raise PlanError(f"--measure runs one process per core: {result.hardware.world} cores is too many for one "
                        "host; plan a smaller instance (trn1.2xlarge, trn2.3xlarge) or lower --instances")
    s = result.settings
    todo = [lp for lp in result.layouts if lp.fits][:top]
    runs = measure_layouts(result.model.config, [lp.layout for lp in todo], micro_batch=s["micro_batch"],
                           seq_len=s["seq_len"], precision=s["precision"], checkpointing=s["checkpointing"],
                           instance=result.hardware.instance.name, lnc=result.hardware.lnc,
                           hbm_per_core=hbm_per_core, workdir=workdir)
    for lp, run in zip(todo, runs, strict=True):
        lp.measured = compare(lp, run)
