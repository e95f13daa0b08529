"""Memory of the emulated NeuronCores: CUDA-style statistics from the C++ allocator.

Memory is charged to a core when allocated and returned when freed (there is
no cache, so "reserved" equals "allocated"); each core has the HBM capacity
of the emulated instance, and going over it raises ``torch.OutOfMemoryError``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from torch_neuronx import _C
from torch_neuronx.device._index import _device_t, device_index


def _checked_index(device: _device_t) -> int:
    _C._lazy_init()
    index = device_index(device)
    count = _C._device_count()
    if not 0 <= index < count:
        raise ValueError(f"invalid device neuron:{index}: {count} NeuronCores are visible")
    return index


def memory_stats(device: _device_t = None) -> OrderedDict[str, Any]:
    """The allocator's statistics for a core, with torch.cuda.memory_stats' keys
    (``allocated_bytes.all.current``, ``active_bytes.all.peak``, ``num_ooms``, ...)."""
    return torch.accelerator.memory_stats(_checked_index(device))


def memory_allocated(device: _device_t = None) -> int:
    """Bytes of tensor memory in use on a core."""
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device: _device_t = None) -> int:
    """The peak of :func:`memory_allocated` since start or the last :func:`reset_peak_memory_stats`."""
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device: _device_t = None) -> int:
    """Bytes held by the allocator on a core (no caching: equal to :func:`memory_allocated`)."""
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device: _device_t = None) -> int:
    """The peak of :func:`memory_reserved`."""
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device: _device_t = None) -> None:
    """Restart the peaks tracked by :func:`memory_stats` from the current values."""
    torch.accelerator.reset_peak_memory_stats(_checked_index(device))


def reset_max_memory_allocated(device: _device_t = None) -> None:
    """Same as :func:`reset_peak_memory_stats` (the torch.cuda spelling)."""
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device: _device_t = None) -> None:
    """Reset the allocation/free counters and the OOM count."""
    torch.accelerator.reset_accumulated_memory_stats(_checked_index(device))


def empty_cache() -> None:
    """Release cached memory. The allocator caches nothing, so there is nothing to release."""


def mem_get_info(device: _device_t = None) -> tuple[int, int]:
    """(free, total) HBM bytes of a core."""
    return torch.accelerator.get_memory_info(_checked_index(device))


def _fmt(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def memory_summary(device: _device_t = None, abbreviated: bool = False) -> str:
    """A readable table of :func:`memory_stats` for a core, like torch.cuda.memory_summary."""
    index = _checked_index(device)
    stats = memory_stats(index)
    free, total = mem_get_info(index)
    rows = [
        ("Allocated memory", "allocated_bytes.all", True),
        ("Active memory", "active_bytes.all", True),
        ("Reserved memory", "reserved_bytes.all", True),
        ("Allocations", "allocation.all", False),
        ("Active allocs", "active.all", False),
    ]
    width = 75
    lines = ["=" * width, f" neuron:{index} memory summary".ljust(width), "-" * width]
    lines.append(f"{'Metric':<24}|{'Cur Usage':>12} |{'Peak Usage':>12} |{'Tot Alloc':>11} |{'Tot Freed':>9}")
    lines.append("-" * width)
    for label, key, is_bytes in rows:
        f = _fmt if is_bytes else str
        cur, peak = stats.get(f"{key}.current", 0), stats.get(f"{key}.peak", 0)
        alloc, freed = stats.get(f"{key}.allocated", 0), stats.get(f"{key}.freed", 0)
        lines.append(f"{label:<24}|{f(cur):>12} |{f(peak):>12} |{f(alloc):>11} |{f(freed):>9}")
    lines.append("-" * width)
    lines.append(f"HBM capacity {_fmt(total)}, free {_fmt(free)}; OOMs: {stats.get('num_ooms', 0)}")
    lines.append("=" * width)
    return "\n".join(lines)
