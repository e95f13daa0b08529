"""Device arguments as torch.cuda takes them: a torch.device, "neuron:1", 1, or None (current).

Which indices exist follows TorchNeuron. Without a process group, one index
per visible core, ``neuron:0`` to ``neuron:{device_count() - 1}``. Under a
process group (``init_process_group("neuron")``, see
:mod:`torch_neuronx.distributed`), TorchNeuron's per-rank model: the node has
``LOCAL_WORLD_SIZE`` indices, this process attaches to one of them,
``neuron:LOCAL_RANK``, and every other index raises.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from torch_neuronx import _C, runtime
from torch_neuronx.device._lazy import _lazy_init

_device_t = torch.device | str | int | None


class InvalidDeviceError(IndexError, ValueError):
    """A device index outside the visible cores: an IndexError as torch.cuda raises, and the ValueError
    TorchNeuron's ``set_device`` / ``get_device_properties`` raise, so code written for either catches it."""


class LocalDevices(NamedTuple):
    """This process's share of its node under a process group (TorchNeuron's per-rank device model)."""

    local_rank: int  # the one device index this process attaches to
    local_world_size: int  # device_count(): the node's indices, 0 .. local_world_size - 1


_local: LocalDevices | None = None


def _set_local_devices(local_rank: int, local_world_size: int) -> None:
    """Called by the neuron process group before it initialises the device (torch_neuronx.distributed)."""
    global _local
    _local = LocalDevices(local_rank, local_world_size)


def local_devices() -> LocalDevices | None:
    """This process's node share under a process group, or None when no "neuron" process group set one."""
    return _local


def attached_indices() -> range:
    """The device indices this process may use: every visible core, or under a process group neuron:LOCAL_RANK."""
    if _local is not None:
        return range(_local.local_rank, _local.local_rank + 1)
    return range(device_count())


def device_count() -> int:
    """The number of NeuronCores this process sees (NEURON_RT_VISIBLE_CORES, LNC applied); under a process group,
    the local world size (TorchNeuron's device indices are local ranks).

    Read from the environment without initialising the device, as torch.cuda
    counts GPUs through NVML; 0 in a process forked after the device was used.
    """
    if _C._in_bad_fork():
        return 0
    if _local is not None:
        return _local.local_world_size
    return runtime.machine().device_count


def current_device() -> int:
    """The index of the calling thread's current NeuronCore: 0 until set_device, neuron:LOCAL_RANK once a
    "neuron" process group exists. Does not initialise the device (as TorchNeuron's)."""
    if _C._in_bad_fork():
        _lazy_init()  # raises, telling the user to spawn
    return _C._current_device()


def _unattached(index: int) -> str:
    assert _local is not None
    r = _local.local_rank
    relation = "equal or greater than" if index < r else "at most"
    return (f"Attempted to access device that doesn't attach to this process, received {index} expected to be "
            f"{relation} {r}. Under a process group each process owns one NeuronCore, neuron:LOCAL_RANK "
            f"(neuron:{r} here, torch.neuron.current_device()); put this process's tensors there.")


def device_index(device: _device_t, *, optional: bool = False) -> int:
    """The index of a core this process may use; None and "neuron" mean the current core.

    With `optional`, -1 ("no particular core") is returned as is. Anything
    else out of range raises IndexError naming the valid range: an index is
    never wrapped onto another core. Under a process group, an index of
    another rank raises TorchNeuron's "doesn't attach to this process".
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
        if _local is not None:
            raise InvalidDeviceError(
                f"Device index {index} is out of range. Valid range is 0 to {count - 1} (under a process group a "
                "node's device indices are 0 to LOCAL_WORLD_SIZE - 1)")
        raise InvalidDeviceError(
            f"Invalid device id neuron:{index}: this process sees {count} NeuronCore"
            f"{'' if count == 1 else 's'} (neuron:0 to neuron:{count - 1}) of the emulated instance "
            f"({runtime.machine().describe()}). Set TORCH_NEURONX_INSTANCE_TYPE or NEURON_RT_VISIBLE_CORES for more."
        )
    if _local is not None and index != _local.local_rank:
        raise InvalidDeviceError(_unattached(index))
    return index
