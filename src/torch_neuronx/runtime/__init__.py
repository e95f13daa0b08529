"""The emulated Neuron hardware: instances, cores, HBM, and this process's view of them."""

from __future__ import annotations

import contextlib
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
    from torch_neuronx import device

    # torch.utils.checkpoint saves and restores the device RNG only when the
    # device module says it is initialised (torch.cuda's `_initialized`).
    device._initialized = True


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
