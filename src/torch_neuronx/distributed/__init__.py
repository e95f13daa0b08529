"""Native distributed on neuron: the c10d backend "neuron" (ProcessGroupNeuron).

Collectives run on Gloo over the device's host memory, zero-copy, so a job
that outgrows one machine runs with torchrun across hosts. Registered on
import of torch_neuronx, for both neuron and CPU tensors, so that
``init_process_group("neuron")`` — or ``init_process_group()`` while neuron is
the accelerator — needs no ``"cpu:gloo,..."`` spec. :func:`init_mesh` builds
a neuron DeviceMesh that must fit the launch. (A worker started by torchrun
binds ``neuron:LOCAL_RANK``: torch_neuronx.runtime does that on first use.)
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from torch_neuronx.distributed.launch import init_mesh

__all__ = ["comm_stats", "init_mesh", "reset_comm_stats"]

_BACKEND = "neuron"


def _create_backend(store, rank: int, size: int, timeout: timedelta):  # type: ignore[no-untyped-def]
    import torch.distributed as dist

    from torch_neuronx import _C

    return _C.ProcessGroupNeuron(dist.ProcessGroupGloo(store, rank, size, timeout))


def _register() -> None:
    """Register the c10d backend (cheap: no process group is created until the user asks)."""
    if not torch.distributed.is_available():
        return
    import torch.distributed as dist

    if _BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(_BACKEND, _create_backend, devices=["cpu", "neuron"])
    _default_backend_to_neuron()


def _default_backend_to_neuron() -> None:
    # With no backend, torch builds a group for the accelerator alone and names
    # its backend "undefined": CPU tensors (object collectives, DCP metadata)
    # then have no backend on it. Ours serves both devices, so name it.
    # device_mesh imported the function by name, hence the three bindings.
    import torch.distributed as dist
    import torch.distributed.device_mesh as device_mesh
    from torch.distributed import distributed_c10d

    original = distributed_c10d.init_process_group
    if getattr(original, "_neuron_default", False):
        return
    patched = _with_neuron_default(original)
    for module in (dist, distributed_c10d, device_mesh):
        if getattr(module, "init_process_group", None) is original:
            module.init_process_group = patched  # type: ignore[attr-defined]


def _with_neuron_default(init: Callable[..., None]) -> Callable[..., None]:
    signature = inspect.signature(init)

    @functools.wraps(init)
    def init_process_group(*args: Any, **kwargs: Any) -> None:
        bound = signature.bind_partial(*args, **kwargs)
        device_id = bound.arguments.get("device_id")
        if bound.arguments.get("backend") is None and _neuron_is_default(device_id):
            bound.arguments["backend"] = _BACKEND
        return init(*bound.args, **bound.kwargs)

    init_process_group._neuron_default = True  # type: ignore[attr-defined]
    return init_process_group


def _neuron_is_default(device_id: object) -> bool:
    if device_id is not None:
        kind = device_id.type if isinstance(device_id, torch.device) else torch.device(device_id).type
        return kind == "neuron"
    return torch._C._get_accelerator().type == "neuron"


def comm_stats(group=None) -> dict[str, dict[str, int]]:  # type: ignore[no-untyped-def]
    """Collectives run by a process group (default: the world) on the neuron backend:
    ``{"all_reduce": {"calls": 3, "bytes": 4096}, ...}``. Compare parallel layouts with it."""
    backend = _neuron_backend(group)
    return {name: {"calls": calls, "bytes": nbytes} for name, (calls, nbytes) in backend.comm_stats().items()}


def reset_comm_stats(group=None) -> None:  # type: ignore[no-untyped-def]
    """Zero the counts of :func:`comm_stats`."""
    _neuron_backend(group).reset_comm_stats()


def _neuron_backend(group):  # type: ignore[no-untyped-def]
    import torch.distributed as dist

    from torch_neuronx import _C

    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    backend = pg._get_backend(torch.device("neuron"))
    # TORCH_DISTRIBUTED_DEBUG=DETAIL wraps the backend in a checking wrapper
    while isinstance(backend, getattr(dist.distributed_c10d, "_ProcessGroupWrapper", ())):
        backend = backend.wrapped_pg
    if not isinstance(backend, _C.ProcessGroupNeuron):
        raise RuntimeError(
            f"process group uses backend {type(backend).__name__}, not 'neuron': "
            "create it with dist.init_process_group('neuron')"
        )
    return backend
