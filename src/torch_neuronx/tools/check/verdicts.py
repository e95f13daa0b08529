"""The four layers of a migration's acceptance, judged from a checked run: pass, warn or fail, with evidence.

Correctness (finite losses, agreement with the reference, output shapes,
recorded values, checkpoints that load on CPU and hold what was saved),
compilation (recompilations after warm-up, distinct shapes, graph breaks, CPU
fallbacks), distribution (every rank joined, meshes that cover the world,
no double wrapping, matching collectives), operations (crashes, hangs,
out-of-memory, memory headroom, startup, step time). Each finding is one
evidence item; a layer's verdict is its worst item. :class:`Thresholds`
holds every limit, with the defaults docs/check.md documents.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from torch_neuronx.runtime.config import format_bytes

if TYPE_CHECKING:
    from torch_neuronx.tools.check.run import CheckConfig, Side

LAYERS = ("correctness", "compilation", "distribution", "operations")
ORDER = {"pass": 0, "info": 0, "warn": 1, "fail": 2}
PROBE_IDS = [1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45]  # the fixed batch HF checkpoints are compared on
SCHEMA = "torch-neuronx-check/1"


@dataclass
class Thresholds:
    """Every limit a verdict uses (command-line flag in brackets)."""

    loss_rtol: float = 1e-3  # |loss - reference| <= loss_atol + loss_rtol * |reference|   [--loss-rtol]
    loss_atol: float = 1e-4  # [--loss-atol]
    warmup_steps: int = 2  # recompiling after this many steps fails: the steady state was interrupted
    max_shapes: int = 4  # more distinct input shapes for one compiled function warns   [--max-shapes]
    memory_warn: float = 0.9  # peak device memory above this share of a core's HBM warns   [--memory-warn]
    max_startup_s: float = 600.0  # launch to first forward, longer warns   [--max-startup]


class Layer:
    def __init__(self) -> None:
        self.evidence: list[dict[str, Any]] = []

    def add(self, verdict: str, check: str, message: str, **data: Any) -> None:
        self.evidence.append({"verdict": verdict, "check": check, "message": message, **data})

    @property
    def verdict(self) -> str:
        worst = max((ORDER[e["verdict"]] for e in self.evidence), default=0)
        return {0: "pass", 1: "warn", 2: "fail"}[worst]

    def as_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "evidence": self.evidence}


def _close(a: float | None, b: float | None, rtol: float, atol: float) -> bool:
    if a is None or b is None:
        return a is b
    if math.isnan(a) or math.isnan(b):
        return False
    return abs(a - b) <= atol + rtol * abs(b)


def _max_diff(a: Any, b: Any) -> float:
    """Largest |a - b| over two nested lists of numbers (inf when their structure differs)."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(float(a) - float(b)) if not (a != a or b != b) else math.inf
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return max((_max_diff(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    return 0.0 if a == b else math.inf


# ------------------------------------------------------------------ correctness
def correctness(neuron: Side, ref: Side | None, items: list[dict[str, Any]], th: Thresholds) -> Layer:
    layer = Layer()
    runs = neuron.ranks
    if not any(r.steps for r in runs.values()):
        layer.add("warn", "steps", "no step was seen: the job called no optimizer step; add "
                  "torch_neuronx.check.step() at the end of each step")
    for rank, run in sorted(runs.items()):
        bad = next((s for s in run.steps if not s.get("finite", True)), None)
        if bad is not None:
            layer.add("fail", "finite_loss", f"rank {rank}: the loss is not finite at step {bad['i']} "
                      f"({bad['losses']})", rank=rank, step=bad["i"])
    if not any(e["check"] == "finite_loss" for e in layer.evidence) and any(r.steps for r in runs.values()):
        layer.add("pass", "finite_loss", f"every loss of {sum(len(r.steps) for r in runs.values())} rank-steps "
                  "is finite")
    _against_reference(layer, neuron, ref, th)
    _checkpoints(layer, neuron, items)
    return layer


def _against_reference(layer: Layer, neuron: Side, ref: Side | None, th: Thresholds) -> None:
    if ref is None:
        layer.add("warn", "reference", "no reference run: put {device} in the command (cpu is substituted) or "
                  "give --reference -- CMD, to compare losses and outputs")
        return
    bad_ranks = [r for r, run in ref.ranks.items() if run.status != "ok"] or ([] if ref.ranks else [0])
    if ref.timed_out or bad_ranks:
        layer.add("warn", "reference", f"the reference run did not finish (ranks {bad_ranks}); nothing was "
                  "compared", log_tail=next(iter(ref.ranks.values())).log_tail if ref.ranks else ref.agent_log)
        return
    if len(ref.ranks) != len(neuron.ranks):
        _mean_losses(layer, neuron, ref, th)
    for rank, run in sorted(neuron.ranks.items()):
        other = ref.ranks.get(rank)
        if other is None or len(ref.ranks) != len(neuron.ranks):
            continue
        mine, theirs = run.losses(), other.losses()
        if len(mine) != len(theirs) and run.status == "ok":
            layer.add("fail", "reference_steps", f"rank {rank}: {len(mine)} steps on neuron, {len(theirs)} in the "
                      "reference run", rank=rank)
        pairs = list(zip(mine, theirs, strict=False))
        diverged = next((i for i, (a, b) in enumerate(pairs) if not _close(a, b, th.loss_rtol, th.loss_atol)), None)
        diffs = [abs(a - b) for a, b in pairs if a is not None and b is not None and a == a and b == b]
        if diverged is not None:
            layer.add("fail", "loss_vs_reference", f"rank {rank}: the loss diverges from the reference at step "
                      f"{diverged}: {pairs[diverged][0]} vs {pairs[diverged][1]} (tolerance {th.loss_atol} + "
                      f"{th.loss_rtol} x |reference|)", rank=rank, step=diverged)
        elif pairs and any(a is not None for a, _ in pairs):
            layer.add("pass", "loss_vs_reference", f"rank {rank}: {len(pairs)} losses within tolerance of the "
                      f"reference (max |difference| {max(diffs, default=0.0):.3g})", rank=rank,
                      max_abs_diff=max(diffs, default=0.0))
        shape_step = next((i for i, (a, b) in enumerate(zip(run.steps, other.steps, strict=False))
                           if _shape_set(a) != _shape_set(b)), None)
        if shape_step is not None:
            layer.add("fail", "output_shapes", f"rank {rank}: output shapes differ from the reference at step "
                      f"{shape_step}: {sorted(_shape_set(run.steps[shape_step]))} vs "
                      f"{sorted(_shape_set(other.steps[shape_step]))}", rank=rank, step=shape_step)
        elif run.steps:
            layer.add("pass", "output_shapes", f"rank {rank}: the top-level modules' output shapes match the "
                      "reference's at every step", rank=rank)
        for name, value in run.records.items():
            if name not in other.records:
                layer.add("warn", "record", f"rank {rank}: {name!r} was recorded on neuron only", rank=rank)
                continue
            diff = _max_diff(value, other.records[name])
            ok = diff <= th.loss_atol + th.loss_rtol * max(1.0, _magnitude(other.records[name]))
            layer.add("pass" if ok else "fail", "record", f"rank {rank}: {name!r} "
                      f"{'matches' if ok else 'differs from'} the reference (max |difference| {diff:.3g})",
                      rank=rank, name=name, max_abs_diff=diff)


def _mean_losses(layer: Layer, neuron: Side, ref: Side, th: Thresholds) -> None:
    """A reference with another world size (one CPU process with the global batch): compare each step's loss
    averaged over the ranks, which is the global batch's loss when every rank's batch has the same weight."""

    def means(side: Side) -> list[float]:
        per_rank = [[v for v in run.losses() if v is not None] for run in side.ranks.values()]
        n = min((len(p) for p in per_rank), default=0)
        return [sum(p[i] for p in per_rank) / len(per_rank) for i in range(n)]

    mine, theirs = means(neuron), means(ref)
    pairs = list(zip(mine, theirs, strict=False))
    if len(mine) != len(theirs):
        layer.add("fail", "reference_steps", f"{len(mine)} steps on neuron, {len(theirs)} in the reference run")
    bad = next((i for i, (a, b) in enumerate(pairs) if not _close(a, b, th.loss_rtol, th.loss_atol)), None)
    worst = max((abs(a - b) for a, b in pairs), default=0.0)
    if bad is not None:
        layer.add("fail", "loss_vs_reference", f"the loss averaged over {len(neuron.ranks)} ranks diverges from "
                  f"the {len(ref.ranks)}-process reference at step {bad}: {pairs[bad][0]} vs {pairs[bad][1]}",
                  step=bad)
    elif pairs:
        layer.add("pass", "loss_vs_reference", f"the loss averaged over {len(neuron.ranks)} ranks matches the "
                  f"{len(ref.ranks)}-process reference at {len(pairs)} steps (max |difference| {worst:.3g})",
                  max_abs_diff=worst)


def _shape_set(step: dict[str, Any]) -> set[str]:
    """The distinct output shapes of a step's top-level module calls (a compiled call is not a module call, so
    how many calls were seen may differ between devices; which shapes came out may not)."""
    return {json.dumps(s, sort_keys=True) for s in step.get("shapes", [])}


def _magnitude(v: Any) -> float:
    if isinstance(v, (int, float)):
        return abs(float(v))
    if isinstance(v, list):
        return max((_magnitude(x) for x in v), default=0.0)
    return 0.0


def _checkpoints(layer: Layer, neuron: Side, items: list[dict[str, Any]]) -> None:
    if not items:
        layer.add("info", "checkpoint", "the job wrote no checkpoint (torch.save or safetensors); pass "
                  "--checkpoint PATH to have one loaded on CPU")
        return
    records = {k: v for run in neuron.ranks.values() for k, v in run.records.items()}
    for item in items:
        path, got = item["path"], item["loaded"]
        if not got.get("ok"):
            layer.add("fail", "checkpoint", f"{path} does not load on CPU without torch_neuronx: {got.get('error')}. "
                      "Save CPU tensors and plain types (e.g. {k: v.cpu() for k, v in state_dict.items()}), never "
                      "devices or neuron objects", path=path)
            continue
        problems = []
        saved = item.get("saved") or {}
        differ = [k for k, v in saved.items() if got.get("tensors", {}).get(k) != v.get("digest")]
        if saved and differ:
            problems.append(f"{len(differ)} tensor(s) differ from what the job saved: {differ[:5]}")
        if got.get("nonfinite"):
            problems.append(f"non-finite values in {got['nonfinite'][:5]}")
        logits = records.get("probe_logits")
        if item["kind"] == "hf" and logits is not None and "probe_logits" in got:
            diff = _max_diff(logits, got["probe_logits"])
            if diff > 1e-4:
                problems.append(f"its logits on a fixed batch differ from the trained model's by {diff:.3g}")
        if problems:
            layer.add("fail", "checkpoint", f"{path}: " + "; ".join(problems), path=path)
            continue
        same = ("holds exactly the values saved" if saved else
                "gives the trained model's logits" if item["kind"] == "hf" and logits is not None else
                f"its {len(got.get('tensors', {}))} tensors are finite")
        where = got.get("saved_from", [])
        note = f" (tensors saved from {', '.join(where)}: map_location='cpu' is needed)" if "neuron" in where else ""
        layer.add("pass", "checkpoint", f"{path} loads on CPU in a fresh process without torch_neuronx and "
                  f"{same}{note}", path=path)


# ------------------------------------------------------------------ compilation
def compilation(neuron: Side, th: Thresholds) -> Layer:
    layer = Layer()
    from torch_neuronx.compile.bucketing import propose_buckets

    for rank, run in sorted(neuron.ranks.items()):
        late = [(s["i"], r) for s in run.steps for r in s.get("compile", {}).get("recompiles", [])
                if s["i"] >= th.warmup_steps]
        if late:
            step, first = late[0]
            layer.add("fail", "steady_state_recompile", f"rank {rank}: {len(late)} recompilation(s) after warm-up "
                      f"(the first {th.warmup_steps} steps), the first at step {step}: {first['function']}: "
                      f"{first['reason']}", rank=rank, step=step, count=len(late))
        functions = ((run.end or {}).get("compile") or {}).get("functions", {})
        for name, f in functions.items():
            shapes = f.get("distinct_input_shapes", [])
            if len(shapes) > th.max_shapes:
                lengths = _varying_lengths(shapes)
                hint = ""
                if lengths:
                    plan = propose_buckets(lengths, min(th.max_shapes, len(set(lengths))), multiple_of=8)
                    hint = (f"; pad to buckets {list(plan.buckets)} (torch_neuronx.compile.bucketing.pad_batch("
                            f"..., buckets={list(plan.buckets)}))")
                layer.add("warn", "distinct_shapes", f"rank {rank}: {name} saw {len(shapes)} distinct input shapes "
                          f"(more than {th.max_shapes}){hint}", rank=rank, function=name, shapes=len(shapes),
                          observed_lengths=sorted(set(lengths)))
        breaks = ((run.end or {}).get("compile") or {}).get("graph_breaks") or {}
        if breaks.get("count"):
            layer.add("warn", "graph_breaks", f"rank {rank}: {breaks['count']} graph break(s): "
                      f"{list(breaks.get('reasons', {}))[:3]}", rank=rank)
        fallbacks: dict[str, int] = {}
        for s in run.steps:
            for op, n in s.get("fallbacks", {}).items():
                fallbacks[op] = fallbacks.get(op, 0) + n
        if fallbacks:
            layer.add("warn", "cpu_fallback", f"rank {rank}: {len(fallbacks)} op(s) would run on the CPU on "
                      f"Trainium: {sorted(fallbacks)[:6]}", rank=rank, ops=fallbacks)
        graphs = ((run.end or {}).get("compile") or {}).get("graphs") or 0
        if graphs and not late:
            layer.add("pass", "steady_state_recompile", f"rank {rank}: {graphs} graph(s) compiled, all within "
                      f"warm-up (steps 0-{max(run.warmup_steps - 1, 0)}); steady state from step {run.warmup_steps}",
                      rank=rank)
    if not layer.evidence:
        layer.add("pass", "compile", "nothing compiled and nothing fell back to the CPU (eager)")
    return layer


def _varying_lengths(shapes: list[dict[str, Any]]) -> list[int]:
    """The sizes of the dims that change between a function's input shapes (usually the sequence length)."""
    out: list[int] = []
    for name in shapes[0]:
        dims = [s.get(name) for s in shapes]
        if not all(isinstance(d, list) for d in dims) or len({len(d) for d in dims}) != 1:
            continue
        for k in range(len(dims[0])):
            values = [d[k] for d in dims]
            if len(set(values)) > 1:
                out.extend(values)
    return out


# ------------------------------------------------------------------ distribution
def distribution(neuron: Side, world: int) -> Layer:
    layer = Layer()
    started = sorted(neuron.ranks)
    missing = [r for r in range(world) if r not in neuron.ranks]
    if missing:
        layer.add("fail", "ranks", f"ranks {missing} of {world} never started (no measurement from them)")
    elif world > 1:
        layer.add("pass", "ranks", f"all {world} ranks started")
    for rank in started:
        run = neuron.ranks[rank]
        seen = next((s["world_size"] for s in reversed(run.steps) if s.get("world_size")), None)
        if seen is not None and seen != world:
            layer.add("fail", "world_size", f"rank {rank} joined a process group of {seen}, not {world}", rank=rank)
        for m in run.meshes:
            if "error" in m:
                continue
            size = math.prod(m["shape"])
            dims = " x ".join(f"{n}={s}" for n, s in zip(m["names"] or ["?"] * len(m["shape"]), m["shape"],
                                                        strict=True))
            if size != world:
                outside = sorted(set(range(world)) - set(m["ranks"]))
                layer.add("fail", "mesh", f"rank {rank}: a device mesh ({dims}) holds {size} ranks but the world has "
                          f"{world}; ranks {outside} are outside it. Make the product of the mesh dims (e.g. TP x "
                          "FSDP) equal the launched processes", rank=rank, shape=m["shape"], names=m["names"])
            elif m["coordinate"] is None:
                layer.add("fail", "mesh", f"rank {rank} is not in the mesh ({dims})", rank=rank)
        for w in (run.end or {}).get("wrappers", []):
            for d in w.get("double_wrapped", []):
                layer.add("fail", "double_wrap", f"rank {rank}: {w['model']} is wrapped twice: {d}", rank=rank)
            for pm in w.get("parameter_meshes", []):
                if math.prod(pm["shape"]) != world:
                    layer.add("fail", "mesh", f"rank {rank}: parameters of {w['model']} live on a mesh of "
                              f"{pm['shape']} ({math.prod(pm['shape'])} ranks) in a world of {world}", rank=rank)
        for e in run.errors:
            if "can only be applied to a module once" in e["message"]:
                layer.add("fail", "double_wrap", f"rank {rank}: fully_shard was applied twice to the same module "
                          "(torch refuses it); shard each module once, and do not let a trainer wrap a model that "
                          "is already sharded", rank=rank, error=e["message"][:300])
    _collectives(layer, neuron)
    meshes = {json.dumps(sorted((tuple(m["shape"]), tuple(m["names"])) for m in run.meshes if "error" not in m))
              for run in neuron.ranks.values()}
    if len(meshes) > 1:
        layer.add("fail", "mesh", "ranks built different meshes: " + "; ".join(sorted(meshes)))
    if not any(e["verdict"] == "fail" for e in layer.evidence):
        described = _layout(neuron)
        if described:
            layer.add("pass", "layout", described)
        elif world == 1:
            layer.add("pass", "layout", "one process: nothing is distributed")
    return layer


def _layout(neuron: Side) -> str:
    run = neuron.ranks.get(0)
    if run is None:
        return ""
    parts = [f"mesh {m['shape']} {m['names']}" for m in run.meshes if "error" not in m]
    for w in (run.end or {}).get("wrappers", []):
        kinds = [f"fully_shard on {len(w['fully_shard'])} module(s)"] if w["fully_shard"] else []
        kinds += ["DDP"] if w["ddp"] else []
        kinds += [f"{w['dtensor_parameters']}/{w['parameters']} DTensor parameters"] if w["dtensor_parameters"] else []
        if kinds:
            parts.append(f"{w['model']}: " + ", ".join(kinds))
    return "; ".join(parts)


def _collectives(layer: Layer, neuron: Side) -> None:
    per_rank = {}
    for rank, run in neuron.ranks.items():
        calls: dict[str, int] = {}
        for s in run.steps:
            for name, c in s.get("comm", {}).items():
                calls[name] = calls.get(name, 0) + c["calls"]
        per_rank[rank] = calls
    if len(per_rank) > 1 and any(per_rank.values()):
        distinct = {json.dumps(v, sort_keys=True) for v in per_rank.values()}
        if len(distinct) > 1:
            layer.add("warn", "collectives", f"ranks issued different collectives: {per_rank} (on hardware a "
                      "mismatch hangs)")
        else:
            total = sum(c["bytes"] for s in neuron.ranks[min(per_rank)].steps for c in s.get("comm", {}).values())
            layer.add("pass", "collectives", f"every rank issued the same collectives "
                      f"({per_rank[min(per_rank)]}); rank {min(per_rank)} moved {format_bytes(total)}")


# ------------------------------------------------------------------ operations
def operations(neuron: Side, th: Thresholds, timeout: float) -> Layer:
    layer = Layer()
    failed = [r for r, run in sorted(neuron.ranks.items()) if run.status == "error"]
    for rank, run in sorted(neuron.ranks.items()):
        if run.status == "error":
            e = run.errors[0]
            oom = "OutOfMemoryError" in e["type"]
            what = "ran out of device memory" if oom else f"crashed with {e['type'].rsplit('.', 1)[-1]}"
            layer.add("fail", "oom" if oom else "crash", f"rank {rank} {what} at step {len(run.steps)}: "
                      f"{e['message'][:600]}", rank=rank, log_tail=run.log_tail[-2000:])
        elif run.status == "stopped":
            why = (f"did not finish within the {timeout:.0f} s deadline (hung or too slow); its last event was at "
                   f"step {len(run.steps)}" if neuron.timed_out else
                   f"was stopped by the launcher after rank(s) {failed} failed" if failed else
                   f"exited without finishing (killed or os._exit; return code {neuron.returncode})")
            layer.add("fail", "hang" if neuron.timed_out else "crash", f"rank {rank} {why}", rank=rank,
                      log_tail=run.log_tail[-2000:])
    if not neuron.ranks:
        layer.add("fail", "crash", f"the job wrote no measurement (return code {neuron.returncode}); is it a Python "
                  "job that imports torch?", log_tail=neuron.agent_log[-2000:])
    elif neuron.returncode not in (0, None) and not layer.evidence:
        layer.add("fail", "crash", f"the job exited with code {neuron.returncode}", log_tail=neuron.agent_log)
    for rank, run in sorted(neuron.ranks.items()):
        for core, m in run.peak_memory().items():
            share = m["peak"] / m["capacity"] if m["capacity"] else 0.0
            over = share > th.memory_warn
            line = f", over the {100 * th.memory_warn:.0f}% line: little headroom on Trainium" if over else ""
            layer.add("warn" if over else "pass", "memory", f"rank {rank}: peak {format_bytes(m['peak'])} of "
                      f"{format_bytes(m['capacity'])} on neuron:{core} ({100 * share:.1f}%{line})",
                      rank=rank, device=core, peak=m["peak"], capacity=m["capacity"])
        if run.startup_s is not None:
            verdict = "warn" if run.startup_s > th.max_startup_s else "pass"
            layer.add(verdict, "startup", f"rank {rank}: {run.startup_s:.1f} s from launch to the first forward",
                      rank=rank, seconds=run.startup_s)
        st, tp = run.step_time(), run.throughput()
        if st:
            rate = ""
            if tp and tp["tokens_per_s"]:
                rate = f", {tp['tokens_per_s']:.0f} tokens/s"
            elif tp:
                rate = f", {tp['examples_per_s']:.1f} examples/s"
            layer.add("info", "step_time", f"rank {rank}: steady-state step p50 {st['p50'] * 1e3:.1f} ms, p90 "
                      f"{st['p90'] * 1e3:.1f} ms over {st['steps']} steps{rate} (emulated: host time, not Trainium's)"
                      f"; compile {run.compile_seconds():.1f} s", rank=rank)
    return layer


# ------------------------------------------------------------------ the document
def judge(cfg: CheckConfig, neuron: Side, ref: Side | None, items: list[dict[str, Any]]) -> dict[str, Any]:
    """The report document: layers with verdicts and evidence, ranks, steps (docs/check.md#json-schema)."""
    world = cfg.nproc_per_node or 1
    th = cfg.thresholds
    layers = {"correctness": correctness(neuron, ref, items, th), "compilation": compilation(neuron, th),
              "distribution": distribution(neuron, world), "operations": operations(neuron, th, cfg.timeout)}
    steps = []
    for rank, run in sorted(neuron.ranks.items()):
        ref_losses = ref.ranks[rank].losses() if ref is not None and rank in ref.ranks else []
        for s, d in zip(run.steps, run.durations(), strict=True):
            steps.append({"rank": rank, "step": s["i"], "time": s["t"], "duration_s": d if d == d else None,
                          "loss": s.get("loss"), "finite": s.get("finite", True),
                          "reference_loss": ref_losses[s["i"]] if s["i"] < len(ref_losses) else None,
                          "warmup": s["i"] < run.warmup_steps, "output_shapes": s.get("shapes", []),
                          "memory": s.get("memory", []), "compiled_graphs": s.get("compile", {}).get("graphs", 0),
                          "compile_seconds": s.get("compile", {}).get("seconds", 0.0),
                          "recompiles": s.get("compile", {}).get("recompiles", []),
                          "comm": s.get("comm", {}), "fallbacks": s.get("fallbacks", {}),
                          "tokens": s.get("tokens", 0), "examples": s.get("examples", 0)})
    verdict = max((ORDER[layer.verdict] for layer in layers.values()), default=0)
    return {
        "schema": SCHEMA,
        "verdict": {0: "pass", 1: "warn", 2: "fail"}[verdict],
        "command": neuron.argv, "reference_command": ref.argv if ref else None,
        "instance": cfg.instance, "world_size": world, "timeout_s": cfg.timeout,
        "thresholds": asdict(th),
        "layers": {name: layer.as_dict() for name, layer in layers.items()},
        "ranks": [run.summary() for _, run in sorted(neuron.ranks.items())],
        "steps": steps,
        "reference": None if ref is None else {
            "seconds": ref.seconds, "timed_out": ref.timed_out, "returncode": ref.returncode,
            "ranks": [{"rank": r, "status": run.status, "losses": run.losses()}
                      for r, run in sorted(ref.ranks.items())]},
        "checkpoints": [{"path": i["path"], "kind": i["kind"], "loads_on_cpu": bool(i["loaded"].get("ok")),
                         "error": i["loaded"].get("error"), "saved_from": i["loaded"].get("saved_from")}
                        for i in items],
        "run": {"seconds": neuron.seconds, "timed_out": neuron.timed_out, "returncode": neuron.returncode},
    }

