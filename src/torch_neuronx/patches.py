"""Every patch of a PyTorch internal, in one place.

The plugin uses PyTorch's registration APIs wherever they exist (PrivateUse1
hooks, guard, allocator, dispatcher kernels, c10d backends, Dynamo backends,
Inductor device backends). What follows is what they do not reach. Each
patch names the torch version it was written against, why torch offers no
hook, and the test in ``tests/test_patches.py`` that fails once torch gains
the hook (then the patch goes). :func:`apply` runs at ``import torch_neuronx``;
every patch is idempotent and checks what it replaces.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

TARGET_TORCH = "2.13"
BACKEND = "neuron"

# What each patch replaced, by name, so that tests can call the original.
ORIGINALS: dict[str, Callable[..., Any]] = {}


def apply() -> None:
    """Apply the patches needed at import (idempotent); Inductor's waits for Inductor (compile/inductor.py)."""
    patch_tensor_printing()
    patch_init_process_group()


# ---------------------------------------------------------------- printing
# torch._tensor_str.tensor_totype widens values to float64 to choose a print
# format, except on the devices it lists as lacking FP64 (MPS, MAIA, some
# XPUs); the list has no registration hook. Neuron lacks FP64 too, and refuses
# float64 tensors, so printing a neuron tensor would fail: widen neuron
# tensors to float32 instead, as torch does for MPS.
# Test: test_tensor_printing_still_has_no_device_hook.


def patch_tensor_printing() -> None:
    import torch._tensor_str as tensor_str

    widen = tensor_str.tensor_totype
    if getattr(widen, "_neuron_aware", False):
        return
    ORIGINALS["tensor_totype"] = widen

    def tensor_totype(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype=torch.float) if t.device.type == BACKEND else widen(t)

    tensor_totype._neuron_aware = True  # type: ignore[attr-defined]
    tensor_str.tensor_totype = tensor_totype


# ---------------------------------------------------------------- c10d default
# init_process_group() without a backend builds a group for the accelerator
# alone and names its backend "undefined", so CPU tensors (object
# collectives, distributed-checkpoint metadata) have no backend on it; torch
# has no hook to name the default backend of a PrivateUse1 accelerator. The
# "neuron" backend serves CPU and neuron tensors, so name it when the backend
# is left out and neuron is the accelerator (or the device_id).
# torch.distributed.device_mesh imported the function by name: both bindings
# are replaced. Test: test_init_process_group_still_leaves_backend_undefined.


def patch_init_process_group() -> None:
    if not torch.distributed.is_available():
        return
    import torch.distributed as dist
    import torch.distributed.device_mesh as device_mesh
    from torch.distributed import distributed_c10d

    original = distributed_c10d.init_process_group
    if getattr(original, "_neuron_default", False):
        return
    ORIGINALS["init_process_group"] = original
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> None:
        bound = signature.bind_partial(*args, **kwargs)
        if bound.arguments.get("backend") is None and _neuron_is_default(bound.arguments.get("device_id")):
            bound.arguments["backend"] = BACKEND
        return original(*bound.args, **bound.kwargs)

    init_process_group._neuron_default = True  # type: ignore[attr-defined]
    for module in (dist, distributed_c10d, device_mesh):
        if getattr(module, "init_process_group", None) is original:
            module.init_process_group = init_process_group  # type: ignore[attr-defined]


def _neuron_is_default(device_id: object) -> bool:
    if device_id is not None:
        kind = device_id.type if isinstance(device_id, torch.device) else torch.device(device_id).type  # type: ignore[arg-type]
        return kind == BACKEND
    return torch._C._get_accelerator().type == BACKEND


# ---------------------------------------------------------------- Inductor re-indexing
# Inductor's scheduler re-indexes a pointwise node to a reduction's iteration
# domain after fusion (Scheduler._try_reindex_pointwise_for_reduction). It
# skips CPU nodes ("CPU reindexing is not validated yet") and takes every
# other device for a SIMD (GPU) backend, whose nodes group as (numel,
# rnumel); neuron runs the C++ (CPU) backend, whose groups are size tuples,
# and the pass fails on them. The only switch, config.loop_reindexing_after_
# fusion, is process-wide: turning it off would change CPU compiles too. So
# neuron nodes are skipped as CPU nodes are, in every compile (the "neuron"
# backend and plain torch.compile on neuron tensors alike).
# Applied by compile/inductor.py when Inductor is loaded.
# Test: test_inductor_reindexing_still_skips_only_cpu.


def patch_inductor_reindexing() -> None:
    from torch._inductor.scheduler import Scheduler

    original = Scheduler._try_reindex_pointwise_for_reduction
    if getattr(original, "_neuron_aware", False):
        return
    ORIGINALS["_try_reindex_pointwise_for_reduction"] = original

    @functools.wraps(original)
    def _try_reindex_pointwise_for_reduction(self: Any, node1: Any, node2: Any) -> bool:
        if _on_neuron(node1) or _on_neuron(node2):
            return False
        return original(self, node1, node2)

    _try_reindex_pointwise_for_reduction._neuron_aware = True  # type: ignore[attr-defined]
    Scheduler._try_reindex_pointwise_for_reduction = _try_reindex_pointwise_for_reduction  # type: ignore[method-assign]


def _on_neuron(node: Any) -> bool:
    device = node.get_device()
    return device is not None and device.type == BACKEND
