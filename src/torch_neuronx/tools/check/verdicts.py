"""The four layers of a migration's acceptance, judged from a checked run: pass, warn or fail, with evidence.

Correctness (finite losses, agreement with the reference, output shapes,
recorded values, checkpoints that load on CPU and hold what was saved),
compilation (recompilations after warm-up, distinct shapes, graph breaks, CPU
fallbacks), distribution (every rank joined, meshes that cover the world,
no double wrapping, matching collectives), operations (crashes, hangs,
out-of-memory, memory growth, memory headroom, startup, step time, the first
rank to stop). Each finding is one evidence item; a layer's verdict is its
worst item; a layer that compared nothing says so (a warning, never a pass).
:class:`Thresholds` (config.py) holds every limit, with the defaults
docs/check.md documents.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict
from typing import Any

from torch_neuronx.runtime.config import format_bytes
from torch_neuronx.tools.check import results
from torch_neuronx.tools.check.config import CheckConfig, Side, Thresholds

__all__ = ["LAYERS", "Thresholds", "judge"]

LAYERS = ("correctness", "compilation", "distribution", "operations")
ORDER = {"pass": 0, "info": 0, "warn": 1, "fail": 2}
PROBE_IDS = [1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45]  # the fixed batch HF checkpoints are compared on
SCHEMA = "torch-neuronx-check/1"


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
    if math.isnan(a) or math.isnan(b):  # NaN on both sides is the same outcome (the finiteness check fails it)
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= atol + rtol * abs(b)


def _max_diff(a: Any, b: Any) -> float:
    """Largest |a - b| over two nested lists of numbers (inf when their structure differs)."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(float(a) - float(b)) if not (a != a or b != b) else math.inf
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return max((_max_diff(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    return 0.0 if a == b else math.inf


# ------------------------------------------------------------------ correctness
def correctness(neuron: Side, ref: Side | None, items: list[dict[str, Any]], th: Thresholds,
                reference_skipped: str | None = None) -> Layer:
    layer = Layer()
    runs = neuron.ranks
    if not any(r.steps for r in runs.values()):
        layer.add("warn", "steps", "no step was seen: the job called no optimizer step; add "
                  "torch_neuronx.check.step() at the end of each step")
    elif runs and all(r.end is not None and not r.end.get("optimizer_steps") and not r.end.get("markers")
                      for r in runs.values()):
        layer.add("warn", "steps", "no optimizer step was seen: the job's work was cut into one step at its end, "
                  "so nothing is compared step by step; call optimizer.step() or mark each step with "
                  "torch_neuronx.check.step(loss)")
    for rank, run in sorted(runs.items()):
        bad = next((s for s in run.steps if not s.get("finite", True)), None)
        if bad is not None:
            layer.add("fail", "finite_loss", f"rank {rank}: the loss is not finite at step {bad['i']} "
                      f"({bad['losses']})", rank=rank, step=bad["i"])
    seen = sum(len(s.get("losses") or []) for r in runs.values() for s in r.steps)
    if seen == 0 and any(r.steps for r in runs.values()):
        layer.add("warn", "loss", "no loss was seen: correctness not compared (no backward, autograd.grad or "
                  "torch_neuronx.check.step(loss) call reached the probe)")
    elif seen and not any(e["check"] == "finite_loss" for e in layer.evidence):
        sources = sorted({src for r in runs.values() for s in r.steps for src in s.get("sources", [])})
        layer.add("pass", "finite_loss", f"every one of {seen} losses is finite (from {', '.join(sources) or '?'})")
    _against_reference(layer, neuron, ref, th, reference_skipped)
    _checkpoints(layer, neuron, items)
    return layer


def _unaligned(side: Side | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for run in (side.ranks.values() if side is not None else []):
        for s in run.steps:
            for op, n in s.get("rng_unaligned", {}).items():
                out[op] = out.get(op, 0) + n
    return out


def _why_random(neuron: Side, ref: Side | None) -> str:
    """Why random draws may differ between the runs, when they do (tools/check/rng.py)."""
    ops = _unaligned(neuron)
    if not ops:
        return ""
    return (f". Random ops drew from a neuron generator the CPU reference cannot follow ({', '.join(sorted(ops))}),"
            " so masks and samples may differ: seed a generator per op (torch.Generator(device).manual_seed(s))"
            ", or compare with the random ops off (model.eval(), p=0)")


def identical_parameters(neuron: Side, ref: Side | None) -> bool:
    """Whether both runs' live parameters were the same at every optimizer step: the same ranks, each with the
    same, non-empty list of per-step parameter digests (a hash of every tensor's norm, tools/check/probe.py). Then
    the runs did not diverge, and an optimizer's allowance (which covers rounding two diverging runs amplify) has
    nothing to cover: a checkpoint that differs from the reference's was changed when it was written."""
    if ref is None or not neuron.ranks or set(neuron.ranks) != set(ref.ranks):
        return False
    for rank, run in neuron.ranks.items():
        mine = [st.get("params") for st in run.steps]
        theirs = [st.get("params") for st in ref.ranks[rank].steps]
        if not mine or len(mine) != len(theirs):
            return False
        for a, b in zip(mine, theirs, strict=True):
            if not isinstance(a, dict) or not isinstance(b, dict) or not a.get("digest") or not a.get("n") or \
                    (a.get("digest"), a.get("n"), a.get("structure")) != (b.get("digest"), b.get("n"),
                                                                          b.get("structure")):
                return False
    return True


def norm_allowance(trained: dict[str, Any] | None) -> float:
    """How far the norm of all trained parameters may differ between two correct runs of a normalising optimizer:
    |norm(a) - norm(b)| <= norm(a - b) <= sqrt(sum over tensors of numel x allowance^2), each element within its
    tensor's allowance (tools/check/optimizers.py). 0 for SGD-like optimizers and without a table."""
    if not isinstance(trained, dict) or not trained.get("params"):
        return 0.0
    return math.sqrt(sum(math.prod(p["shape"]) * p["allowance"] ** 2 for p in trained["params"]))


def _params_vs_reference(layer: Layer, rank: int, mine: list[dict[str, Any]], theirs: list[dict[str, Any]],
                         th: Thresholds, trained: dict[str, Any] | None = None) -> None:
    """The last step's parameter norm against the reference's (compared even when no loss was seen), within the
    loss tolerances plus the optimizer's allowance (:func:`norm_allowance`)."""
    a = next((s["params"] for s in reversed(mine) if "norm" in s.get("params", {})), None)
    b = next((s["params"] for s in reversed(theirs) if "norm" in s.get("params", {})), None)
    if a is None or b is None or a.get("sharded") or b.get("sharded") or a["n"] != b["n"]:
        return
    extra = norm_allowance(trained)
    why = (f"; bound {th.loss_atol + th.loss_rtol * abs(b['norm']) + extra:.3g} with {trained['optimizer']}'s "
           f"allowance {extra:.3g} for {trained['steps']} step(s)") if extra and trained else ""
    if _close(a["norm"], b["norm"], th.loss_rtol, th.loss_atol + extra):
        layer.add("pass", "parameters_vs_reference", f"rank {rank}: the parameters' norm after the last step "
                  f"matches the reference's ({a['norm']:.6g} vs {b['norm']:.6g}{why})", rank=rank, allowance=extra)
    else:
        layer.add("fail", "parameters_vs_reference", f"rank {rank}: the parameters after the last step differ "
                  f"from the reference's: norm {a['norm']:.6g} vs {b['norm']:.6g}{why}", rank=rank, allowance=extra)


def _against_reference(layer: Layer, neuron: Side, ref: Side | None, th: Thresholds,
                       skipped: str | None = None) -> None:
    if ref is None and skipped not in (None, "no reference"):
        layer.add("warn", "reference", f"reference skipped: {skipped}; nothing was compared")
        return
    if ref is None:
        layer.add("warn", "reference", "no reference run: put {device} in the command (cpu is substituted) or "
                  "give --reference -- CMD, to compare losses and outputs")
        return
    if ref.interrupted:  # the checker killed it: not the reference's failure (rv29c defect 9)
        layer.add("warn", "reference", f"reference skipped: the check was interrupted ({ref.interrupted} while the "
                  "reference ran); nothing was compared")
        return
    bad_ranks = [r for r, run in ref.ranks.items() if run.status != "ok"] or ([] if ref.ranks else [0])
    if ref.timed_out or bad_ranks:
        layer.add("warn", "reference", f"the reference run did not finish (ranks {bad_ranks}); nothing was "
                  f"compared. {_reference_error(ref)}", log_tail=next(iter(ref.ranks.values())).log_tail
                  if ref.ranks else ref.agent_log)
        return
    if len(ref.ranks) != len(neuron.ranks):
        _mean_losses(layer, neuron, ref, th)
    for rank, run in sorted(neuron.ranks.items()):
        other = ref.ranks.get(rank)
        if other is None or len(ref.ranks) != len(neuron.ranks):
            continue
        mine_steps, their_steps = run.compared_steps(), other.compared_steps()
        if run.status != "ok":  # a crash, an OOM or a hang: operations says so; compare the steps it made
            their_steps = their_steps[:len(mine_steps)]
        mine = [st.get("loss") for st in mine_steps]
        theirs = [st.get("loss") for st in their_steps]
        if len(mine) != len(theirs) and run.status == "ok":
            layer.add("fail", "reference_steps", f"rank {rank}: {len(mine)} steps on neuron, {len(theirs)} in the "
                      "reference run", rank=rank)
        pairs = list(zip(mine, theirs, strict=False))
        diverged = next((i for i, (a, b) in enumerate(pairs) if not _close(a, b, th.loss_rtol, th.loss_atol)), None)
        diffs = [abs(a - b) for a, b in pairs if a is not None and b is not None and a == a and b == b]
        if diverged is not None:
            a, b = pairs[diverged]
            what = (f"{a} vs {b} (tolerance {th.loss_atol} + {th.loss_rtol} x |reference|)" if a is not None and
                    b is not None else f"a loss was seen {'on neuron' if a is not None else 'in the reference'} "
                    f"only ({a} vs {b})")
            layer.add("fail", "loss_vs_reference", f"rank {rank}: the loss diverges from the reference at step "
                      f"{diverged}: {what}{_why_random(neuron, ref)}", rank=rank, step=diverged)
        elif pairs and any(a is not None for a, _ in pairs):
            both = [i for i, (a, b) in enumerate(pairs) if a is not None and b is not None and not math.isfinite(a)]
            same = f"; not finite on both sides from step {both[0]}" if both else ""
            layer.add("pass", "loss_vs_reference", f"rank {rank}: {len(pairs)} losses within tolerance of the "
                      f"reference (max |difference| {max(diffs, default=0.0):.3g}{same})", rank=rank,
                      max_abs_diff=max(diffs, default=0.0))
        _params_vs_reference(layer, rank, mine_steps, their_steps, th, (run.end or {}).get("trained"))
        shape_step = next((i for i, (a, b) in enumerate(zip(mine_steps, their_steps, strict=False))
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


def _reference_error(ref: Side) -> str:
    """Why the reference run failed, in one line: its first rank's exception, else its log's last lines."""
    if ref.timed_out:
        return "It did not finish before the deadline."
    for _, run in sorted(ref.ranks.items()):
        if run.errors:
            e = run.errors[0]
            return f"Its error (rank {run.rank}): {e['type'].rsplit('.', 1)[-1]}: {e['message'][:500]}"
    tail = [t for t in (ref.agent_log or "").strip().splitlines() if t.strip()][-3:]
    return f"Its last output: {' | '.join(tail)[:500]}" if tail else f"It exited with code {ref.returncode}."


def _mean_losses(layer: Layer, neuron: Side, ref: Side, th: Thresholds) -> None:
    """A reference with another world size (one CPU process with the global batch): compare each step's loss
    averaged over the ranks, which is the global batch's loss when every rank's batch has the same weight."""

    def means(side: Side) -> list[float]:
        per_rank = [[s["loss"] for s in run.compared_steps() if s.get("loss") is not None]
                    for run in side.ranks.values()]
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
    for rank, run in sorted(neuron.ranks.items()):
        for ev in run.stream_saves:
            layer.add("warn", "checkpoint", f"rank {rank}: torch.save wrote to a {ev.get('target')} the checker "
                      "cannot read back, so it was not loaded on CPU; save to a path or a file to have it checked",
                      rank=rank)
    if not items:
        layer.add("info", "checkpoint", "the job wrote no checkpoint (torch.save or safetensors); pass "
                  "--checkpoint PATH to have one loaded on CPU")
        return
    records = {k: v for run in neuron.ranks.values() for k, v in run.records.items()}
    for item in items:
        path, got = item["path"], item["loaded"]
        if got.get("interrupted"):  # never tried: not evidence against the file (rv29c defect 9)
            layer.add("info", "checkpoint", f"{path} was not loaded on CPU: the check was interrupted first",
                      path=path)
            continue
        if not got.get("ok") and got.get("pickled_object"):
            layer.add("info", "checkpoint", f"{path} pickles Python objects (weights_only=True refuses it) that do "
                      f"not unpickle on CPU without torch_neuronx: {got.get('error')}. Not a checkpoint of weights "
                      "(a trainer's arguments, say), but a host without Trainium cannot read it", path=path)
            continue
        if got.get("empty_folder"):  # a --checkpoint folder with nothing to load (rv29d)
            layer.add("fail", "checkpoint", f"--checkpoint {path}: {got.get('error')}", path=path)
            continue
        if not got.get("ok"):
            shown = f"{path} (written through a buffer by rank {item.get('rank')})" if item.get("buffer") else path
            layer.add("fail", "checkpoint", f"{shown} does not load on CPU without torch_neuronx: {got.get('error')}. "
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
        versus = got.get("vs_reference")
        problems += _vs_reference(versus)
        mine_steps, their_steps = item.get("optimizer_steps"), item.get("reference_steps")
        if versus and mine_steps is not None and their_steps is not None and mine_steps != their_steps:
            problems.append(f"it was saved after {mine_steps} optimizer step(s) on neuron, after {their_steps} in "
                            "the reference run: the two runs saved it at different points of training")
        if versus and item.get("reference_paired") and any("reference" in x for x in problems):
            problems.append(f"its reference version is {item['reference']} (paired as {item['reference_paired']})")
        if problems:
            layer.add("fail", "checkpoint", f"{path}: " + "; ".join(problems), path=path,
                      worst=(versus or {}).get("worst"))
            continue
        same = ("holds exactly the values saved" if saved else
                "gives the trained model's logits" if item["kind"] == "hf" and logits is not None else
                f"its {len(got.get('tensors', {}))} tensors are finite")
        if not saved and not got.get("tensors") and item["kind"] == "torch.save":
            same = f"holds a {got.get('object', 'Python object')} without tensors"
        if item["kind"] == "dcp":  # torch.distributed.checkpoint: every rank's shards, put together
            same = f"{same} (a distributed checkpoint folder, read whole without a process group)"
        where = got.get("saved_from", [])
        note = f" (tensors saved from {', '.join(where)}: map_location='cpu' is needed)" if "neuron" in where else ""
        if got.get("note"):
            note += f"; it {got['note']}"
        shown = f"{path} (written through a buffer by rank {item.get('rank')})" if item.get("buffer") else path
        if versus and versus.get("not_compared"):
            layer.add("warn", "checkpoint", f"{path}: the values of {versus['not_compared'][:5]} were not compared: "
                      f"{_allowance_words(versus, {'allowance': math.inf})}; keys, shapes and dtypes match",
                      path=path)
            continue
        if versus:
            w = versus.get("worst") or {}
            worst = f"; worst {w['key']}: max |difference| {w['max_abs_diff']:.3g} (bound {_bound_words(w, versus)})" \
                if w else ""
            paired = f" ({item['reference']}, paired as {item['reference_paired']})" \
                if item.get("reference_paired") else ""
            note += (f"; it matches the reference run's version{paired}: the same {versus['compared']} keys, shapes "
                     f"and dtypes, values within tolerance{worst}")
        elif item.get("not_hidden"):  # the reference may have overwritten it: said, never compared or passed
            layer.add("warn", "checkpoint", f"{shown} loads on CPU in a fresh process without torch_neuronx and "
                      f"{same}{note}, but it could not be moved aside while the reference ran (not a regular file "
                      "or folder, or over the checker's copy limit on another filesystem): what is left may be the "
                      "reference's; nothing was compared", path=path)
            continue
        elif item.get("input_not_kept"):  # rv29d: an input the job rewrote, too large to keep a copy of
            layer.add("warn", "checkpoint", f"{shown} loads on CPU in a fresh process without torch_neuronx and "
                      f"{same}{note}, but it was not compared: the job read this --checkpoint and wrote it again, and "
                      "it is over the 4 GiB the checker copies to keep an input's content for the reference, which "
                      "could not start from it (docs/check.md)", path=path)
            continue
        elif item.get("reference_expected"):  # loads, but nothing was compared: a warning, never a pass
            layer.add("warn", "checkpoint", f"{shown} loads on CPU in a fresh process without torch_neuronx and "
                      f"{same}{note}, but it was not compared: the reference run wrote no version of it (at the "
                      "same path, the path with cpu for neuron, or the only file of its name), or did not finish",
                      path=path)
            continue
        layer.add("pass", "checkpoint", f"{shown} loads on CPU in a fresh process without torch_neuronx and "
                  f"{same}{note}", path=path, worst=(versus or {}).get("worst"))


def _vs_reference(versus: dict[str, Any] | None) -> list[str]:
    """What differs between a checkpoint and the reference run's version of it (cpu_loader.compare)."""
    if not versus:
        return []
    if "error" in versus:
        return [f"the reference run's version did not load, so it was not compared: {versus['error']}"]
    problems = []
    if versus["missing"]:
        problems.append(f"keys the reference run saved are missing: {versus['missing'][:5]}")
    if versus["extra"]:
        problems.append(f"keys the reference run did not save: {versus['extra'][:5]}")
    if versus["shapes"]:
        problems.append("shapes differ from the reference's: " + ", ".join(f"{k} {a} vs {b}" for k, a, b in
                                                                            versus["shapes"][:5]))
    if versus["dtypes"]:
        problems.append("dtypes differ from the reference's: " + ", ".join(f"{k} {a} vs {b}" for k, a, b in
                                                                            versus["dtypes"][:5]))
    if versus["values"]:
        k, diff, bound, extra = (versus["values"][0] + [{}])[:4]
        problems.append(f"{len(versus['values'])} tensor(s) differ from the reference's beyond tolerance, the worst "
                        f"{k}: max |difference| {diff:.4g} (bound {_bound_words({'bound': bound, **extra}, versus)})")
        if not extra.get("allowance") and (extra.get("family") or (versus.get("optimizer") or {}).get("family")) \
                == "unknown":
            unmodelled = extra.get("optimizer") or versus["optimizer"]["optimizer"]
            problems.append(f"{unmodelled} is an optimizer the checker does not model: if it "
                            "normalises its update (as Adam does), widen --loss-rtol/--loss-atol")
    return problems


def _allowance_words(versus: dict[str, Any], w: dict[str, Any]) -> str:
    """The optimizer allowance of one tensor in words: "AdamW: 3 steps at lr 0.01: allowance 0.06"."""
    from torch_neuronx.tools.check import optimizers

    opt = versus.get("optimizer") or {}
    if not opt:
        return "no optimizer step was seen"
    lr = w.get("lr") or []
    return optimizers.describe(w.get("optimizer") or opt.get("optimizer") or "?",  # the tensor's own optimizer
                               w.get("family") or opt.get("family") or "unknown",
                               w.get("steps", opt.get("steps") or 0), list(lr), w.get("allowance", 0.0))


def _bound_words(w: dict[str, Any], versus: dict[str, Any]) -> str:
    """A tensor's bound and why: the loss tolerances scaled to it, plus the optimizer's allowance when it was
    trained by a normalising optimizer."""
    if "tight" not in w:
        return f"{w['bound']:.3g} = atol + rtol x max|reference|"
    tolerance = f"{w['tight']:.3g} (atol + rtol x max|reference|)"
    if not w.get("allowance"):
        opt = versus.get("optimizer") or {}
        if (w.get("family") or opt.get("family")) in ("sgd", "unknown"):
            return f"{w['bound']:.3g} = {tolerance}, no optimizer allowance: {_allowance_words(versus, w)}"
        why = w.get("matched") or "no optimizer step seen"
        if why == "no optimizer step seen":
            why = "no optimizer step had been taken when it was saved"
        return f"{w['bound']:.3g} = {tolerance}, no optimizer allowance: {why}" + (
            f" ({opt['optimizer']})" if opt.get("optimizer") else "")
    beyond = f"; {w['beyond_tight']} of {w['numel']} elements beyond the tolerance" if "numel" in w else ""
    return (f"{w['bound']:.3g} = {tolerance} + the optimizer's allowance {w['allowance']:.3g}: "
            f"{_allowance_words(versus, w)}, matched {w['matched']}{beyond}")


# ------------------------------------------------------------------ compilation
# Graph breaks PyTorch's DistributedDataParallel makes itself under torch.compile: its Logger's runtime stats
# and its forward's bookkeeping, which Dynamo does not trace (torch/nn/parallel/distributed.py); not the job's.
TORCH_OWN_BREAKS = ("set_runtime_stats_and_log", "DistributedDataParallel.")


def _one_reason(reason: str) -> str:
    """Dynamo's graph-break paragraph as one line: its first line and its explanation, at most 200 characters."""
    lines = [ln.strip() for ln in str(reason).splitlines() if ln.strip()]
    why = next((ln.removeprefix("Explanation:").strip() for ln in lines if ln.startswith("Explanation:")), "")
    return " ".join(f"{lines[0] if lines else ''}: {why}".split()).strip(": ")[:200]


def _graph_breaks(layer: Layer, rank: int, breaks: dict[str, Any]) -> None:
    """Graph breaks in the job's code warn, each reason on one line; those inside DDP's own code are said as
    info (rv29c defect 10)."""
    reasons = list(breaks.get("reasons") or {})
    own = [r for r in reasons if any(k in r for k in TORCH_OWN_BREAKS)]
    theirs = [r for r in reasons if r not in own]
    if theirs or not reasons:
        shown = "; ".join(_one_reason(r) for r in theirs[:3])
        layer.add("warn", "graph_breaks", f"rank {rank}: {breaks['count']} graph break(s)" +
                  (f": {shown}" if shown else "") + (f" (and {len(own)} inside DDP's own code)" if own else ""),
                  rank=rank, reasons=theirs[:10])
    else:
        layer.add("info", "graph_breaks", f"rank {rank}: {breaks['count']} graph break(s), all inside PyTorch's "
                  "DistributedDataParallel (its own bookkeeping, which Dynamo does not trace), not in the job's "
                  f"code: {'; '.join(_one_reason(r) for r in own[:3])}", rank=rank, reasons=own[:10])
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
            _graph_breaks(layer, rank, breaks)
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
    _optimizer_steps(layer, neuron, world)
    _replicas(layer, neuron, world)
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


def _replicated(run: Any) -> bool:
    """Whether this rank's model is a data-parallel replica: DDP, or plain parameters kept in step by
    all-reduces (no sharding: FSDP, fully_shard and DTensor parameters differ between ranks by design)."""
    wrappers = (run.end or {}).get("wrappers", [])
    if any(w.get("fsdp") or w.get("fully_shard") or w.get("dtensor_parameters") for w in wrappers):
        return False
    if any(w.get("ddp") for w in wrappers):
        return True
    all_reduces = any("all_reduce" in name or "allreduce" in name for name in _rank_collectives(run))
    return bool(wrappers) and all_reduces


def _replicas(layer: Layer, neuron: Side, world: int) -> None:
    """Replicas must hold the same parameters after every step. Each rank wrote a digest of its optimizer's
    parameters (per-tensor norms) per step to its own event file; they are compared here, never by a
    collective in the job."""
    ranks = {r: run for r, run in neuron.ranks.items() if _replicated(run)}
    if world < 2 or len(ranks) < 2:
        return
    digests: dict[int, dict[int, dict[str, Any]]] = {
        r: {s["i"]: s["params"] for s in run.steps if s.get("params", {}).get("digest")} for r, run in ranks.items()}
    common = sorted(set.intersection(*(set(d) for d in digests.values())))
    if not common:
        return
    local_sgd = sorted({h for run in ranks.values() for w in (run.end or {}).get("wrappers", [])
                        for h in w.get("comm_hooks", []) if "localsgd" in h.lower()})
    if local_sgd:  # torch.distributed.algorithms.model_averaging: replicas differ between periodic averages
        layer.add("warn", "replicas", f"the replicas were not compared: DDP's {', '.join(local_sgd)} (local SGD) lets "
                  "them differ between the periodic averages (PostLocalSGDOptimizer averages after the inner "
                  "optimizer's step, where the checker reads the parameters)")
        return
    shapes = {r: (digests[r][common[0]]["n"], digests[r][common[0]].get("structure")) for r in sorted(ranks)}
    if len(set(shapes.values())) > 1:  # other parameters on each rank (pipeline stages): not replicas
        layer.add("info", "replicas", "not compared as replicas: the ranks' optimizers hold parameters of other "
                  f"numbers or shapes ({', '.join(f'rank {r}: {n} tensors' for r, (n, _) in shapes.items())}), "
                  "as pipeline stages do")
        return
    first = min(ranks)
    for i in common:
        differ = [r for r in sorted(ranks) if digests[r][i]["digest"] != digests[first][i]["digest"]]
        if differ:
            norms = ", ".join(f"rank {r} {digests[r][i]['norm']:.6g}" for r in sorted(ranks))
            layer.add("fail", "replicas", f"replicas drifted apart at step {i}: ranks {differ} hold other parameters "
                      f"than rank {first} (parameter norms: {norms}). Every replica must apply the same update: "
                      "the same learning rate, schedule and averaged gradients on every rank", step=i, ranks=differ)
            return
    layer.add("pass", "replicas", f"the {len(ranks)} replicas hold identical parameters after each of "
              f"{len(common)} steps (digests of the optimizer's parameters, compared between ranks' event files)")


def _optimizer_steps(layer: Layer, neuron: Side, world: int) -> None:
    """Every rank of one job steps its optimizer as often as the others (data, tensor and pipeline parallel
    alike): a rank that took fewer steps holds other parameters than its peers."""
    steps = {r: run.optimizer_steps for r, run in sorted(neuron.ranks.items()) if run.end is not None and
             not (run.end or {}).get("markers")}
    if world < 2 or len(steps) < 2 or len({v for v in steps.values() if v is not None}) < 2:
        return
    most = max(steps, key=lambda r: steps[r] or 0)
    fewer = [r for r, v in steps.items() if (v or 0) < (steps[most] or 0)]
    shown = ", ".join(f"rank {r} took {steps[r] or 0}" for r in fewer)
    calls = {r: {name: c["calls"] for name, c in _rank_collectives(neuron.ranks[r]).items()} for r in steps}
    issued = f" (collectives issued: {calls})" if any(calls.values()) else ""
    layer.add("fail", "optimizer_steps", f"ranks took different numbers of optimizer steps: {shown}, rank {most} took "
              f"{steps[most]}; replicas hold different parameters{issued}", ranks=fewer, steps=steps, calls=calls)


def _rank_collectives(run: Any) -> dict[str, dict[str, int]]:
    """A rank's collectives: the process's totals read from its process groups' own counters at exit (those
    issued after its last step, or with no step at all, included), else the sum of its steps'."""
    total = (run.end or {}).get("comm")
    if isinstance(total, dict) and "error" not in total:
        return {name: {"calls": c["calls"], "bytes": c["bytes"]} for name, c in total.items() if c["calls"]}
    summed: dict[str, dict[str, int]] = {}
    for s in run.steps:
        for name, c in s.get("comm", {}).items():
            t = summed.setdefault(name, {"calls": 0, "bytes": 0})
            t["calls"] += c["calls"]
            t["bytes"] += c["bytes"]
    return summed


def _collectives(layer: Layer, neuron: Side) -> None:
    counted = {rank: _rank_collectives(run) for rank, run in sorted(neuron.ranks.items())}
    per_rank = {rank: {name: c["calls"] for name, c in comm.items()} for rank, comm in counted.items()}
    # A rank with no end record (killed, or crashed) is counted by its completed steps only: what it issued after
    # them is unknown, so its counts are not evidence of a mismatch (rv29f defects 2 and 4)
    partial = sorted(rank for rank, run in neuron.ranks.items() if run.end is None)
    if len(per_rank) > 1 and any(per_rank.values()):
        distinct = {json.dumps(v, sort_keys=True) for v in per_rank.values()}
        if len(distinct) > 1 and partial:
            layer.add("info", "collectives", f"rank(s) {partial} ended without their exit record (killed, or "
                      "crashed), so only the collectives of their completed steps are counted; the ranks' counts "
                      f"{per_rank} are not compared", calls=per_rank, partial=partial)
        elif len(distinct) > 1:
            layer.add("warn", "collectives", f"ranks issued different collectives: {per_rank} (on hardware a "
                      "mismatch hangs)", calls=per_rank)
        else:
            first = min(per_rank)
            total = sum(c["bytes"] for c in counted[first].values())
            scope = (f" in the steps every rank completed (rank(s) {partial} ended without their exit record)"
                     if partial else "")
            layer.add("pass", "collectives", f"every rank issued the same collectives{scope} "
                      f"({per_rank[first]}); rank {first} moved {format_bytes(total)}", calls=per_rank)


# ------------------------------------------------------------------ operations
def operations(neuron: Side, th: Thresholds, timeout: float, ref: Side | None = None) -> Layer:
    layer = Layer()
    if neuron.interrupted:
        layer.add("fail", "interrupted", f"the check was stopped by {neuron.interrupted}; every process of the job "
                  "was killed")
    elif ref is not None and ref.interrupted:
        layer.add("fail", "interrupted", f"the check was stopped by {ref.interrupted} while the reference ran; "
                  "every process of it was killed")
    _first_stop(layer, neuron)
    failed = [r for r, run in sorted(neuron.ranks.items()) if run.status == "error"]
    first_error = min((float(neuron.ranks[r].errors[0]["t"]) for r in failed), default=None)
    for rank, run in sorted(neuron.ranks.items()):
        done = len(run.compared_steps())  # steps are numbered from 0: the one it was in is the next number
        if run.status == "error":
            e = run.errors[0]
            oom = "OutOfMemoryError" in e["type"]
            what = "ran out of device memory" if oom else f"crashed with {e['type'].rsplit('.', 1)[-1]}"
            layer.add("fail", "oom" if oom else "crash", f"rank {rank} {what} in step {done} (after {done} "
                      f"completed step(s)): {e['message'][:600]}", rank=rank, step=done,
                      log_tail=run.log_tail[-2000:])
        elif run.status == "stopped" and neuron.interrupted and not neuron.timed_out:  # the checker's own kill
            at = results.where(run)
            layer.add("info", "interrupted", f"rank {rank} was in step {done} (after {done} completed step(s)) when "
                      f"the checker killed it on {neuron.interrupted}" + (f": {at['text']}" if at else ""),
                      rank=rank, step=done, where=at)
        elif run.status == "stopped":
            exit_ = neuron.exits.get(rank, {})
            stopped_after = first_error is not None and run.stopped_at is not None and run.stopped_at > first_error
            how = (f"was killed by {exit_['signal']}" if exit_.get("signal") else
                   f"exited with code {exit_['exitcode']}" if exit_ else "exited")
            at = results.where(run) if neuron.timed_out else None
            why = (f"did not finish within the {timeout:.0f} s deadline (hung or too slow); it was in step {done} "
                   f"(after {done} completed step(s))" + (f", {at['text']}" if at else "") if neuron.timed_out else
                   f"was stopped by the launcher after rank(s) {failed} failed" if failed and stopped_after else
                   f"{how} {_in_step(neuron, done)} without a Python exception (killed, os._exit or an abort in "
                   f"C++; return code {neuron.returncode})")
            layer.add("fail", "hang" if neuron.timed_out else "crash", f"rank {rank} {why}", rank=rank,
                      log_tail=run.log_tail[-2000:], where=at)
    _who_hung(layer, neuron)
    _leftovers(layer, neuron)
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
        _leak(layer, rank, run)
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


def _who_hung(layer: Layer, neuron: Side) -> None:
    """A multi-rank job killed at the deadline (or interrupted) with its ranks' stacks (results.where): the rank(s)
    stuck in their own code are the cause, the ranks waiting in a collective wait for them. Put first: the other
    ranks' hang messages are its consequences."""
    if not (neuron.timed_out or neuron.interrupted) or len(neuron.ranks) < 2:
        return
    places = {r: results.where(run) for r, run in sorted(neuron.ranks.items()) if run.status == "stopped"}
    stuck = [r for r, at in places.items() if at and at["kind"] == "own"]
    waiting = [r for r, at in places.items() if at and at["kind"] == "collective"]
    _different_collectives(layer, neuron, {r: places[r]["call"] for r in waiting})  # type: ignore[index]
    if not stuck:
        return
    text = "; ".join(f"rank {r} {places[r]['text']}" for r in stuck)  # type: ignore[index]
    why = "waited for it in a collective (on hardware they would wait forever)" if neuron.timed_out else \
        "were in a collective"
    waited = (f"; rank(s) {waiting} {why}: "
              + "; ".join(f"rank {r} {places[r]['text']}" for r in waiting)) if waiting else ""  # type: ignore[index]
    if neuron.timed_out:
        what = f"rank(s) {stuck} hung in the job's own code when the job was killed at the deadline"
    else:  # the checker was stopped: the ranks were running, not hung (rv29c defect 9)
        what = f"rank(s) {stuck} were in the job's own code when the checker killed the job on {neuron.interrupted}"
    layer.evidence.insert(0, {"verdict": "fail" if neuron.timed_out else "info", "check": "hang",
                              "message": f"{what}: {text}{waited}", "stuck": stuck, "waiting": waiting})


def _different_collectives(layer: Layer, neuron: Side, calls: dict[int, str]) -> None:
    """Ranks killed at the deadline while waiting in different collectives (rank 0 in barrier, rank 1 in a backward's
    all-reduce): say so in one line, first. A collective completes only when every rank of its group calls it, so a
    collective some ranks skip (or call in another order) hangs them all: the usual cause of a distributed hang."""
    if not neuron.timed_out or len(set(calls.values())) < 2:
        return
    each = ", ".join(f"rank {r} in {call}" for r, call in sorted(calls.items()))
    layer.evidence.insert(0, {"verdict": "fail", "check": "hang", "message": f"the ranks hung in different "
                              f"collectives ({each}): a collective completes only when every rank calls it, so one "
                              "that some ranks skip or call in another order waits forever, the usual cause of a "
                              "hang; make every rank issue the same collectives in the same order",
                              "collectives": {str(r): c for r, c in calls.items()}})


def _one_line(command: Any, limit: int) -> str:
    """A process's command line on one line (a `python -c` script spans many), cut to `limit` characters."""
    return " ".join(str(command).split())[:limit]


def _leftovers(layer: Layer, neuron: Side) -> None:
    """Processes the job left running after it ended (daemons, helpers in sessions of their own): the
    checker's guardian killed them; on a Trainium host they would hold the cores the next job needs."""
    left = [k for k in neuron.killed if k.get("when") == "left running"]
    if left:
        shown = "; ".join(f"pid {k['pid']}: {_one_line(k['command'], 160)}" for k in left[:8])
        layer.add("warn", "leftover_processes", f"the job left {len(left)} process(es) running after it ended; "
                  f"the checker killed them: {shown}. Stop or wait for the processes a job starts (on a Trainium "
                  "host a leftover process can hold the NeuronCores the next job needs)", processes=left)
    stopped = [k for k in neuron.killed if k.get("when") != "left running"]
    if stopped:
        why = "at the deadline" if neuron.timed_out else f"on {neuron.interrupted}" if neuron.interrupted else \
            "when the check stopped"
        layer.add("info", "killed", f"{len(stopped)} process(es) of the job were killed {why}: "
                  + "; ".join(f"pid {k['pid']}: {_one_line(k['command'], 120)}" for k in stopped[:8]),
                  processes=stopped)


def _leak(layer: Layer, rank: int, run: Any, min_steps: int = 4) -> None:
    """Allocated device memory that grows at every steady-state step: the bytes per step, and the step at which
    the core runs out at that rate."""
    steady = [s for s in run.steps[run.warmup_steps:] if not s.get("final")]
    per_core: dict[int, list[tuple[int, int, int]]] = {}
    for s in steady:
        for m in s.get("memory", []):
            per_core.setdefault(m["device"], []).append((s["i"], m["allocated"], m["capacity"]))
    for core, pts in per_core.items():
        if len(pts) < min_steps:
            continue
        growth = [b[1] - a[1] for a, b in zip(pts, pts[1:], strict=False)]
        if not all(g > 0 for g in growth):
            continue
        rate = (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])
        step, allocated, capacity = pts[-1]
        oom = step + math.ceil((capacity - allocated) / rate) if capacity > allocated else step
        layer.add("warn", "memory_growth", f"rank {rank}: allocated memory on neuron:{core} grew at every one of "
                  f"{len(growth)} steady-state steps, {format_bytes(int(rate))} per step on average "
                  f"({format_bytes(pts[0][1])} at step {pts[0][0]}, {format_bytes(allocated)} at step {step}); at "
                  f"that rate the core's {format_bytes(capacity)} run out at step {oom}. Look for tensors kept "
                  "across steps (a list of losses not detached, a growing cache)", rank=rank, device=core,
                  bytes_per_step=rate, projected_oom_step=oom)


def _first_stop(layer: Layer, neuron: Side) -> None:
    """In a job of several ranks where one failed: the first rank to stop (by time, from its last events and
    torchrun's record), how it stopped, and its log tail; the others' errors are usually its consequences
    ("Connection closed by peer")."""
    ranks = neuron.ranks
    if len(ranks) < 2 or neuron.timed_out or neuron.interrupted:  # killed by the checker: no rank stopped first
        return
    bad = [r for r, run in ranks.items() if run.status != "ok"] + [r for r in neuron.exits if r in ranks]
    # a rank that finished normally is a suspect (it may have left its peers' collective) unless a failed rank
    # raised in its own code: that exception is the failure, not the consequence of a peer leaving
    own = any(_raised_in_own_code(ranks[b]) for b in bad)
    early_ok = [r for r, run in ranks.items() if run.status == "ok" and not own and
                any(ranks[b].status != "ok" for b in bad)]
    if not bad:
        return
    candidates = {r: ranks[r].stopped_at for r in set(bad) | set(early_ok) if ranks[r].stopped_at is not None}
    if not candidates:
        return
    first = min(candidates, key=lambda r: candidates[r])
    # among the ranks torchrun saw fail, its own record wins over the events' times (rv29e defect 8: a rank that
    # aborted at teardown after its end event looked later than the peer torchrun then SIGTERMed): the root cause it
    # names, never a rank it SIGTERMed. A rank that exited 0 early is no failure to torchrun: the times decide.
    root = next((r for r, e in neuron.exits.items() if e.get("root_cause") and r in ranks), None)
    terminated = {r for r, e in neuron.exits.items() if e.get("signal") == "SIGTERM" and not e.get("root_cause")}
    if root is not None and first in neuron.exits:
        first = root
    elif first in terminated and set(candidates) - terminated:
        first = min(set(candidates) - terminated, key=lambda r: candidates[r])
    run = ranks[first]
    failed = [ranks[r] for r in set(bad) if ranks[r].errors]
    if run.errors and len(failed) == len(set(bad)) and len({x.errors[0]["type"] for x in failed}) == 1 and \
            len({x.errors[0]["message"][:80] for x in failed}) == 1:
        return  # every rank raised the same error on its own: none of them is the others' cause
    t0 = min((x.launched for x in ranks.values() if x.launched), default=None)
    at = f" at {candidates[first] - t0:.1f} s" if t0 and first in candidates else ""
    exit_ = neuron.exits.get(first, {})
    if run.errors:
        how = f"raised {run.errors[0]['type'].rsplit('.', 1)[-1]}: {run.errors[0]['message'][:300]}"
    elif exit_.get("signal"):
        when = "after its last step, at exit" if run.status == "ok" else "without a Python exception"
        how = (f"was killed by {exit_['signal']} {when} (exit code {exit_['exitcode']}: an abort in C++, e.g. "
               "gloo's collective mismatch, a thread left running at exit, or os.abort)")
    elif exit_:
        how = (f"exited with code {exit_['exitcode']} with no uncaught exception recorded (sys.exit, os._exit or a "
               "C++ abort)")
    elif run.status == "ok":
        how = ("exited normally (code 0) while the other ranks were still running: a rank that leaves early "
               "makes its peers' next collective fail")
    else:
        how = "stopped without a Python exception or an exit record (killed, or aborted in C++)"
    others = sorted(r for r in ranks if r != first and ranks[r].status != "ok")
    after = f"; ranks {others} failed after it" if others else ""
    layer.add("fail", "first_stop", f"rank {first} stopped first{at}, after {len(run.steps)} step(s): it {how}"
              f"{after}", rank=first, log_tail=run.log_tail[-2000:])



def _in_step(neuron: Side, done: int) -> str:
    """Where a stopped rank was: "in step N" (numbered from 0), or "after its last step" when a rank that ended
    normally ran no more steps than it completed (rv29f: "in step 5" of a five-step job)."""
    last = max((len(r.steps) for r in neuron.ranks.values() if r.end is not None), default=None)
    return f"after its last step ({done} completed)" if last is not None and done >= last else f"in step {done}"


def _raised_in_own_code(run: Any) -> bool:
    """Whether the rank's first Python exception came from the job's own code (its traceback's innermost frame
    outside torch and torch_neuronx: a KeyError in the script), not from inside a collective or a backward that a
    peer's departure broke (gloo's "Connection closed by peer" surfaces in torch's frames)."""
    if not run.errors:
        return False
    error = run.errors[0]
    if any(word in error["type"] for word in ("Dist", "Connection", "Timeout")):
        return False
    frames = re.findall(r'File "([^"]+)", line', error.get("traceback") or "")
    if not frames:
        return False
    return not any(f"{os.sep}{pkg}{os.sep}" in frames[-1] for pkg in ("torch", "torch_neuronx"))


# ------------------------------------------------------------------ buckets (check --hf-model --buckets)
def bucket_compilation(layer: Layer, neuron: Side, buckets: list[int]) -> None:
    """Per bucket of `--buckets`: the generate workload's last 2 x len(buckets) steps are one warm-up call per
    bucket, then one steady call per bucket (tools/check/hf_workload.py). Each warm-up call must compile (its static
    cache has a new length; none compiled: the bucket ran eagerly); no steady call may; the graphs compiled in all
    must equal the number of buckets, as on Trainium, where each bucket is one compiled graph (docs/serve.md)."""
    for rank, run in sorted(neuron.ranks.items()):
        steps = [s for s in run.steps if not s.get("final")]
        if len(steps) < 2 * len(buckets):
            layer.add("fail", "buckets", f"rank {rank}: {len(steps)} step(s) recorded, fewer than the "
                      f"{2 * len(buckets)} generate calls of {len(buckets)} bucket(s): the workload stopped early",
                      rank=rank)
            continue
        warm, steady = steps[-2 * len(buckets):-len(buckets)], steps[-len(buckets):]
        total = 0
        for length, w, s in zip(buckets, warm, steady, strict=True):
            graphs = w.get("compile", {}).get("graphs", 0)
            again = s.get("compile", {}).get("graphs", 0)
            late = max(again, len(s.get("compile", {}).get("recompiles", [])))
            total += graphs + again
            eager = "" if graphs else " (it ran uncompiled: each bucket needs its own graph, as on Trainium)"
            layer.add("fail" if late or not graphs else "pass", "bucket", f"rank {rank}: bucket {length}: {graphs} "
                      f"graph(s) compiled in its first generate call, {late} compilation(s) in its steady-state call"
                      f"{eager}", rank=rank, bucket=length, graphs=graphs, steady_compiles=late)
        verdict = "pass" if total == len(buckets) else "fail"
        layer.add(verdict, "buckets", f"rank {rank}: {total} graph(s) compiled for {len(buckets)} bucket(s) "
                  f"{buckets} (expected one per bucket)", rank=rank, graphs=total, buckets=list(buckets))


# ------------------------------------------------------------------ the document
def judge(cfg: CheckConfig, neuron: Side, ref: Side | None, items: list[dict[str, Any]],
          reference_skipped: str | None = None) -> dict[str, Any]:
    """The report document: layers with verdicts and evidence, ranks, steps (docs/check.md#json-schema)."""
    world = cfg.nproc_per_node or 1
    th = cfg.effective_thresholds()
    layers = {"correctness": correctness(neuron, ref, items, th, reference_skipped),
              "compilation": compilation(neuron, th),
              "distribution": distribution(neuron, world), "operations": operations(neuron, th, cfg.timeout, ref)}
    if cfg.buckets:
        bucket_compilation(layers["compilation"], neuron, cfg.buckets)
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
            "interrupted": ref.interrupted, "killed": ref.killed,
            "ranks": [{"rank": r, "status": run.status, "losses": run.losses()}
                      for r, run in sorted(ref.ranks.items())]},
        "checkpoints": [{"path": i["path"], "kind": i["kind"], "loads_on_cpu": bool(i["loaded"].get("ok")),
                         "error": i["loaded"].get("error"), "saved_from": i["loaded"].get("saved_from")}
                        for i in items],
        "reference_skipped": reference_skipped if reference_skipped != "no reference" else None,
        "run": {"seconds": neuron.seconds, "timed_out": neuron.timed_out, "returncode": neuron.returncode,
                "interrupted": neuron.interrupted, "killed": neuron.killed},
        "interrupted": neuron.interrupted or (ref.interrupted if ref is not None else None),
    }

