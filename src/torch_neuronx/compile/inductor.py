"""Teach Inductor and Dynamo the ``neuron`` device.

Neuron memory is host memory (``data_ptr()`` is a plain host pointer), so
Inductor's C++ CPU code generator produces correct kernels for it unchanged:
we register that generator for the device, a Python wrapper that calls the
kernels the way it does on CPU, the device's op overrides, and the Dynamo
device interface. Importing this module imports Inductor (about a second),
which is why the package registers it lazily, at the start of the first
compilation (see :mod:`torch_neuronx.compile`).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

import torch
import torch._inductor.config as inductor_config
from torch._dynamo.device_interface import DeviceInterface, register_interface_for_device
from torch._inductor.codegen.common import (
    DeviceOpOverrides,
    register_backend_for_device,
    register_device_op_overrides,
)
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
from torch._inductor.virtualized import V

DEVICE = "neuron"
_HOST = torch.device("cpu")


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


@dataclass(frozen=True)
class NeuronWorkerProperties:
    """What Inductor's heuristics read about a core, plus the core's own properties."""

    name: str
    total_memory: int
    multi_processor_count: int  # host threads that run the kernels


class NeuronInterface(DeviceInterface):
    """Dynamo/Inductor's runtime view of the device, backed by ``torch.neuron``."""

    class Worker:
        @staticmethod
        def set_device(device: int) -> None:
            torch.neuron.set_device(device)

        @staticmethod
        def current_device() -> int:
            return torch.neuron.current_device()

        @staticmethod
        def get_device_properties(device: torch.types.Device = None) -> NeuronWorkerProperties:
            props = torch.neuron.get_device_properties(device)
            return NeuronWorkerProperties(props.name, props.total_memory, os.cpu_count() or 1)

    @staticmethod
    def current_device() -> int:
        return torch.neuron.current_device()

    @staticmethod
    def set_device(device: torch.types.Device) -> None:
        torch.neuron.set_device(device)

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        return NeuronInterface.exchange_device(device)

    @staticmethod
    def exchange_device(device: int) -> int:
        previous = torch.neuron.current_device()
        if device >= 0 and device != previous:
            torch.neuron.set_device(device)
        return previous

    @staticmethod
    def device_count() -> int:
        return torch.neuron.device_count()

    @staticmethod
    def is_available() -> bool:
        return torch.neuron.is_available()

    @staticmethod
    def stream(stream: torch.Stream) -> Any:
        return torch.neuron.stream(stream)

    @staticmethod
    def current_stream() -> torch.Stream:
        return torch.neuron.current_stream()

    @staticmethod
    def set_stream(stream: torch.Stream) -> None:
        torch.neuron.set_stream(stream)

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        torch.neuron.set_stream(
            torch.neuron.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type)
        )

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        return 0

    @staticmethod
    def synchronize(device: torch.types.Device = None) -> None:
        torch.neuron.synchronize(device)

    @staticmethod
    def get_compute_capability(device: torch.types.Device = None) -> str:
        return ""  # the kernels are host code: nothing device-generation specific

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return True

    @classmethod
    def is_dtype_supported(cls, dtype: torch.dtype, including_emulation: bool = False) -> bool:
        return True  # the emulator computes every dtype its CPU kernels compute

    @staticmethod
    def memory_allocated(device: torch.types.Device = None) -> int:
        return torch.neuron.memory_allocated(device)


# Dynamo's DeviceInterface declares these as classes to subclass; torch.neuron has them.
NeuronInterface.device = torch.neuron.device  # type: ignore[assignment,misc]
NeuronInterface.Stream = torch.neuron.Stream  # type: ignore[assignment,misc]
NeuronInterface.Event = torch.neuron.Event  # type: ignore[assignment,misc]

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
        register_interface_for_device(DEVICE, NeuronInterface)
        for index in range(torch.neuron.device_count()):
            register_interface_for_device(f"{DEVICE}:{index}", NeuronInterface)
        register_device_op_overrides(DEVICE, NeuronDeviceOpOverrides())
        register_backend_for_device(DEVICE, CppScheduling, NeuronWrapperCodegen)
        # Inductor's loop re-indexing pass assumes every non-"cpu" device is a GPU
        # (it calls GPU-only helpers); it has no per-device switch.
        inductor_config.loop_reindexing_after_fusion = False
        _registered = True
