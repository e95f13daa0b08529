"""Device arguments as torch.cuda takes them: a torch.device, "neuron:1", 1, or None (current)."""

from __future__ import annotations

import torch

from torch_neuronx import _C

_device_t = torch.device | str | int | None


def current_device() -> int:
    """The index of the calling thread's current NeuronCore."""
    _C._lazy_init()
    return _C._current_device()


def device_index(device: _device_t) -> int:
    """Normalise a device argument to an index; None and "neuron" mean the current device."""
    if device is None:
        return current_device()
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "neuron":
            raise ValueError(f"expected a neuron device, got '{device}'")
        return current_device() if device.index is None else device.index
    if isinstance(device, int):
        return device
    raise TypeError(f"expected a neuron device, a device index or None, got {type(device).__name__}")
