"""Random number generation on neuron.

Each core has a default generator. Its state is CUDA-style, 16 bytes of
(seed, offset), and its numbers come from the CPU engine: the same seed gives
the same numbers on neuron as on CPU (see csrc/runtime/generator.cpp).
Seeding before the device is used is queued, as torch.cuda queues it:
``torch.manual_seed(0)`` does not initialise the device.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from torch_neuronx import _C
from torch_neuronx.device._index import _device_t, attached_indices, device_index
from torch_neuronx.device._lazy import _lazy_call, _lazy_init

_generators: dict[int, torch.Generator] = {}


def _default_generators() -> tuple[torch.Generator, ...]:
    """The default generators of the cores this process may use (under a process group: neuron:LOCAL_RANK's)."""
    if not _generators:
        _lazy_init()
        _generators.update((i, _C._default_generator(i)) for i in attached_indices())
    return tuple(_generators.values())


class _DefaultGenerators(tuple):
    """``torch.neuron.default_generators``: built on first access, not on import; indexed by device index (under
    a process group only neuron:LOCAL_RANK's exists, and iterating gives that one)."""

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return _default_generators()[i]
        _default_generators()
        return _generators[device_index(i)]

    def __len__(self) -> int:
        return len(_default_generators())

    def __iter__(self):
        return iter(_default_generators())


default_generators: tuple[torch.Generator, ...] = _DefaultGenerators()


def _generator(device: _device_t) -> torch.Generator:
    index = device_index(device)
    _default_generators()
    return _generators[index]


def get_rng_state(device: _device_t = "neuron") -> torch.Tensor:
    """The RNG state of a core: a CPU uint8 tensor of 16 bytes (seed, offset)."""
    return _generator(device).get_state()


def get_rng_state_all() -> list[torch.Tensor]:
    """The RNG states of all cores."""
    return [g.get_state() for g in _default_generators()]


def set_rng_state(new_state: torch.Tensor, device: _device_t = "neuron") -> None:
    """Restore a core's RNG state from :func:`get_rng_state`."""
    _generator(device).set_state(new_state)


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    """Restore the RNG states of all cores from :func:`get_rng_state_all` (one state per core)."""
    states = list(new_states)
    generators = _default_generators()
    if len(states) != len(generators):
        raise ValueError(f"set_rng_state_all needs one state per NeuronCore: got {len(states)} states for "
                         f"{len(generators)} cores (save them with torch.neuron.get_rng_state_all())")
    for g, state in zip(generators, states, strict=True):
        g.set_state(state)


def manual_seed(seed: int) -> None:
    """Seed the current core's generator (queued until the device initialises)."""
    seed = int(seed)
    _lazy_call(lambda: _generator(None).manual_seed(seed), seed=True)


def manual_seed_all(seed: int) -> None:
    """Seed every core's generator (``torch.manual_seed`` calls this; queued until the device initialises)."""
    seed = int(seed)

    def seed_every_core() -> None:
        for g in _default_generators():
            g.manual_seed(seed)

    _lazy_call(seed_every_core, seed_all=True)


def seed() -> None:
    """Seed the current core's generator with a non-deterministic number."""
    _lazy_call(lambda: _generator(None).seed())


def seed_all() -> None:
    """Seed every core's generator with one non-deterministic number."""

    def seed_every_core() -> None:
        s = _generator(None).seed()
        for g in _default_generators():
            g.manual_seed(s)

    _lazy_call(seed_every_core, seed_all=True)


def initial_seed() -> int:
    """The seed of the current core's generator."""
    return _generator(None).initial_seed()
