"""The emulated Neuron hardware, as plain data: instances, cores, HBM, and the machine this process emulates.

Nothing here touches the device: :func:`machine` reads the environment once
and remembers the answer, and ``torch.neuron`` configures the C++ core from it
when the device is first used. This package imports nothing from the other
layers (``device``, ``compile``, ``distributed``, ``tools``).
"""

from __future__ import annotations

import os
import threading

from torch_neuronx.runtime.config import NeuronConfigError, RuntimeConfig, from_environment
from torch_neuronx.runtime.instances import INSTANCES, Chip, Instance

__all__ = [
    "INSTANCES",
    "Chip",
    "Instance",
    "NeuronConfigError",
    "RuntimeConfig",
    "from_environment",
    "machine",
    "reload_machine",
    "torchrun_local_rank",
]

_machine: RuntimeConfig | None = None
_lock = threading.Lock()


def machine() -> RuntimeConfig:
    """The machine this process emulates, read from the environment on the first call and fixed from then on."""
    global _machine
    if _machine is None:
        with _lock:
            if _machine is None:
                _machine = from_environment()
    return _machine


def reload_machine() -> RuntimeConfig:
    """Read the machine from the environment again (the neuron process group sets NEURON_RT_VISIBLE_CORES before
    the device initialises, as TorchNeuron's backend does before the Neuron runtime starts)."""
    global _machine
    with _lock:
        _machine = from_environment()
    return _machine


def torchrun_local_rank(device_count: int) -> int | None:
    """The core a torchrun worker binds (neuron:LOCAL_RANK, as TorchNeuron does), or None outside torchrun."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or "LOCAL_RANK" not in os.environ:
        return None
    text = os.environ["LOCAL_RANK"]
    if not text.strip().isdigit():
        raise NeuronConfigError(f"LOCAL_RANK={text!r}: torchrun sets it to the worker's index on its node, "
                                "a non-negative integer; do not override it")
    local_rank = int(text)
    if device_count == 1:
        return 0  # a launcher gave each worker its own core (NEURON_RT_VISIBLE_CORES)
    if local_rank >= device_count:
        raise NeuronConfigError(
            f"torchrun started local rank {local_rank}, but this process sees only {device_count} NeuronCores: "
            "launch at most that many processes per node (--nproc-per-node) or widen NEURON_RT_VISIBLE_CORES"
        )
    return local_rank
