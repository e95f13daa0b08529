"""TorchNeuron's ``torch_neuronx.neuron_dynamo_backend``: the torch.compile helper API under its published names.

TorchNeuron's torch.compile reference documents this import path
(``from torch_neuronx.neuron_dynamo_backend import set_model_name``, its
``.metrics`` submodule, ``create_neuron_backend``), and third-party code
imports it. Here each name is a thin alias of what :mod:`torch_neuronx.compile`
already does; ``import torch_neuronx`` registers this package under
TorchNeuron's path as well. TorchNeuron's StableHLO/MLIR file helpers
(``save_mlir``, ``fx_to_mlir_string``, ...) have no counterpart: the emulator
compiles with Inductor, not through StableHLO (docs/compile.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch_neuronx.compile.neuron_dynamo_backend import config, metrics
from torch_neuronx.compile.neuron_dynamo_backend.config import get_model_name, get_rank, set_model_name
from torch_neuronx.compile.neuron_dynamo_backend.metrics import get_dynamo_metrics, reset_dynamo_metrics

__all__ = [
    "NEFFCompilationError",
    "NEFFExecutionError",
    "config",
    "create_neuron_backend",
    "get_dynamo_metrics",
    "get_model_name",
    "get_rank",
    "metrics",
    "neuron_backend",
    "reset_dynamo_metrics",
    "set_model_name",
]


class NEFFCompilationError(RuntimeError):
    """TorchNeuron's error for a graph that fails to compile (here: Inductor's failure, with fallback off)."""


class NEFFExecutionError(RuntimeError):
    """TorchNeuron's error for a compiled graph that fails to run."""


def create_neuron_backend() -> Callable[..., Any]:
    """A Dynamo backend callable, as TorchNeuron's: ``torch.compile(model, backend=create_neuron_backend())``.

    It is the registered ``"neuron"`` backend; ``options`` and ``mode`` are
    passed through (a mode other than "default" warns and compiles as default).
    """

    def neuron_backend_wrapper(gm: Any, example_inputs: list[Any], *, options: dict[str, Any] | None = None,
                               mode: str | None = "default") -> Callable[..., Any]:
        from torch_neuronx.compile.backend import neuron_backend as backend

        return backend(gm, example_inputs, mode=mode, options=options)

    return neuron_backend_wrapper


neuron_backend = create_neuron_backend()
