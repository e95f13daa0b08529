"""What the ``neuron`` backend compiled, why it recompiled, and what the cache saved.

Two views of the same records:

* TorchNeuron's: ``torch_neuronx.get_dynamo_metrics()`` (also
  ``torch.neuron.get_dynamo_metrics()``) returns one
  :class:`NeuronCompilationMetrics` per compiled graph, and
  ``TORCH_NEURONX_ENABLED_METRIC_TABLES=graph_stats`` writes them as CSV at
  exit (``{TORCH_NEURONX_METRICS_DIR}/metric_table_graph_stats_rank{rank}.csv``).
* The emulator's analysis: :func:`snapshot` says which functions recompiled,
  which input dimension changed, and what the caches served. On Trainium every
  new input shape is a new compilation (minutes on real hardware), so when one
  function recompiles more than ``recompile_warning_threshold`` times
  (TORCH_NEURONX_RECOMPILE_WARN_THRESHOLD, default 4; Dynamo's own
  recompile_limit, 8, then runs it eagerly), a warning names the dimension
  that keeps changing and points to bucketing.
"""

from __future__ import annotations

import atexit
import csv
import dataclasses
import os
import threading
import warnings
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from torch_neuronx import metrics as counters
from torch_neuronx.runtime import env

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


@dataclass
class NeuronCompilationMetrics:
    """One compiled graph, as TorchNeuron's ``get_dynamo_metrics()`` reports it (same fields, same order)."""

    graph_id: str  # the compile cache key of the graph
    graph_name: str = ""  # "{model_name}_{frame}_{graph_type}_{nth}", e.g. "model_default_0_inference_0"
    model_name: str = ""  # set_model_name(...), or "model_default"
    has_collectives: bool = False
    graph_node_count: int = 0  # nodes of the graph Dynamo captured
    timestamp: str = ""  # "%Y%m%d_%H%M%S_%f", shared with the graph's preserved artifacts
    torch_neuronx_fx_passes_us: int = 0  # the backend's own graph passes (cache key, device placement)
    torch_neuronx_lower_us: int = 0  # AOTAutograd and Inductor lowering to generated code
    torch_neuronx_compile_us: int = 0  # compiling the generated kernels (0 when the cache served them)


GRAPH_STATS = "graph_stats"
METRIC_TABLES = (GRAPH_STATS,)
DEFAULT_MODEL_NAME = "model_default"

recompile_warning_threshold: int = env.get("TORCH_NEURONX_RECOMPILE_WARN_THRESHOLD")
_model_name = DEFAULT_MODEL_NAME
_compiled: list[NeuronCompilationMetrics] = []
_nth: Counter[tuple[str, str, str]] = Counter()
_tables_checked = False


def set_model_name(name: str) -> None:
    """Name the model whose graphs compile next (graph names, artifact file names), as on TorchNeuron."""
    global _model_name
    if not isinstance(name, str) or not name:
        raise ValueError(f"set_model_name takes a non-empty string, got {name!r}")
    _model_name = name


def get_model_name() -> str:
    return _model_name


def new_timestamp() -> str:
    """A compiled graph's id in time, shared by its metrics record and its artifacts."""
    return datetime.now().strftime("%Y%m%d_%H%M%S_%f")


def record_compiled(graph_id: str, frame: str, graph_type: str, node_count: int, has_collectives: bool,
                    timestamp: str, fx_passes_s: float, lower_s: float, compile_s: float) -> NeuronCompilationMetrics:
    """Note one compiled graph in TorchNeuron's form (and Dynamo's ``counters["neuron"]``)."""
    _check_tables()
    with _lock:
        nth_key = (_model_name, frame, graph_type)
        record = NeuronCompilationMetrics(
            graph_id=graph_id, graph_name=f"{_model_name}_{frame}_{graph_type}_{_nth[nth_key]}",
            model_name=_model_name, has_collectives=has_collectives, graph_node_count=node_count,
            timestamp=timestamp, torch_neuronx_fx_passes_us=round(fx_passes_s * 1e6),
            torch_neuronx_lower_us=round(lower_s * 1e6), torch_neuronx_compile_us=round(compile_s * 1e6))
        _nth[nth_key] += 1
        _compiled.append(record)
    from torch._dynamo.utils import counters as dynamo_counters

    dynamo_counters["neuron"]["compiled_graphs"] += 1
    if has_collectives:
        dynamo_counters["neuron"]["graphs_with_collectives"] += 1
    counters.sample("CompilationTime", fx_passes_s + lower_s + compile_s)
    counters.sample("GraphNodeCount", node_count)
    return record


def compiled_graphs() -> list[NeuronCompilationMetrics]:
    """A copy of the records since the last reset (what ``get_dynamo_metrics()`` returns)."""
    with _lock:
        return [dataclasses.replace(r) for r in _compiled]


def _check_tables() -> None:
    """Read TORCH_NEURONX_ENABLED_METRIC_TABLES at the first compile and, if it names any table, write the tables
    at exit. As on TorchNeuron, an unknown name raises only there, in the CSV writer; here a warning at the
    first compile says so early."""
    global _tables_checked
    if _tables_checked:
        return
    _tables_checked = True
    tables = env.get("TORCH_NEURONX_ENABLED_METRIC_TABLES")
    unknown = [t for t in tables if t not in METRIC_TABLES]
    if unknown:
        warnings.warn(f"TORCH_NEURONX_ENABLED_METRIC_TABLES names {unknown[0]!r}, which is not a metric table "
                      f"(available: {', '.join(METRIC_TABLES)}); writing the tables at exit will fail",
                      stacklevel=3)
    if tables:
        atexit.register(_write_tables_at_exit)


def _write_tables_at_exit() -> None:
    """The exit-time writer: raises for an unknown table name, as TorchNeuron's CSV writer does."""
    tables = env.get("TORCH_NEURONX_ENABLED_METRIC_TABLES")
    unknown = [t for t in tables if t not in METRIC_TABLES]
    if unknown:
        raise ValueError(f"Metric table '{unknown[0]}' is not registered. Available tables: {list(METRIC_TABLES)} "
                         "(fix TORCH_NEURONX_ENABLED_METRIC_TABLES)")
    if GRAPH_STATS in tables:
        write_graph_stats()


def _rank() -> int:
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0") or 0)


def write_graph_stats(directory: str | None = None) -> str | None:
    """Write the graph_stats table as CSV; returns its path (None when nothing compiled).

    A failure to write warns and never raises: it runs at interpreter exit."""
    records = compiled_graphs()
    if not records:
        return None
    directory = directory or env.get("TORCH_NEURONX_METRICS_DIR")
    path = os.path.join(directory, f"metric_table_{GRAPH_STATS}_rank{_rank()}.csv")
    try:
        os.makedirs(directory, exist_ok=True)
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            names = [fld.name for fld in dataclasses.fields(NeuronCompilationMetrics)]
            writer.writerow(names)
            writer.writerows([getattr(r, n) for n in names] for r in records)
    except OSError as exc:
        warnings.warn(f"torch_neuronx: failed to write metrics CSV to {path}: {exc}", stacklevel=2)
        return None
    return path

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
        if recompiles:
            counters.counter("Compilation.Recompilations")
        warn = recompiles > recompile_warning_threshold and not stats.warned
        if warn:
            stats.warned = True
            varying = _varying_dims(stats.graphs)
    if warn:
        _warn_recompiles(function, recompiles, varying)
    return record


_COUNTER_NAMES = {
    ("memory", True): "CompilationCache.InMemoryHits", ("memory", False): "CompilationCache.InMemoryMisses",
    ("disk", True): "CompilationCache.PersistentHits", ("disk", False): "CompilationCache.PersistentMisses",
}


def record_cache(kind: str, hit: bool) -> None:
    with _lock:
        _cache[f"{kind}_{'hits' if hit else 'misses'}"] += 1
    counters.counter(_COUNTER_NAMES[kind, hit])


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
                elif desc.name == name and desc.shape is None and dim < 0 and isinstance(desc.value, int | float):
                    seen.add(desc.value)  # a Python number the graph is specialised on (an int argument)
    return sizes


def _describe_change(name: str, dim: int, before: Any, after: Any) -> str:
    if dim < 0:
        return f"{name}: {before} -> {after}"
    return f"{name} dim {dim}: {before} -> {after}"


def _listed(values: set[Any]) -> str:
    return f"({', '.join(map(str, sorted(values)[:8]))}{', ...' if len(values) > 8 else ''})"


BUCKETING_ADVICE = ("Every new shape is a new Neuron graph: pad inputs to a few fixed sizes with "
                    "torch_neuronx.compile.bucketing (pad_batch(..., pad_to_multiple_of=128) or "
                    "propose_buckets(lengths, max_graphs=N)).")
VALUE_ADVICE = ("Neuron graphs are specialised on each value of an int argument (one graph per value): pass a "
                "value that changes as a tensor, or keep it constant.")
FLOAT_ADVICE = ("A float that changes is compiled into each graph where Inductor cannot read it at run time (a "
                "float64 graph whose shapes or ints change too, or an op that takes it only as a number): pass it "
                "as a 0-d tensor, or keep it constant.")


def _warn_recompiles(function: str, recompiles: int, varying: dict[tuple[str, int], set[Any]]) -> None:
    shapes = [f"{name} dim {dim} took {len(sizes)} sizes {_listed(sizes)}"
              for (name, dim), sizes in varying.items() if dim >= 0]
    values = [f"{name} took {len(seen)} values {_listed(seen)}"
              for (name, dim), seen in varying.items() if dim < 0 and seen]
    floats = any(isinstance(v, float) for (_, dim), seen in varying.items() if dim < 0 for v in seen)
    ints = any(not isinstance(v, float) for (_, dim), seen in varying.items() if dim < 0 for v in seen)
    advice = [BUCKETING_ADVICE] if shapes else []
    if ints:
        advice.append(VALUE_ADVICE)
    if floats:
        advice.append(FLOAT_ADVICE)
    if not shapes and not values:
        varied = "not a shape change (see torch._dynamo recompile reasons: TORCH_LOGS=recompiles)"
        advice = ["Dynamo recompiled on a guard that failed: a Python value the code depends on changed."]
    else:
        varied = "; ".join(shapes + values)
    warnings.warn(f"torch_neuronx: {function} recompiled {recompiles} times; varying: {varied}. {' '.join(advice)}",
                  stacklevel=3)


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
    """Start counting afresh (Dynamo's ``counters["neuron"]`` too; its other counters are left alone)."""
    global _graph_break_baseline
    import sys

    utils = sys.modules.get("torch._dynamo.utils")
    if utils is not None:
        utils.counters["neuron"].clear()
    with _lock:
        _compiled.clear()
        _nth.clear()
        _functions.clear()
        _cache.clear()
        _corrupt_removed.clear()
        _graph_break_baseline = _graph_breaks()
