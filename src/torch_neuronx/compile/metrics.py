"""What the ``neuron`` backend compiled, why it recompiled, and what the cache saved.

On Trainium every new input shape is a new compilation (minutes on real
hardware), so recompilations are the first thing to watch:
``torch.neuron.get_dynamo_metrics()`` returns :func:`snapshot`. When one
function recompiles more than ``recompile_warning_threshold`` times, a
warning names the dimension that keeps changing and points to bucketing.
Environment: TORCH_NEURONX_RECOMPILE_WARN_THRESHOLD (default 4; Dynamo's own
recompile_limit, 8, then stops compiling the function and runs it eagerly).
"""

from __future__ import annotations

import os
import threading
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

Shape = tuple[int, ...]


@dataclass(frozen=True)
class InputDesc:
    name: str  # Dynamo's source, e.g. "L['input_ids']"
    shape: Shape | None  # None: not a tensor
    value: Any = None  # for ints the graph was specialised on
    parameter: bool = False


@dataclass
class GraphRecord:
    function: str
    compile_id: str | None
    inputs: tuple[InputDesc, ...]
    seconds: float
    cache: str  # "memory", "disk", "miss" or "off"
    changed: tuple[tuple[str, int, int, int], ...] = ()  # (input, dim, before, after)


@dataclass
class _FunctionStats:
    graphs: list[GraphRecord] = field(default_factory=list)
    warned: bool = False


def _threshold_from_env() -> int:
    text = os.environ.get("TORCH_NEURONX_RECOMPILE_WARN_THRESHOLD", "").strip()
    if not text:
        return 4
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        warnings.warn(f"TORCH_NEURONX_RECOMPILE_WARN_THRESHOLD={text!r} is not a number of recompilations "
                      "(a non-negative integer); using the default, 4", stacklevel=2)
        return 4
    return value


recompile_warning_threshold: int = _threshold_from_env()

_lock = threading.Lock()
_functions: dict[str, _FunctionStats] = {}
_cache = Counter[str]()
_corrupt_removed: list[str] = []
_graph_break_baseline: Counter[str] = Counter()


def record_graph(function: str, inputs: tuple[InputDesc, ...], seconds: float, cache: str,
                 compile_id: str | None = None) -> GraphRecord:
    """Note one graph compiled for `function`; warn when the function keeps recompiling."""
    with _lock:
        stats = _functions.setdefault(function, _FunctionStats())
        record = GraphRecord(function, compile_id, inputs, seconds, cache, _changes(stats.graphs, inputs))
        stats.graphs.append(record)
        recompiles = len(stats.graphs) - 1
        warn = recompiles > recompile_warning_threshold and not stats.warned
        if warn:
            stats.warned = True
            varying = _varying_dims(stats.graphs)
    if warn:
        _warn_recompiles(function, recompiles, varying)
    return record


def record_cache(kind: str, hit: bool) -> None:
    with _lock:
        _cache[f"{kind}_{'hits' if hit else 'misses'}"] += 1


def record_corrupt(paths: list[str]) -> None:
    with _lock:
        _corrupt_removed.extend(paths)


def _changes(previous: list[GraphRecord], inputs: tuple[InputDesc, ...]) -> tuple[tuple[str, int, int, int], ...]:
    """The dims in which `inputs` differ from the closest earlier graph of the same function."""
    best: tuple[tuple[str, int, int, int], ...] | None = None
    for record in reversed(previous):
        if [d.name for d in record.inputs] != [d.name for d in inputs]:
            continue
        diff = []
        for old, new in zip(record.inputs, inputs, strict=True):
            if old.shape is None or new.shape is None:
                if old.value != new.value:
                    diff.append((new.name, -1, old.value, new.value))
            elif len(old.shape) != len(new.shape):
                diff.append((new.name, -1, len(old.shape), len(new.shape)))
            else:
                diff.extend((new.name, d, a, b) for d, (a, b) in enumerate(zip(old.shape, new.shape, strict=True))
                            if a != b)
        if best is None or len(diff) < len(best):
            best = tuple(diff)
    return best or ()


def _varying_dims(graphs: list[GraphRecord]) -> dict[tuple[str, int], set[int]]:
    sizes: dict[tuple[str, int], set[int]] = {}
    for record in graphs:
        for name, dim, _, _ in record.changed:
            sizes.setdefault((name, dim), set())
    for record in graphs:
        for desc in record.inputs:
            for (name, dim), seen in sizes.items():
                if desc.name == name and desc.shape is not None and 0 <= dim < len(desc.shape):
                    seen.add(desc.shape[dim])
    return sizes


def _describe_change(name: str, dim: int, before: Any, after: Any) -> str:
    if dim < 0:
        return f"{name}: {before} -> {after}"
    return f"{name} dim {dim}: {before} -> {after}"


def _warn_recompiles(function: str, recompiles: int, varying: dict[tuple[str, int], set[int]]) -> None:
    if varying:
        dims = "; ".join(
            f"{name} dim {dim} took {len(sizes)} sizes ({', '.join(map(str, sorted(sizes)[:8]))}"
            f"{', ...' if len(sizes) > 8 else ''})"
            for (name, dim), sizes in varying.items() if dim >= 0
        ) or "non-tensor inputs changed"
    else:
        dims = "not a shape change (see torch._dynamo recompile reasons: TORCH_LOGS=recompiles)"
    warnings.warn(
        f"torch_neuronx: {function} recompiled {recompiles} times; varying: {dims}. Every new shape is a "
        "new Neuron graph: pad inputs to a few fixed sizes with torch_neuronx.compile.bucketing "
        "(pad_batch(..., pad_to_multiple_of=128) or propose_buckets(lengths, max_graphs=N)).",
        stacklevel=3,
    )


def _graph_breaks() -> Counter[str]:
    import sys

    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return Counter()
    return Counter({reason: n for reason, n in utils.counters["graph_break"].items() if n})


def _dynamo_recompile_reasons() -> dict[str, str]:
    import sys

    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return {}
    return {m.compile_id: m.recompile_reason for m in utils.get_compilation_metrics()
            if m.compile_id and m.recompile_reason}


def snapshot() -> dict[str, Any]:
    """Compilation metrics since the last :func:`reset` (plain data, safe to log as JSON)."""
    dynamo_reasons = _dynamo_recompile_reasons()
    breaks = _graph_breaks() - _graph_break_baseline
    with _lock:
        graphs = [g for stats in _functions.values() for g in stats.graphs]
        recompiles = []
        functions = {}
        for name, stats in _functions.items():
            shapes = []
            for g in stats.graphs:
                shape = {d.name: list(d.shape) if d.shape is not None else d.value
                         for d in g.inputs if not d.parameter}
                if shape not in shapes:
                    shapes.append(shape)
            functions[name] = {
                "graphs": len(stats.graphs),
                "recompilations": len(stats.graphs) - 1,
                "distinct_input_shapes": shapes,
                "compile_seconds": round(sum(g.seconds for g in stats.graphs), 4),
            }
            for g in stats.graphs[1:]:
                recompiles.append({
                    "function": name,
                    "compile_id": g.compile_id,
                    "changed": [{"input": n, "dim": d, "before": a, "after": b} for n, d, a, b in g.changed],
                    "reason": "; ".join(_describe_change(*c) for c in g.changed) or
                    dynamo_reasons.get(g.compile_id or "", "guard failure (not a shape change)"),
                    "dynamo_reason": dynamo_reasons.get(g.compile_id or ""),
                })
        cache = {k: _cache.get(k, 0) for k in ("memory_hits", "memory_misses", "disk_hits", "disk_misses")}
        cache["corrupt_entries_removed"] = list(_corrupt_removed)
        return {
            "graphs_compiled": len(graphs),
            "recompilations": len(recompiles),
            "recompile_reasons": recompiles,
            "functions": functions,
            "cache": cache,
            "compile_seconds": round(sum(g.seconds for g in graphs), 4),
            "graph_breaks": {"count": sum(breaks.values()), "reasons": dict(breaks)},
        }


def reset() -> None:
    """Start counting afresh (Dynamo's own counters are left alone)."""
    global _graph_break_baseline
    with _lock:
        _functions.clear()
        _cache.clear()
        _corrupt_removed.clear()
        _graph_break_baseline = _graph_breaks()
