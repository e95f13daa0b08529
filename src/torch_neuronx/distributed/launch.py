"""Launch helpers: a device mesh that says plainly when the launched process count does not fit it.

(torchrun's workers bind ``neuron:LOCAL_RANK`` on their own: torch_neuronx.runtime
does it when the device initialises.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["init_mesh"]


def init_mesh(
    shape: Sequence[int],
    names: Sequence[str] | None = None,
    *,
    timeout: timedelta | None = None,
) -> DeviceMesh:
    """A neuron DeviceMesh of `shape` over all launched processes, e.g. ``init_mesh((4, 8), ("dp", "tp"))``.

    Initialises the "neuron" process group from the launcher's environment if
    needed. Raises ValueError naming both numbers when the mesh does not use
    exactly the launched processes (torch only rejects a mesh larger than the
    world, and with a message about ranks).
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    shape = tuple(int(n) for n in shape)
    if not shape or any(n < 1 for n in shape):
        raise ValueError(f"mesh shape {shape} must list positive sizes")
    if names is not None and len(names) != len(shape):
        raise ValueError(f"mesh shape {shape} has {len(shape)} dims but {len(names)} names {tuple(names)}")
    if not dist.is_initialized():
        dist.init_process_group("neuron", timeout=timeout)
    world = dist.get_world_size()
    needed = math.prod(shape)
    if needed != world:
        dims = " x ".join(str(n) for n in shape)
        raise ValueError(
            f"mesh {dims} needs {needed} processes, but {world} were launched: "
            f"launch nnodes x nproc-per-node = {needed} processes, or change the mesh"
        )
    return init_device_mesh("neuron", shape, mesh_dim_names=tuple(names) if names is not None else None)
