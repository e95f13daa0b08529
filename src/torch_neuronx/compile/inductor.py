"""Teach Inductor the ``neuron`` device.

Neuron memory is host memory (``data_ptr()`` is a plain host pointer), so
Inductor's C++ CPU code generator produces correct kernels for it unchanged:
we register that generator for the device, a Python wrapper that calls the
kernels the way it does on CPU, and the device's op overrides, and work
around the places where Inductor takes "not cpu" to mean "a GPU". Importing
this module imports Inductor, which is why it is loaded only when Inductor
first asks for the device's code generator (the shims in
:mod:`torch_neuronx.compile`), or when the ``neuron`` backend first compiles.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch._inductor.config as inductor_config
from torch._inductor.codegen.common import (
    DeviceOpOverrides,
    register_backend_for_device,
    register_device_op_overrides,
)
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
from torch._inductor.virtualized import V

from torch_neuronx import patches
from torch_neuronx.compile import device_interface

DEVICE = "neuron"
_HOST = torch.device("cpu")

# Inductor settings the "neuron" backend compiles with. Inductor lowers
# torch.cat into one copy kernel on "cpu" but into a fused pointwise
# kernel on every other device, a choice it made for GPUs: its C++ code
# generator is slower that way, and on some graphs fails to index it
# (`Identity(...)` offsets; seen on inkling2_text's static-cache decode).
# Neuron runs the C++ generator, so it takes CPU's choice.
BACKEND_CONFIG: dict[str, Any] = {"max_pointwise_cat_inputs": 0, "max_complex_pointwise_cat_inputs": 0}


class NeuronDeviceOpOverrides(DeviceOpOverrides):
    """Snippets the wrapper emits around kernels: the emulated device has no streams to wait on."""

    def import_get_raw_stream_as(self, name: str) -> str:
        return f"def {name}(_): return 0"

    def set_device(self, device_idx: int) -> str:
        return f"torch.neuron.set_device({device_idx})"

    def synchronize(self) -> str:
        return "pass"  # every kernel has finished when its call returns

    def device_guard(self, device_idx: int) -> str:
        return f"torch.neuron.device({device_idx})"

    def cpp_kernel_type(self) -> str:
        return "void*"


def _cpp_kernel_language(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        # Inductor picks the kernel language from the device type ("cpu" -> C++,
        # any unknown type -> config.cuda_backend, i.e. Triton) with no per-device
        # registration; dtype propagation and masked loads go wrong unless it says C++.
        with inductor_config.patch(cuda_backend="cpp"):
            return method(self, *args, **kwargs)

    return wrapper


class NeuronCppScheduling(CppScheduling):
    """Inductor's C++ scheduling, told that neuron kernels are C++ kernels."""

    codegen_node = _cpp_kernel_language(CppScheduling.codegen_node)
    codegen_template = _cpp_kernel_language(CppScheduling.codegen_template)
    flush = _cpp_kernel_language(CppScheduling.flush)


class _HostKernelCalls:
    """Emit calls of the generated C++ kernels exactly as for CPU tensors.

    The stock wrapper knows how to call C++ kernels only on ``cpu`` (and mps);
    on any other device it assumes a launcher with a stream argument.
    """

    def _generate_kernel_call_helper(self, kernel_name: str, call_args: Any, *, device: Any = None,
                                     **kwargs: Any) -> None:
        device = device or V.graph.get_current_device_or_throw()
        if device.type == DEVICE:
            device = _HOST
        super()._generate_kernel_call_helper(kernel_name, call_args, device=device, **kwargs)  # type: ignore[misc]

    def make_allocation(self, name: str, device: torch.device, dtype: torch.dtype, shape: Any, stride: Any,
                        allocation_shape: Any = None, is_pinned: bool = False) -> str:
        line = super().make_allocation(  # type: ignore[misc]
            name, device, dtype, shape, stride, allocation_shape, is_pinned
        )
        # The generic line says device='neuron', i.e. the *current* core; Inductor
        # emits no device guard for non-GPU devices, so name the core explicitly.
        if device.type == DEVICE and device.index is not None:
            line = line.replace(f"device='{DEVICE}'", f"device='{DEVICE}:{device.index}'")
        return line


class NeuronSubgraphWrapperCodegen(_HostKernelCalls, SubgraphPythonWrapperCodegen):
    pass


class NeuronWrapperCodegen(_HostKernelCalls, PythonWrapperCodegen):
    @staticmethod
    def create(is_subgraph: bool, subgraph_name: str | None, parent_wrapper: PythonWrapperCodegen | None,
               partition_signatures: Any = None) -> PythonWrapperCodegen:
        if is_subgraph:
            assert subgraph_name is not None and parent_wrapper is not None
            return NeuronSubgraphWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return NeuronWrapperCodegen()


_lock = threading.Lock()
_registered = False


def register() -> None:
    """Register the device with Dynamo and Inductor (idempotent, thread-safe)."""
    global _registered
    if _registered:
        return
    with _lock:
        if _registered:
            return
        device_interface.register(per_core=True)
        register_device_op_overrides(DEVICE, NeuronDeviceOpOverrides())
        register_backend_for_device(DEVICE, NeuronCppScheduling, NeuronWrapperCodegen)
        patches.patch_inductor_reindexing()
        _registered = True
