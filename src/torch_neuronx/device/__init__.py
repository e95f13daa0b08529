r"""torch.neuron: the device module of the emulated NeuronCores.

It reads like :mod:`torch.cuda`: each logical NeuronCore of the emulated
instance is one device, ``neuron:0`` to ``neuron:{device_count() - 1}``; under
a "neuron" process group, TorchNeuron's per-rank model instead (each process
owns neuron:LOCAL_RANK, see :mod:`._index` and docs/distributed.md).
The emulated machine is read from the environment (see
:mod:`torch_neuronx.runtime.config`), and the device initialises on first use,
not on import (:mod:`._lazy`: ``_lazy_init``, ``_lazy_call``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from torch_neuronx import _C, runtime
from torch_neuronx.device._index import (
    InvalidDeviceError,
    _device_t,
    attached_indices,
    current_device,
    device_count,
    device_index,
    local_devices,
)
from torch_neuronx.device._lazy import (  # _is_in_bad_fork and _lazy_call are torch.cuda's names, kept here too
    DeferredNeuronCallError,
    _initialize,
    _is_in_bad_fork,  # noqa: F401
    _lazy_call,  # noqa: F401
    is_initialized,
    launch_blocking,
)
from torch_neuronx.device._lazy import _lazy_init as _initialize_now
from torch_neuronx.device.memory import (
    empty_cache,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_peak_memory_stats,
)
from torch_neuronx.device.random import (
    default_generators,
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from torch_neuronx.device.streams import (
    Event,
    Stream,
    StreamContext,
    current_stream,
    default_stream,
    set_stream,
    stream,
    synchronize,
    wait_stream,
)

_C._set_init_callback(_initialize)  # the core's first use of the device initialises through torch.neuron


def __getattr__(name: str) -> Any:
    # torch.utils.checkpoint saves and restores the device RNG only when the
    # device module says it is initialised (torch.cuda's `_initialized`): the
    # C++ core's flag, read when asked, is the one truth.
    if name == "_initialized":
        return is_initialized()
    raise AttributeError(f"module 'torch.neuron' has no attribute {name!r}")


def is_available() -> bool:
    """Return True: the emulated NeuronCores are always present (False only in a bad fork)."""
    return not _C._in_bad_fork()


def init() -> None:
    """Initialise the device now rather than on first use."""
    _initialize_now()


def _lazy_init() -> None:
    """What PyTorch calls before it touches the device (torch/csrc/utils/device_lazy_init.cpp calls
    ``torch.<backend>._lazy_init``): before a factory call, but also in ``torch.accelerator.set_device_index``
    and ``current_device_index``.

    Selecting a device must leave the runtime untouched, so that ``init_process_group("neuron")`` can still
    start it (Transformers' ``_bind_local_device`` calls ``set_device_index(LOCAL_RANK)`` first). The C++ core
    initialises the device itself on its first real use (an allocation, a generator, a stream), so here only a
    forked child of a process that used the device is refused, as torch.cuda refuses it.
    """
    if _C._in_bad_fork():
        _initialize_now()  # raises, telling the user to use spawn


def set_device(device: _device_t) -> None:
    """Set the calling thread's current NeuronCore, as TorchNeuron's ``set_device``.

    Does not initialise the device: ``set_device(LOCAL_RANK)`` before
    ``init_process_group`` is allowed. A negative or unknown index raises
    ValueError; under a process group, any index but LOCAL_RANK raises
    "Device index i is out of range. Valid range is r to r for this process".
    """
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "neuron":
            raise ValueError(f"expected a neuron device, got '{device}'")
        index = current_device() if device.index is None else device.index
    elif device is None:
        index = current_device()
    elif isinstance(device, int) and not isinstance(device, bool):
        index = device
    else:
        raise TypeError(f"expected a neuron device, a device index or None, got {type(device).__name__}")
    count = device_count()
    if not 0 <= index < count:
        raise InvalidDeviceError(f"Invalid device id: {index}. Valid range is 0 to {count - 1}")
    local = local_devices()
    if local is not None and index != local.local_rank:
        r = local.local_rank
        raise InvalidDeviceError(
            f"Device index {index} is out of range. Valid range is {r} to {r} for this process (under a process "
            "group each process owns one NeuronCore, neuron:LOCAL_RANK)")
    _C._select_device(index)


class device:
    """Context manager that changes the current NeuronCore, like :class:`torch.cuda.device`."""

    def __init__(self, device: _device_t) -> None:
        self.idx = -1 if device is None else device_index(device, optional=True)
        self.prev_idx = -1

    def __enter__(self) -> None:
        if self.idx >= 0:
            self.prev_idx = current_device()
            set_device(self.idx)

    def __exit__(self, *exc: object) -> None:
        if self.idx >= 0:
            set_device(self.prev_idx)


class device_of(device):
    """Context manager that makes the device of tensor `obj` current (CPU tensors: no change)."""

    def __init__(self, obj: torch.Tensor) -> None:
        super().__init__(obj.get_device() if obj.device.type == "neuron" else None)


class NeuronDeviceProperties(NamedTuple):
    """What :func:`get_device_properties` reports about one logical NeuronCore."""

    name: str  # the chip type, as on the real device: "trn1", "trn1n", "inf2", "trn2"
    total_memory: int  # HBM of this logical core, bytes
    instance_type: str
    core_version: str  # NeuronCore-v2 / -v3
    logical_core_id: int  # id on the instance (NEURON_RT_VISIBLE_CORES numbering)
    physical_cores_per_logical: int  # the LNC setting
    chip_index: int
    logical_cores_per_chip: int
    hbm_bandwidth_gbps: float  # of this core's share of its chip
    bf16_tflops: float  # dense, this core's share
    sbuf_bytes: int
    psum_bytes: int
    emulated: bool = True

    def __repr__(self) -> str:
        return (
            f"NeuronDeviceProperties(name='{self.name}', total_memory={self.total_memory // (1 << 20)}MB, "
            f"instance_type='{self.instance_type}', core_version='{self.core_version}', "
            f"logical_core_id={self.logical_core_id}, lnc={self.physical_cores_per_logical}, "
            f"chip_index={self.chip_index})"
        )


def get_device_properties(device: _device_t = None) -> NeuronDeviceProperties:
    """Properties of a logical NeuronCore: chip name, HBM capacity, instance and topology."""
    cfg = runtime.machine()
    index = device_index(device)
    chip = cfg.instance.chip
    local = local_devices()
    core = cfg.visible_cores[index - (local.local_rank if local is not None else 0)]
    per_chip = chip.physical_cores // cfg.lnc
    share = cfg.lnc / chip.physical_cores
    return NeuronDeviceProperties(
        name=chip.name,
        total_memory=cfg.hbm_per_core,
        instance_type=cfg.instance.name,
        core_version=chip.core_version,
        logical_core_id=core,
        physical_cores_per_logical=cfg.lnc,
        chip_index=core // per_chip,
        logical_cores_per_chip=per_chip,
        hbm_bandwidth_gbps=chip.hbm_bandwidth_gbps * share,
        bf16_tflops=chip.bf16_tflops * share,
        sbuf_bytes=chip.sbuf_bytes * cfg.lnc,
        psum_bytes=chip.psum_bytes * cfg.lnc,
    )


def get_device_name(device: torch.device | int = 0) -> str:
    """The device's name as TorchNeuron gives it: ``"neuron:0"`` for 0, ``str(device)`` for a torch.device.

    (The chip and instance are in :func:`get_device_properties`.) Like
    TorchNeuron's, it takes an int or a torch.device and raises ValueError
    for anything else.
    """
    if isinstance(device, torch.device):
        return str(device)
    if isinstance(device, int) and not isinstance(device, bool):
        return f"neuron:{device}"
    raise ValueError(f"Incorrect device argument found, expected torch.device or int type, found {type(device)}")


def get_device_capability(device: _device_t = None) -> tuple[int, int]:
    """The NeuronCore generation as (major, minor): (2, 0) for v2, (3, 0) for v3."""
    return (int(get_device_properties(device).core_version[1:]), 0)


def get_amp_supported_dtype() -> list[torch.dtype]:
    """The dtypes torch.autocast accepts on neuron, as TorchNeuron's: float32, float16 and bfloat16."""
    return [torch.float32, torch.float16, torch.bfloat16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """NeuronCores compute natively in bfloat16."""
    return True


def record_event(event: torch.Event | None = None) -> torch.Event:
    """Record an event on the current stream (a new one if `event` is None) and return it, as TorchNeuron's."""
    return current_stream().record_event(event)


def wait_event(event: torch.Event) -> None:
    """Make the current stream wait for `event`."""
    current_stream().wait_event(event)


def query() -> bool:
    """Whether all work on the current stream has completed (always, once a call returns: the emulated device
    runs each op to completion)."""
    return current_stream().query()


def _sleep(cycles: int) -> None:
    """Keep the current stream busy for `cycles` device cycles (torch.cuda's test helper). TorchNeuron's does
    nothing; so does this one, after checking the argument."""
    if isinstance(cycles, bool) or not isinstance(cycles, int) or cycles < 0:
        raise ValueError(f"_sleep needs a non-negative number of cycles, got {cycles!r}")


__all__ = [
    "DeferredNeuronCallError",
    "Event",
    "InvalidDeviceError",
    "NeuronDeviceProperties",
    "Stream",
    "StreamContext",
    "attached_indices",
    "current_device",
    "current_stream",
    "default_generators",
    "default_stream",
    "device",
    "device_count",
    "device_of",
    "empty_cache",
    "get_amp_supported_dtype",
    "get_device_capability",
    "get_device_name",
    "get_device_properties",
    "get_rng_state",
    "get_rng_state_all",
    "init",
    "initial_seed",
    "is_available",
    "is_bf16_supported",
    "is_initialized",
    "launch_blocking",
    "local_devices",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_snapshot",
    "memory_stats",
    "memory_summary",
    "query",
    "record_event",
    "reset_accumulated_memory_stats",
    "reset_max_memory_allocated",
    "reset_peak_memory_stats",
    "seed",
    "seed_all",
    "set_device",
    "set_rng_state",
    "set_rng_state_all",
    "set_stream",
    "stream",
    "synchronize",
    "wait_event",
    "wait_stream",
]
