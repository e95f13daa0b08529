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


# How torch finds the pieces, none of which may import Dynamo or Inductor
# (seconds) at ``import torch_neuronx``:
# * the Dynamo backend "neuron" is the ``torch_dynamo_backends`` entry point
#   (pyproject.toml), which Dynamo loads when a compile names it;
# * Inductor finds a PrivateUse1 device's code generator through attributes of
#   its device module (torch.utils.backend_registration._get_custom_mod_func):
#   the shims below import compile.inductor, which registers the device with
#   Inductor and Dynamo, the first time Inductor asks. The neuron backend
#   calls the same registration, so both ways in meet there.


def _inductor() -> Any:
    from torch_neuronx.compile import inductor

    inductor.register()
    return inductor


def _scheduling(scheduler: Any) -> Any:
    return _inductor().NeuronCppScheduling(scheduler)


class _Deferred(type):
    """Forwards reads of class attributes to the real wrapper class, registering it first."""

    def __getattr__(cls, name: str) -> Any:
        return getattr(_inductor().NeuronWrapperCodegen, name)


class _WrapperCodegen(metaclass=_Deferred):
    """Stands in for NeuronWrapperCodegen until Inductor first reads from it."""


class _UnsupportedWrapperCodegen:
    """Inductor's cpp_wrapper and fx_wrapper modes, which the device does not support."""

    @staticmethod
    def create(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "torch_neuronx: Inductor's cpp_wrapper and fx_wrapper modes are not supported on the neuron "
            "device; leave torch._inductor.config.cpp_wrapper and fx_wrapper off"
        )


def flex_support() -> bool:
    """Add the neuron flex-attention pass to Inductor (compile/flex.py); called by Dynamo while it traces."""
    from torch_neuronx.compile import flex

    return flex.install()


# What torch._dynamo.assume_constant_result sets, without importing Dynamo (tests/test_patches.py checks it):
# Dynamo calls the function while tracing instead of tracing into it.
flex_support._dynamo_marked_constant = True  # type: ignore[attr-defined]


def get_dynamo_metrics() -> list[Any]:
    """One :class:`~torch_neuronx.compile.metrics.NeuronCompilationMetrics` per graph the ``neuron`` backend
    compiled since the last reset, oldest first (TorchNeuron's API; also ``torch.neuron.get_dynamo_metrics``).
    ``torch_neuronx.compile.metrics.snapshot()`` has the recompilation analysis."""
    import torch

    from torch_neuronx.compile import metrics

    torch.neuron.synchronize()  # type: ignore[attr-defined]
    return metrics.compiled_graphs()


def reset_dynamo_metrics() -> None:
    """Forget what :func:`get_dynamo_metrics` and ``metrics.snapshot()`` report."""
    from torch_neuronx.compile import metrics

    metrics.reset()


def set_model_name(name: str) -> None:
    """Name the model whose graphs compile next, in graph names and artifact files (TorchNeuron's API)."""
    from torch_neuronx.compile import metrics

    metrics.set_model_name(name)


def get_model_name() -> str:
    from torch_neuronx.compile import metrics

    return metrics.get_model_name()


def _register() -> None:
    """Called by ``import torch_neuronx``: point Inductor at the device's code generator, and give
    ``torch.neuron`` TorchNeuron's compile-metrics functions (costs microseconds)."""
    import torch

    device_module = torch.neuron  # type: ignore[attr-defined]
    device_module.get_dynamo_metrics = get_dynamo_metrics
    device_module.reset_dynamo_metrics = reset_dynamo_metrics
    device_module.Scheduling = _scheduling
    device_module.PythonWrapperCodegen = _WrapperCodegen
    device_module.CppWrapperCodegen = _UnsupportedWrapperCodegen
    device_module.WrapperFxCodegen = _UnsupportedWrapperCodegen
    # TorchNeuron's import path of the compile helpers (torch_neuronx.neuron_dynamo_backend and its submodules)
    import sys

    import torch_neuronx
    from torch_neuronx.compile import neuron_dynamo_backend

    torch_neuronx.neuron_dynamo_backend = neuron_dynamo_backend  # type: ignore[attr-defined]
    sys.modules["torch_neuronx.neuron_dynamo_backend"] = neuron_dynamo_backend
    for sub in ("config", "metrics"):
        sys.modules[f"torch_neuronx.neuron_dynamo_backend.{sub}"] = getattr(neuron_dynamo_backend, sub)


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
    if name in ("artifacts", "backend", "bucketing", "cache", "inductor", "metrics", "placement"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    if name == "NeuronDynamicShapesError":
        from torch_neuronx.compile.backend import NeuronDynamicShapesError

        return NeuronDynamicShapesError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["BACKEND_NAME", "compile", "get_dynamo_metrics", "get_model_name", "metrics", "reset_dynamo_metrics",
           "set_model_name"]
