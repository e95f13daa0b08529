"""Native distributed on neuron: the c10d backend "neuron" (ProcessGroupNeuron).

Collectives run on Gloo over the device's host memory, zero-copy, so a job
that outgrows one machine runs with torchrun across hosts. Registered on
import of torch_neuronx, for both neuron and CPU tensors, so that
``init_process_group("neuron")`` — or ``init_process_group()`` while neuron is
the accelerator (torch_neuronx.patches) — needs no ``"cpu:gloo,..."`` spec. :func:`init_mesh` builds
a neuron DeviceMesh that must fit the launch.

Creating the first "neuron" process group applies TorchNeuron's per-rank
device model (:mod:`.devices`): the device must not be initialised yet, and
the process then owns exactly one NeuronCore, ``neuron:LOCAL_RANK``, with
``device_count()`` equal to the local world size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torch_neuronx.distributed.launch import init_mesh
from torch_neuronx.runtime import env

__all__ = ["comm_stats", "init_mesh", "reset_comm_stats"]

_BACKEND = "neuron"
# Called with each ProcessGroupNeuron this process creates: `torch-neuronx check`'s probe keeps them so that it
# reads their collective counts even after destroy_process_group() (c10d has no hook on that call).
_backend_listeners: list[Callable[[Any], None]] = []


# c10d names the world group "0" again after destroy_process_group(), and its subgroups "1", "2", ... again (a
# subgroup named by a hash of its ranks even within one world, once a subgroup was destroyed), so a group made anew
# would find an earlier group's Gloo addresses under its name in the store (torchrun's agent store, or a user's
# store, outlives every process group) and connect to ports that are closed or closing: "Connection refused", or a
# hang, by chance, as plain "gloo" does (pytorch/pytorch#55967). So every group gets keys of its own: the world's
# generation and the group's generation within that world go into its store prefix. A generation is agreed through
# the store without a barrier: every member adds 1 to an arrival counter of the group's name and size, and all
# members of one incarnation arrive before any member can arrive for the next one (making a group waits for all its
# members), so arrivals (n - 1) // size + 1 name the same incarnation on every rank. A fresh store starts at one; a
# process that replaces a rank on a store that lives on arrives in the same generation as the survivors.
_world = "none"  # the current world: "<size>x<generation>"
_local_counts: dict[str, int] = {}


def _generation(store, key: str, size: int) -> int:  # type: ignore[no-untyped-def]
    """Which incarnation of a group of `size` members this is, from its arrival counter `key` in the store."""
    import torch.distributed as dist

    try:
        arrivals = int(store.add(key, 1))
    except dist.DistError:  # the store is unreachable: that is the user's error to see, not a reason to guess
        raise
    except (NotImplementedError, RuntimeError):  # a user's Python store without add(): count in this process
        _local_counts[key] = _local_counts.get(key, 0) + size
        arrivals = _local_counts[key]
    return (arrivals - 1) // size + 1


def _create_backend(opts, _backend_options=None):  # type: ignore[no-untyped-def]
    """c10d's creator (extended API: `opts` is a DistributedBackendOptions, which names the group)."""
    import torch.distributed as dist

    from torch_neuronx import _C
    from torch_neuronx.distributed.devices import setup_process_devices

    global _world
    store, rank, size = opts.store, opts.group_rank, opts.group_size
    if not dist.is_initialized():  # the world group itself: c10d sets it as the default after making its backends
        _world = f"{size}x{_generation(store, f'neuron_worlds_of_{size}', size)}"
        store = dist.PrefixStore(f"neuron_world_{_world}/", store)
    else:  # a subgroup: its store is already under its name; worlds and re-made names apart
        made = _generation(store, f"neuron_world_{_world}_groups_of_{size}", size)
        store = dist.PrefixStore(f"neuron_world_{_world}_group_{made}/", store)
    setup_process_devices(rank, size, store)
    backend = _C.ProcessGroupNeuron(dist.ProcessGroupGloo(store, rank, size, opts.timeout))
    # TorchNeuron's bucketing of large all-gathers and reduce-scatters (bad values warn, naming the variable)
    backend._set_bucketing(env.get("COLLECTIVE_BUCKETSIZE_IN_MB") << 20, env.get("NEURON_USE_SPLIT_ALLGATHER"),
                           env.get("NEURON_USE_SPLIT_REDUCE_SCATTER"))
    for listener in _backend_listeners:
        listener(backend)
    return backend


def _register() -> None:
    """Register the c10d backend (cheap: no process group is created until the user asks)."""
    if not torch.distributed.is_available():
        return
    import torch.distributed as dist

    if _BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(_BACKEND, _create_backend, extended_api=True, devices=["cpu", "neuron"])


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
