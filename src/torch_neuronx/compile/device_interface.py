"""Dynamo's runtime view of the neuron device (``torch._dynamo.device_interface``).

Dynamo and Inductor query devices through this interface (current device,
count, synchronize, streams, properties for heuristics); ours forwards to
``torch.neuron``. It imports only Dynamo's small device_interface module, so
it is registered as soon as Dynamo is imported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from torch._dynamo.device_interface import DeviceInterface, register_interface_for_device

DEVICE = "neuron"


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


def register(*, per_core: bool = False) -> None:
    """Register the interface for "neuron" and, with `per_core`, each "neuron:<index>" (idempotent).

    `per_core` asks the runtime for the core count, which fixes the emulated
    machine; it is left for compile time, when the device is in use anyway.
    """
    register_interface_for_device(DEVICE, NeuronInterface)
    if per_core:
        for index in range(torch.neuron.device_count()):
            register_interface_for_device(f"{DEVICE}:{index}", NeuronInterface)
