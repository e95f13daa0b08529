"""Lazy initialisation of the device, owned by ``torch.neuron`` as torch.cuda owns CUDA's.

Nothing touches the emulated machine until the device is used: the first
device tensor, an explicit ``torch.neuron.init()``, or any call that needs the
configured cores. Calls that only set state for later, such as seeding
(``torch.manual_seed`` calls ``torch.neuron.manual_seed_all``), are queued by
:func:`_lazy_call` and replayed, in order, when the device initialises.

The C++ core holds the one flag that says "initialised"; its first use of the
device calls :func:`_initialize` (registered as the core's init callback),
which configures the cores from :func:`torch_neuronx.runtime.machine` and
replays the queue. A torchrun worker is not bound to a core here: as in
TorchNeuron, ``init_process_group("neuron")`` makes ``neuron:LOCAL_RANK`` its
device (:mod:`torch_neuronx.distributed`), and before that it is on neuron:0
unless it called ``set_device``.
"""

from __future__ import annotations

import atexit
import threading
import traceback
from collections.abc import Callable
from typing import Any

from torch._utils import _LazySeedTracker

from torch_neuronx import _C, runtime
from torch_neuronx.runtime import env

_initialization_lock = threading.RLock()
_queued_calls: list[tuple[Callable[[], Any], list[str]]] = []
_lazy_seed_tracker = _LazySeedTracker()
_tls = threading.local()


_launch_blocking = False


def launch_blocking() -> bool:
    """NEURON_LAUNCH_BLOCKING as read when the device initialised. Either way the emulated device is
    synchronous: every op has completed, and raised its error, when its call returns."""
    return _launch_blocking


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
    """The C++ core's init callback: configure the cores (under a process group, TorchNeuron's per-rank model:
    the node's LOCAL_WORLD_SIZE indices, this process attached to neuron:LOCAL_RANK), replay queued calls."""
    from torch_neuronx.device import _index

    with _initialization_lock:
        machine = runtime.machine()
        # Read (and validated: a bad value warns, naming it) as the Neuron runtime reads them when it starts.
        global _launch_blocking
        _launch_blocking = bool(env.get("NEURON_LAUNCH_BLOCKING"))
        env.get("TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS")
        local = _index.local_devices()
        if local is None:
            _C._configure(machine.device_count, machine.hbm_per_core, machine.describe())
        else:
            _C._configure(local.local_world_size, machine.hbm_per_core, machine.describe())
            _C._set_local_devices(local.local_rank, 1)
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
        atexit.register(_drain_autograd_threads)


def _drain_autograd_threads() -> None:
    """At exit, let autograd's neuron worker threads drop the last backward pass they ran, while Python still runs.

    torch 2.13 stashes a Python object (the contextvars context) in every
    backward pass's thread-local state. A device worker thread that still
    holds the last pass when the interpreter finalizes frees that object
    then: it must take the GIL, Python ends the thread, and the unwinding
    through a noexcept destructor calls std::terminate, aborting a process
    that had finished its work (about a third of the exits after a neuron
    backward). A worker takes its next task only after dropping the previous
    one, so one tiny backward per core, run through the engine directly with
    nothing stashed, leaves each worker holding a pass with no Python object.
    """
    try:
        if not _C._is_initialized():
            return
        import torch

        from torch_neuronx.device import _index

        stash = getattr(torch._C, "_remove_obj_from_tls", None)
        if stash is not None:
            stash("context")
        for index in _index.attached_indices():
            if torch.neuron.memory_stats(index).get("allocation.all.allocated", 0) == 0:
                continue  # never allocated: it ran no backward pass
            x = torch.zeros((), device=torch.device("neuron", index), requires_grad=True)
            torch.autograd.Variable._execution_engine.run_backward(  # no _stash_obj_in_tls, unlike backward()
                ((x * 1.0),), (torch.ones((), device=x.device),), False, False, (), True, True)
    except Exception:  # noqa: BLE001 - exiting: nothing to report to, and the drain is only a precaution
        pass
