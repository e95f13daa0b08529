"""Device arguments as torch.cuda takes them: a torch.device, "neuron:1", 1, or None (current)."""

from __future__ import annotations

import torch

from torch_neuronx import _C, runtime
from torch_neuronx.device._lazy import _lazy_init

_device_t = torch.device | str | int | None


class InvalidDeviceError(IndexError, ValueError):
    """A device index outside the visible cores: an IndexError as torch.cuda raises, and the ValueError
    TorchNeuron's ``set_device`` / ``get_device_properties`` raise, so code written for either catches it."""


def device_count() -> int:
    """The number of logical NeuronCores this process sees (NEURON_RT_VISIBLE_CORES, LNC applied).

    Read from the environment without initialising the device, as torch.cuda
    counts GPUs through NVML; 0 in a process forked after the device was used.
    """
    if _C._in_bad_fork():
        return 0
    return runtime.machine().device_count


def current_device() -> int:
    """The index of the calling thread's current NeuronCore (torchrun workers start on LOCAL_RANK)."""
    _lazy_init()
    return _C._current_device()


def device_index(device: _device_t, *, optional: bool = False) -> int:
    """The index of a visible core; None and "neuron" mean the current core.

    With `optional`, -1 ("no particular core") is returned as is. Anything
    else out of range raises IndexError naming the valid range: an index is
    never wrapped onto another core.
    """
    if device is None:
        return current_device()
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "neuron":
            raise ValueError(f"expected a neuron device, got '{device}'")
        if device.index is None:
            return current_device()
        index = device.index
    elif isinstance(device, int) and not isinstance(device, bool):
        index = device
    else:
        raise TypeError(f"expected a neuron device, a device index or None, got {type(device).__name__}")
    if optional and index == -1:
        return -1
    count = device_count()
    if not 0 <= index < count:
        raise InvalidDeviceError(
            f"Invalid device id neuron:{index}: this process sees {count} NeuronCore"
            f"{'' if count == 1 else 's'} (neuron:0 to neuron:{count - 1}) of the emulated instance "
            f"({runtime.machine().describe()}). Set TORCH_NEURONX_INSTANCE_TYPE or NEURON_RT_VISIBLE_CORES for more."
        )
    return index
