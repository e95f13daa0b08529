"""Streams and events of the emulated device.

Work on the emulated device has finished when the call returns, so streams
order nothing that is not already ordered; they exist so that code written
for CUDA and Trainium (FSDP2, prefetching, timing with events) runs as is.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_neuronx.device._index import _device_t, device_index
from torch_neuronx.device._lazy import _lazy_init

_PRIVATEUSE1 = 20  # c10::DeviceType::PrivateUse1, the device type torch.Stream stores


class Stream(torch.Stream):
    """A neuron stream (``torch.Stream`` on the neuron device)."""

    def __new__(cls, device: _device_t = None, priority: int = 0, **kwargs: Any) -> Stream:
        if "stream_id" in kwargs:  # rebuilding a stream from its parts
            return super().__new__(cls, **kwargs)
        index = device_index(device)
        _lazy_init()
        return super().__new__(cls, device=torch.device("neuron", index), priority=priority)

    def wait_event(self, event: torch.Event) -> None:
        event.wait(self)

    def wait_stream(self, stream: torch.Stream) -> None:
        self.wait_event(stream.record_event())

    def record_event(self, event: torch.Event | None = None) -> torch.Event:
        event = torch.Event(device="neuron") if event is None else event
        event.record(self)
        return event


class Event:
    """A neuron event: ``record`` marks a point, ``elapsed_time`` measures between two (ms).

    Creating one returns a ``torch.Event`` on the neuron device (PyTorch's
    event methods accept only that exact type).
    """

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> torch.Event:
        _lazy_init()
        return torch.Event(device="neuron", enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)


def _wrap(s: torch.Stream) -> Stream:
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


def current_stream(device: _device_t = None) -> Stream:
    """The calling thread's current stream on a core."""
    index = device_index(device)
    _lazy_init()
    return _wrap(torch._C._accelerator_getStream(index))


def default_stream(device: _device_t = None) -> Stream:
    """A core's default stream."""
    index = device_index(device)
    _lazy_init()
    return Stream(stream_id=0, device_index=index, device_type=_PRIVATEUSE1)


def set_stream(stream: torch.Stream) -> None:
    """Make `stream` the current stream of its core."""
    if stream is not None:
        torch._C._accelerator_setStream(stream)


class StreamContext:
    """Context manager that makes a stream current, like ``torch.cuda.StreamContext``."""

    def __init__(self, stream: torch.Stream | None) -> None:
        self.stream = stream
        self.prev: torch.Stream | None = None

    def __enter__(self) -> None:
        if self.stream is not None:
            self.prev = current_stream(self.stream.device_index)
            set_stream(self.stream)

    def __exit__(self, *exc: object) -> None:
        if self.stream is not None and self.prev is not None:
            set_stream(self.prev)


def stream(stream: torch.Stream | None) -> StreamContext:
    """Run a block with `stream` as the current stream."""
    return StreamContext(stream)


def wait_stream(stream: torch.Stream) -> None:
    """Make the current stream wait for all work queued on `stream`."""
    current_stream(stream.device_index).wait_stream(stream)


def synchronize(device: _device_t = None) -> None:
    """Wait for all work on a core (the emulated device finishes each call before returning)."""
    index = device_index(device)
    _lazy_init()
    torch._C._accelerator_synchronizeDevice(index)
