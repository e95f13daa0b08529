"""Which TP x PP x FSDP x DP layouts can exist for a model on a set of instances, and why the others cannot.

A layout splits the world (every logical NeuronCore of the instances) into a
tensor-parallel group (innermost: consecutive cores, so it stays on a chip or
inside the instance's NeuronLink domain), FSDP shards, data-parallel
replicas (HSDP) and pipeline stages (outermost: stages exchange only
activations, the cheapest traffic to send across instances). Tensor
parallelism needs the model's heads, MLP width and experts to divide
evenly, and the KV heads to divide by TP or TP by them (NxD then replicates
each KV head over TP / KV heads ranks); pipeline parallelism needs at least one decoder layer per
stage; the global batch must split into whole micro-batches over the
data-parallel ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch_neuronx.runtime.instances import INSTANCES, Instance
from torch_neuronx.tools.plan.model import ModelSpec

MAX_INSTANCES = 10_000  # AWS's largest UltraClusters are in the tens of thousands of chips, not instances


class PlanError(ValueError):
    """A request the planner cannot satisfy: the message says what is wrong and what to do."""


@dataclass(frozen=True)
class Hardware:
    """The instances a job runs on: type, count and logical NeuronCore config."""

    instance: Instance
    count: int
    lnc: int

    @property
    def cores_per_instance(self) -> int:
        return self.instance.physical_cores // self.lnc

    @property
    def cores_per_chip(self) -> int:
        return self.instance.chip.physical_cores // self.lnc

    @property
    def world(self) -> int:
        return self.cores_per_instance * self.count

    @property
    def hbm_per_core(self) -> int:
        chip = self.instance.chip
        return chip.hbm_bytes // chip.physical_cores * self.lnc


def hardware(instance: str, count: int = 1, lnc: int | None = None) -> Hardware:
    """Check and describe `count` instances of type `instance` at logical NeuronCore config `lnc`."""
    inst = INSTANCES.get(instance)
    if inst is None:
        raise PlanError(f"unknown instance type {instance!r}; choose one of {', '.join(sorted(INSTANCES))}")
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_INSTANCES:
        raise PlanError(f"--instances must be a whole number from 1 to {MAX_INSTANCES:,}, got {count!r}")
    if count > 1 and inst.efa_gbps <= 0:
        raise PlanError(f"{instance} has no EFA network, so {count} of them cannot train as one job: use one, or a "
                        "trn1.32xlarge / trn1n.32xlarge / trn2.48xlarge")
    lnc = inst.default_lnc if lnc is None else lnc
    if lnc not in (1, 2) or (lnc == 2 and not inst.chip.supports_lnc2):
        raise PlanError(f"--lnc {lnc} is not possible on {instance}: only Trn2 takes 2; use "
                        f"{'1 or 2' if inst.chip.supports_lnc2 else '1'}")
    return Hardware(inst, count, lnc)


@dataclass(frozen=True)
class Layout:
    tp: int
    fsdp: int
    dp: int
    pp: int = 1

    @property
    def world(self) -> int:
        return self.tp * self.fsdp * self.dp * self.pp

    @property
    def data_parallel(self) -> int:
        """Ranks that see different rows: the FSDP shards times the replicas."""
        return self.fsdp * self.dp

    @property
    def name(self) -> str:
        """``TPxPPxFSDPxDP``, as the table prints it and ``--layout`` takes it."""
        return f"{self.tp}x{self.pp}x{self.fsdp}x{self.dp}"

    def __str__(self) -> str:
        pp = f" x PP={self.pp}" if self.pp > 1 else ""
        return f"TP={self.tp}{pp} x FSDP={self.fsdp} x DP={self.dp}"


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def tp_problems(model: ModelSpec, tp: int) -> list[str]:
    """Why the model's tensors cannot be split `tp` ways (empty when they can)."""
    checks = [("attention heads", model.heads), ("MLP intermediate size", model.intermediate),
              ("vocabulary (split by the LM head)", model.vocab)]
    if model.experts:
        checks.append(("experts' intermediate size", model.expert_intermediate))
    problems = [f"{what} ({n}) not divisible by TP={tp}" for what, n in checks if n % tp]
    # KV heads split over TP, or (TP a multiple of them) replicated so each rank holds one: NxD's kv_size_multiplier
    if model.kv_heads % tp and tp % model.kv_heads:
        problems.append(f"key/value heads ({model.kv_heads}) neither divisible by TP={tp} nor dividing it (to be "
                        "replicated)")
    return problems


def layout_problems(model: ModelSpec, hw: Hardware, layout: Layout, global_batch: int, micro_batch: int) -> list[str]:
    """Why `layout` cannot run (empty when it can)."""
    degrees = {"TP": layout.tp, "PP": layout.pp, "FSDP": layout.fsdp, "DP": layout.dp}
    bad = [f"{k}={v}" for k, v in degrees.items() if not isinstance(v, int) or v < 1]
    if bad:
        return [f"every degree must be a whole number >= 1 ({', '.join(bad)})"]
    problems = tp_problems(model, layout.tp)
    if layout.pp > model.layers:
        problems.append(f"PP={layout.pp} stages but the model has {model.layers} decoder layers: at most one stage "
                        "per layer")
    if layout.world != hw.world:
        problems.append(f"TP x PP x FSDP x DP = {layout.world} but {hw.count} x {hw.instance.name} at LNC={hw.lnc} "
                        f"has {hw.world} NeuronCores")
    if layout.tp > hw.cores_per_instance:
        problems.append(f"TP={layout.tp} spans instances ({hw.cores_per_instance} cores each): tensor parallelism "
                        "must stay on NeuronLink")
    rows = micro_batch * layout.data_parallel
    if global_batch % rows:
        problems.append(f"global batch {global_batch} is not a multiple of micro-batch {micro_batch} x "
                        f"{layout.data_parallel} data-parallel ranks")
    return problems


def check_layout(model: ModelSpec, hw: Hardware, layout: Layout, global_batch: int, micro_batch: int) -> None:
    """Raise :class:`PlanError` naming every reason `layout` cannot exist."""
    problems = layout_problems(model, hw, layout, global_batch, micro_batch)
    if problems:
        raise PlanError(f"layout {layout} cannot run {model.name} on {hw.count} x {hw.instance.name}: "
                        + "; ".join(problems) + f". Valid TP degrees: {valid_tp(model, hw)}")


def valid_tp(model: ModelSpec, hw: Hardware) -> list[int]:
    return [t for t in divisors(hw.cores_per_instance) if not tp_problems(model, t)]


def enumerate_layouts(model: ModelSpec, hw: Hardware, global_batch: int, micro_batch: int,
                      pipeline: bool = True) -> list[Layout]:
    """Every layout of the world that the model and batch allow (DP: replicas of the FSDP group, HSDP; PP: pipeline
    stages, when `pipeline`)."""
    layouts = []
    for tp in valid_tp(model, hw):
        for pp in divisors(hw.world // tp) if pipeline else [1]:
            if pp > model.layers:
                break
            rest = hw.world // (tp * pp)
            for dp in divisors(rest):
                layout = Layout(tp, rest // dp, dp, pp)
                if not layout_problems(model, hw, layout, global_batch, micro_batch):
                    layouts.append(layout)
    if not layouts:
        raise PlanError(f"no layout of {hw.world} cores fits {model.name} with global batch {global_batch} and "
                        f"micro-batch {micro_batch}: make the global batch a multiple of micro-batch x the "
                        "data-parallel ranks, or lower the micro-batch")
    return layouts
