"""TorchNeuron's per-rank device model, set up when the first "neuron" process group is created.

TorchNeuron's distributed backend does this in its process group's
constructor (``_neuron_runtime_setup``): the Neuron runtime must not have
started yet; the process's local rank and local world size come from
torchrun's LOCAL_RANK / LOCAL_WORLD_SIZE (or, without them, from grouping the
ranks by host through the store); ``NEURON_RT_VISIBLE_CORES`` becomes the
local rank unless the user set it; and the process must then see exactly one
NeuronCore. Its device index is the local rank, and ``device_count()`` the
local world size (the device layer enforces that: torch_neuronx.device._index
and csrc/runtime/init.cpp). This module is the emulator's version of those
steps, with the same conditions and messages, each followed by what to do.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

from torch_neuronx import _C, runtime
from torch_neuronx.device import _index
from torch_neuronx.device._lazy import _lazy_init

__all__ = ["setup_process_devices"]

_done = False


def _env_int(name: str) -> int | None:
    text = os.environ.get(name)
    if text is None:
        return None
    if not text.strip().isdigit():
        raise ValueError(f"{name}={text!r}: torchrun sets it to a non-negative integer; do not override it")
    return int(text)


def _publish_host(rank: int, store) -> str:  # type: ignore[no-untyped-def]
    """Say in the group's store which host this rank runs on (each group has keys of its own)."""
    host = socket.gethostname()
    if _env_int("LOCAL_RANK") is None or _env_int("LOCAL_WORLD_SIZE") is None:
        store.set(f"neuron_local_layout/{rank}", host)
    return host


def _local_layout(rank: int, world_size: int, store) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """(local rank, local world size): torchrun's variables, else the ranks that share this host, in rank order."""
    local_rank, local_world_size = _env_int("LOCAL_RANK"), _env_int("LOCAL_WORLD_SIZE")
    if local_rank is not None and local_world_size is not None:
        return local_rank, local_world_size
    host = _publish_host(rank, store)
    keys = [f"neuron_local_layout/{i}" for i in range(world_size)]
    store.wait(keys, timedelta(minutes=5))
    on_this_host = [i for i, key in enumerate(keys) if store.get(key).decode() == host]
    return on_this_host.index(rank), len(on_this_host)


def setup_process_devices(rank: int, world_size: int, store) -> None:  # type: ignore[no-untyped-def]
    """Bind this process to neuron:LOCAL_RANK, once, when its first "neuron" process group is created."""
    global _done
    if _done:  # bound already; a rank new to this group may still be grouping the ranks by host
        _publish_host(rank, store)
        return
    if _C._is_initialized():
        raise AssertionError(
            "Neuron runtime should not be initialized before the init_process_group. (This process used the "
            "neuron device before creating its process group, which fails on a Trainium instance too: call "
            "dist.init_process_group('neuron') first; torch.neuron.set_device(LOCAL_RANK) before it is allowed.)")
    local_rank, local_world_size = _local_layout(rank, world_size, store)
    if not 0 <= local_rank < local_world_size:
        raise ValueError(f"local device start index {local_rank} is out of range. Valid range is 0 to "
                         f"{local_world_size - 1} (LOCAL_RANK must be below LOCAL_WORLD_SIZE)")
    if not os.environ.get("NEURON_RT_VISIBLE_CORES"):
        os.environ["NEURON_RT_VISIBLE_CORES"] = str(local_rank)
    try:
        machine = runtime.reload_machine()
    except runtime.NeuronConfigError as exc:
        raise runtime.NeuronConfigError(
            f"{exc} (local rank {local_rank} of {local_world_size}: launch at most as many processes per node "
            "as the instance has NeuronCores, or choose a larger TORCH_NEURONX_INSTANCE_TYPE)") from None
    if machine.device_count != 1:
        raise AssertionError(
            "Attempted to have more than one device per process in distributed setup (NEURON_RT_VISIBLE_CORES="
            f"{os.environ['NEURON_RT_VISIBLE_CORES']!r} shows this process {machine.device_count} NeuronCores: "
            "under a process group each process uses exactly one; leave NEURON_RT_VISIBLE_CORES unset or give "
            "each rank one core)")
    _index._set_local_devices(local_rank, local_world_size)
    _done = True
    _lazy_init()
