"""TorchNeuron's ``neuron_dynamo_backend.metrics``: per-graph compile metrics and the CSV tables written at exit.

Aliases of :mod:`torch_neuronx.compile.metrics` under TorchNeuron's names.
"""

from __future__ import annotations

from torch_neuronx.compile import metrics as _metrics
from torch_neuronx.compile.metrics import NeuronCompilationMetrics

__all__ = [
    "DEFAULT_METRICS_DIR",
    "ENABLED_TABLES_ENV",
    "METRICS_DIR_ENV",
    "REGISTERED_METRIC_TABLES",
    "NeuronCompilationMetrics",
    "get_dynamo_metrics",
    "reset_dynamo_metrics",
]

ENABLED_TABLES_ENV = "TORCH_NEURONX_ENABLED_METRIC_TABLES"
METRICS_DIR_ENV = "TORCH_NEURONX_METRICS_DIR"
DEFAULT_METRICS_DIR = "/tmp"
# table name -> its CSV columns
REGISTERED_METRIC_TABLES: dict[str, list[str]] = {
    _metrics.GRAPH_STATS: list(NeuronCompilationMetrics.__dataclass_fields__)}


def get_dynamo_metrics() -> list[NeuronCompilationMetrics]:
    """One record per graph compiled since the last reset, oldest first (synchronises first, as TorchNeuron)."""
    from torch_neuronx import compile as _compile

    return _compile.get_dynamo_metrics()


def reset_dynamo_metrics() -> None:
    """Forget the recorded compilations."""
    _metrics.reset()
