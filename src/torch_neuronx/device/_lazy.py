"""Lazy initialisation of the device, owned by ``torch.neuron`` as torch.cuda owns CUDA's.

Nothing touches the emulated machine until the device is used: the first
device tensor, an explicit ``torch.neuron.init()``, or any call that needs the
configured cores. Calls that only set state for later, such as seeding
(``torch.manual_seed`` calls ``torch.neuron.manual_seed_all``), are queued by
:func:`_lazy_call` and replayed, in order, when the device initialises.

The C++ core holds the one flag that says "initialised"; its first use of the
device calls :func:`_initialize` (registered as the core's init callback),
which configures the cores from :func:`torch_neuronx.runtime.machine` and
replays the queue.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from typing import Any

from torch._utils import _LazySeedTracker

from torch_neuronx import _C, runtime

_initialization_lock = threading.RLock()
_queued_calls: list[tuple[Callable[[], Any], list[str]]] = []
_lazy_seed_tracker = _LazySeedTracker()
_tls = threading.local()


class DeferredNeuronCallError(Exception):
    """A call queued before the device initialised failed when it was replayed."""


def is_initialized() -> bool:
    """Whether the device has been initialised in this process (never in a bad fork)."""
    return _C._is_initialized()


def _is_in_bad_fork() -> bool:
    """Whether this process is a fork of one that had initialised the device (it must not use it)."""
    return _C._in_bad_fork()


def _lazy_init() -> None:
    """Initialise the device if it is not yet (torch calls this before making a neuron tensor)."""
    if _C._is_initialized() or getattr(_tls, "is_initializing", False):
        return
    _C._lazy_init()  # raises in a bad fork; runs _initialize once, under the core's own lock


def _lazy_call(callable: Callable[[], Any], **kwargs: bool) -> None:
    """Run `callable` now if the device is initialised, else when it initialises.

    ``seed_all=True`` / ``seed=True`` keep only the latest seeding call of that
    kind, as torch.cuda does.
    """
    with _initialization_lock:
        if _C._is_initialized() or getattr(_tls, "is_initializing", False):
            callable()
        elif kwargs.get("seed_all", False):
            _lazy_seed_tracker.queue_seed_all(callable, traceback.format_stack())
        elif kwargs.get("seed", False):
            _lazy_seed_tracker.queue_seed(callable, traceback.format_stack())
        else:
            _queued_calls.append((callable, traceback.format_stack()))


def _initialize() -> None:
    """The C++ core's init callback: configure the cores, bind torchrun's LOCAL_RANK, replay queued calls."""
    with _initialization_lock:
        machine = runtime.machine()
        _C._configure(machine.device_count, machine.hbm_per_core, machine.describe())
        local_rank = runtime.torchrun_local_rank(machine.device_count)
        if local_rank is not None:
            _C._set_device(local_rank)
        _tls.is_initializing = True
        try:
            calls = [c for c in _lazy_seed_tracker.get_calls() if c] + _queued_calls
            for queued_call, origin in calls:
                try:
                    queued_call()
                except Exception as exc:
                    raise DeferredNeuronCallError(
                        f"a neuron call queued before the device initialised failed: {exc}\n\n"
                        f"It was made at:\n\n{''.join(origin)}"
                    ) from exc
            _queued_calls.clear()
            _lazy_seed_tracker.__init__()  # type: ignore[misc]
        finally:
            del _tls.is_initializing
