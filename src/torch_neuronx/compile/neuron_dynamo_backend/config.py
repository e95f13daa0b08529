"""TorchNeuron's ``neuron_dynamo_backend.config`` names: the model name of the graphs compiled next, and the rank
their artifacts and metric tables are filed under. Aliases of :mod:`torch_neuronx.compile.metrics`."""

from __future__ import annotations

from torch_neuronx.compile import metrics as _metrics

__all__ = ["get_model_name", "get_rank", "set_model_name"]


def set_model_name(name: str) -> None:
    """Name the model whose graphs compile next (graph names, artifact and CSV rows), as TorchNeuron's."""
    _metrics.set_model_name(name)


def get_model_name() -> str:
    """The current model name ("model_default" until set)."""
    return _metrics.get_model_name()


def get_rank() -> int:
    """The process-group rank, else the current device index (TorchNeuron's rule)."""
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return torch.neuron.current_device()  # type: ignore[attr-defined]
