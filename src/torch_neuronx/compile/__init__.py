"""torch.compile for the neuron device.

``torch.compile(model, backend="neuron")`` (or :func:`compile`) lowers the
graphs Dynamo captures, forward and backward, to fused host code with
Inductor's C++ code generator, with TorchNeuron's semantics: static shapes
(one graph per input shape; ``dynamic=True`` is an error), mode "default"
only, a compile cache in memory and on disk (:mod:`.cache`), metrics of
compilations and recompilations (:mod:`.metrics`, also
``torch.neuron.get_dynamo_metrics()``), and shape bucketing helpers to keep
the number of graphs small (:mod:`.bucketing`). Plain ``torch.compile(model)``
(the inductor backend) also works on neuron tensors. See docs/compile.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

BACKEND_NAME = "neuron"


def _register() -> None:
    """Called by ``import torch_neuronx``: arranges lazy registration (costs microseconds)."""
    from torch_neuronx.compile import registration

    registration.register()


def compile(model: Callable[..., Any] | None = None, *, mode: str | None = "default", fullgraph: bool = False,
            dynamic: bool | None = False, options: dict[str, Any] | None = None,
            **kwargs: Any) -> Any:
    """``torch.compile`` with backend "neuron" and TorchNeuron's checks made up front.

    Unlike ``torch.compile(..., dynamic=True)``, whose error surfaces at the
    first call, ``dynamic=True`` raises here. ``mode`` other than "default"
    warns once and compiles as default. Usable as a decorator.
    """
    from torch_neuronx.compile.backend import DYNAMIC_SHAPES_MESSAGE, NeuronDynamicShapesError, check_mode

    if dynamic:
        raise NeuronDynamicShapesError(DYNAMIC_SHAPES_MESSAGE)
    check_mode(mode)
    import torch

    return torch.compile(model, backend=BACKEND_NAME, fullgraph=fullgraph, dynamic=False,
                         options=options, **kwargs)


def __getattr__(name: str) -> Any:
    # Heavier pieces load on first use, keeping ``import torch_neuronx`` fast.
    if name in ("backend", "bucketing", "cache", "inductor", "metrics"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    if name == "NeuronDynamicShapesError":
        from torch_neuronx.compile.backend import NeuronDynamicShapesError

        return NeuronDynamicShapesError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["BACKEND_NAME", "compile", "metrics"]

_register()
