"""Register the ``neuron`` backend and device with Dynamo and Inductor, lazily.

``import torch_neuronx`` must stay fast, and importing Dynamo costs ~1.4 s, so
nothing here imports it. Instead:

* when Dynamo is first imported (by anyone), the ``"neuron"`` backend and the
  device interface are registered (both cheap once Dynamo is loaded);
* Inductor finds the code generator of a PrivateUse1 device through
  attributes of its device module (``torch.neuron.Scheduling``,
  ``PythonWrapperCodegen``, ``CppWrapperCodegen``,
  ``WrapperFxCodegen``); ours are thin shims that
  import :mod:`torch_neuronx.compile.inductor` on first use, so plain
  ``torch.compile(model)`` (the inductor backend) works on neuron tensors
  without paying for Inductor at import.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from torch_neuronx.compile import import_hook

BACKEND_NAME = "neuron"


def _inductor_ready() -> Any:
    from torch_neuronx.compile import inductor

    inductor.register()
    return inductor


def _scheduling(scheduler: Any) -> Any:
    return _inductor_ready().NeuronCppScheduling(scheduler)


class _Deferred(type):
    """Forwards reads of class attributes to the real wrapper class, registering it first."""

    def __getattr__(cls, name: str) -> Any:
        return getattr(_inductor_ready().NeuronWrapperCodegen, name)


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


def _on_dynamo_import(_dynamo: ModuleType) -> None:
    from torch._dynamo.backends import registry

    from torch_neuronx.compile import device_interface

    device_interface.register()
    # `_BACKENDS` holds the names Dynamo knows, entry points included. If the
    # torch_dynamo_backends entry point was already discovered, Dynamo loads our
    # backend from it; registering here too would make that load fail as a duplicate.
    if BACKEND_NAME not in registry._BACKENDS:
        from torch_neuronx.compile.backend import neuron_backend

        registry.register_backend(compiler_fn=neuron_backend, name=BACKEND_NAME)


_hooked = False


def register() -> None:
    """Arrange registration (cheap: imports neither Dynamo nor Inductor; idempotent)."""
    global _hooked
    device_module = getattr(torch, "neuron", None)
    if device_module is not None:
        # The names torch.utils.backend_registration._get_custom_mod_func looks up.
        device_module.Scheduling = _scheduling
        device_module.PythonWrapperCodegen = _WrapperCodegen
        device_module.CppWrapperCodegen = _UnsupportedWrapperCodegen
        device_module.WrapperFxCodegen = _UnsupportedWrapperCodegen
    if not _hooked:
        _hooked = True
        import_hook.when_imported("torch._dynamo", _on_dynamo_import)
