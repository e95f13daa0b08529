"""The emulated Neuron hardware: instances, cores, HBM, and this process's view of them."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from torch_neuronx.runtime.config import NeuronConfigError, RuntimeConfig, from_environment
from torch_neuronx.runtime.instances import INSTANCES, Chip, Instance

__all__ = [
    "INSTANCES",
    "Chip",
    "Instance",
    "NeuronConfigError",
    "RuntimeConfig",
    "config",
    "override_hbm_capacity",
]

_config: RuntimeConfig | None = None


def _initialize() -> None:
    """Called by the C++ core on first use of the device: read the machine, size the cores."""
    global _config
    from torch_neuronx import _C

    cfg = from_environment()
    _C._configure(cfg.device_count, cfg.hbm_per_core, cfg.describe())
    _config = cfg
    local_rank = _torchrun_local_rank(cfg.device_count)
    if local_rank is not None:
        _C._set_device(local_rank)
    from torch_neuronx import device

    # torch.utils.checkpoint saves and restores the device RNG only when the
    # device module says it is initialised (torch.cuda's `_initialized`).
    device._initialized = True


def _torchrun_local_rank(device_count: int) -> int | None:
    """Under torchrun each worker binds neuron:LOCAL_RANK, as TorchNeuron does."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or "LOCAL_RANK" not in os.environ:
        return None
    local_rank = int(os.environ["LOCAL_RANK"])
    if device_count == 1:
        return 0  # a launcher gave each worker its own core (NEURON_RT_VISIBLE_CORES)
    if local_rank >= device_count:
        raise NeuronConfigError(
            f"torchrun started local rank {local_rank}, but this process sees only {device_count} NeuronCores: "
            "launch at most that many processes per node (--nproc-per-node) or widen NEURON_RT_VISIBLE_CORES"
        )
    return local_rank


def config() -> RuntimeConfig:
    """The emulated machine of this process (initialises the device)."""
    from torch_neuronx import _C

    _C._lazy_init()
    assert _config is not None
    return _config


@contextlib.contextmanager
def override_hbm_capacity(nbytes: int, device: int | None = None) -> Iterator[None]:
    """Temporarily give one core (default: all) `nbytes` of HBM: test out-of-memory cheaply.

    Memory already allocated stays allocated; new allocations beyond the
    capacity raise ``torch.OutOfMemoryError`` as they would on the hardware.
    """
    from torch_neuronx import _C

    cfg = config()
    devices = range(cfg.device_count) if device is None else [device]
    for d in devices:
        _C._set_capacity(d, nbytes)
    try:
        yield
    finally:
        for d in devices:
            _C._set_capacity(d, cfg.hbm_per_core)
