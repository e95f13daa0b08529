"""``torch_neuronx.metrics``: TorchNeuron's counters and timing metrics, in torch_xla's report format.

Scripts written for TorchNeuron do ``import torch_neuronx.metrics as met`` and
print ``met.report()`` after a run to see how often graphs compiled and how
the compile cache served them. Collection is off unless
``TORCH_NEURONX_METRICS_ENABLED=1`` (or :func:`set_enabled`), as on
TorchNeuron: :func:`counter` and :func:`sample` cost one flag test when off.

Recorded here (docs/torchneuron.md lists each with its source):

* counters ``CompilationCache.InMemoryHits``, ``InMemoryMisses``,
  ``PersistentHits``, ``PersistentMisses``, ``TotalCompilations``,
  ``Evictions`` (TorchNeuron's names), ``Compilation.Recompilations`` and
  ``Compilation.FallbackToEager``;
* metrics ``CompilationTime`` (seconds per compiled graph) and
  ``GraphNodeCount``.

Eager op counts are the op tracker's (:func:`torch_neuronx.get_executed_ops`).
"""

from __future__ import annotations

import math
import threading
from collections import Counter

from torch_neuronx.runtime import env

_lock = threading.Lock()
_enabled: bool = bool(env.get("TORCH_NEURONX_METRICS_ENABLED"))
_counters: Counter[str] = Counter()
_samples: dict[str, list[float]] = {}


def is_enabled() -> bool:
    """Whether counters and metrics are being collected."""
    return _enabled


def set_enabled(enabled: bool) -> None:
    """Start or stop collecting (what was collected stays until cleared)."""
    global _enabled
    _enabled = bool(enabled)


def counter(name: str, n: int = 1) -> None:
    """Add `n` to counter `name` (nothing when collection is off)."""
    if _enabled:
        with _lock:
            _counters[name] += n


def sample(name: str, value: float) -> None:
    """Record one sample of metric `name` (nothing when collection is off)."""
    if _enabled:
        with _lock:
            _samples.setdefault(name, []).append(float(value))


def get_counter_names() -> list[str]:
    with _lock:
        return sorted(name for name, value in _counters.items() if value)


def get_counter_value(name: str) -> int | None:
    """The counter's value; None if it was never incremented."""
    with _lock:
        return _counters[name] if _counters.get(name) else None


def get_metric_names() -> list[str]:
    with _lock:
        return sorted(_samples)


def get_metric_data(name: str) -> dict[str, object] | None:
    """``{"total_samples", "accumulator", "mean", "min", "max", "repr"}`` of metric `name`; None if unrecorded."""
    with _lock:
        values = list(_samples.get(name, ()))
    if not values:
        return None
    total = math.fsum(values)
    return {"total_samples": len(values), "accumulator": total, "mean": total / len(values),
            "min": min(values), "max": max(values), "repr": _format(name, total)}


def get_compilation_metrics() -> dict[str, object]:
    """Every counter and metric whose name contains "Compilation"."""
    out: dict[str, object] = {n: get_counter_value(n) for n in get_counter_names() if "Compilation" in n}
    out.update({n: get_metric_data(n) for n in get_metric_names() if "Compilation" in n})
    return out


def _format(name: str, value: float) -> str:
    return f"{value:.6f}s" if name.endswith("Time") else f"{value:g}"


def report_filtered(counter_names: list[str] | None = None, metric_names: list[str] | None = None) -> str:
    """The report restricted to the named counters and metrics (None: all of that kind)."""
    lines: list[str] = []
    for name in get_metric_names():
        if metric_names is not None and name not in metric_names:
            continue
        data = get_metric_data(name)
        assert data is not None
        lines += [f"Metric: {name}", f"  TotalSamples: {data['total_samples']}", f"  Accumulator: {data['repr']}",
                  f"  Mean: {_format(name, data['mean'])}", f"  Min: {_format(name, data['min'])}",
                  f"  Max: {_format(name, data['max'])}"]
    for name in get_counter_names():
        if counter_names is not None and name not in counter_names:
            continue
        lines += [f"Counter: {name}", f"  Value: {get_counter_value(name)}"]
    return "\n".join(lines) + ("\n" if lines else "")


def report() -> str:
    """Every metric, then every counter, one block each (torch_xla's layout)."""
    return report_filtered()


def clear_counters() -> None:
    with _lock:
        _counters.clear()


def clear_metrics() -> None:
    with _lock:
        _samples.clear()


def clear_all() -> None:
    clear_counters()
    clear_metrics()
