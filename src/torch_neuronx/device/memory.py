"""Memory of the emulated NeuronCores: the caching allocator's statistics, snapshots and settings.

The allocator (csrc/runtime/allocator.cpp, docs/memory.md) keeps freed blocks
cached for reuse, as TorchNeuron's does, so ``memory_reserved()`` (segments
held, cached or live) is at least ``memory_allocated()`` (bytes of live
tensors); every reserved byte counts against the core's HBM, and a request
that does not fit raises ``torch.OutOfMemoryError`` after returning the cache.
Statistics have torch.cuda's keys and functions; snapshots have its format, so
PyTorch's memory visualiser renders them (``torch.cuda._memory_viz``).
"""

from __future__ import annotations

import contextlib
import pickle
import sys
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import torch

from torch_neuronx import _C
from torch_neuronx.device._index import _device_t, attached_indices, device_index
from torch_neuronx.device._lazy import _lazy_init
from torch_neuronx.runtime.config import format_bytes

__all__ = [
    "empty_cache", "max_memory_allocated", "max_memory_reserved", "mem_get_info", "memory_allocated",
    "memory_reserved", "memory_snapshot", "memory_stats", "memory_summary", "override_hbm_capacity",
    "reset_accumulated_memory_stats", "reset_max_memory_allocated", "reset_peak_memory_stats",
    "set_per_process_memory_fraction",
]


def _checked_index(device: _device_t) -> int:
    index = device_index(device)
    _lazy_init()
    return index


def memory_stats(device: _device_t = None) -> OrderedDict[str, Any]:
    """The allocator's statistics for a core, with torch.cuda.memory_stats' keys
    (``allocated_bytes.all.current``, ``reserved_bytes.large_pool.peak``, ``num_alloc_retries``, ``num_ooms``, ...)."""
    return torch.accelerator.memory_stats(_checked_index(device))


# The single-value getters read one statistic directly (a few µs; memory_stats() builds the whole dictionary):
# the values are those of memory_stats()'s "allocated_bytes.all.current" and so on.
_ALLOCATED, _ALLOCATED_PEAK, _RESERVED, _RESERVED_PEAK = range(4)  # csrc/runtime/allocator.h: MemoryStat


def memory_allocated(device: _device_t = None) -> int:
    """Bytes of tensor memory in use on a core (block sizes: requests rounded to their size class)."""
    return _C._memory_stat(_checked_index(device), _ALLOCATED)


def max_memory_allocated(device: _device_t = None) -> int:
    """The peak of :func:`memory_allocated` since start or the last :func:`reset_peak_memory_stats`."""
    return _C._memory_stat(_checked_index(device), _ALLOCATED_PEAK)


def memory_reserved(device: _device_t = None) -> int:
    """Bytes the allocator holds on a core, live or cached: what counts against its HBM."""
    return _C._memory_stat(_checked_index(device), _RESERVED)


def max_memory_reserved(device: _device_t = None) -> int:
    """The peak of :func:`memory_reserved`."""
    return _C._memory_stat(_checked_index(device), _RESERVED_PEAK)


def reset_peak_memory_stats(device: _device_t = None) -> None:
    """Restart the peaks tracked by :func:`memory_stats` from the current values."""
    torch.accelerator.reset_peak_memory_stats(_checked_index(device))


def reset_max_memory_allocated(device: _device_t = None) -> None:
    """Same as :func:`reset_peak_memory_stats` (the torch.cuda spelling)."""
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device: _device_t = None) -> None:
    """Reset the accumulated counters: totals allocated and freed, retries, OOMs."""
    torch.accelerator.reset_accumulated_memory_stats(_checked_index(device))


def empty_cache() -> None:
    """Return every cached, unused segment of every core to the host (reserved memory drops to what is live)."""
    if _C._is_initialized():
        _C._empty_cache()


def mem_get_info(device: _device_t = None) -> tuple[int, int]:
    """(free, total) HBM bytes of a core: free is the capacity less what the allocator reserves."""
    return torch.accelerator.get_memory_info(_checked_index(device))


def set_per_process_memory_fraction(fraction: float, device: _device_t = None) -> None:
    """Limit this process to `fraction` of the core's HBM, as torch.cuda does (1.0: the whole core)."""
    if not isinstance(fraction, float | int) or not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    from torch_neuronx import runtime

    index = _checked_index(device)
    _C._set_capacity(index, max(1, int(runtime.machine().hbm_per_core * fraction)))


@contextlib.contextmanager
def override_hbm_capacity(nbytes: int, device: _device_t | None = None) -> Iterator[None]:
    """Temporarily give one core (default: all) `nbytes` of HBM: rehearse a smaller core, test out-of-memory cheaply.

    Memory already reserved stays reserved; new segments beyond the capacity
    raise ``torch.OutOfMemoryError`` as they would on the hardware. On exit
    each core gets back the capacity it had on entry, so overrides nest.
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
        raise ValueError(f"override_hbm_capacity needs a positive number of bytes, got {nbytes!r}")
    devices = attached_indices() if device is None else [device_index(device)]
    _lazy_init()
    previous = {d: _C._capacity(d) for d in devices}
    for d in devices:
        _C._set_capacity(d, nbytes)
    try:
        yield
    finally:
        for d, capacity in previous.items():
            _C._set_capacity(d, capacity)


# ---------------------------------------------------------------- snapshots


def _record_memory_history(enabled: str | bool | None = "all", *args: Any, **kwargs: Any) -> None:
    """Record allocations with their Python stack traces, as ``torch.cuda.memory._record_memory_history``.

    `enabled`: None stops recording; "state" keeps the stacks of live blocks;
    "all" also keeps a trace of the last `max_entries` events (allocs, frees,
    segments, snapshots, OOMs). `context`: whose stacks to keep ("state",
    "alloc", "all"). `stacks`: "python", or "all" for C++ frames too.
    `skip_actions` leaves those actions out of the trace. Recording covers
    every core. The legacy form ``_record_memory_history(True, ...)`` works
    as torch.cuda's does. `device`, `compile_context` and
    `global_record_annotations` are accepted for torch.cuda's signature: the
    stacks already hold the frames of compiled code, and annotations are not
    recorded.
    """
    if isinstance(enabled, bool):
        _record_memory_history_legacy(enabled, *args, **kwargs)
    else:
        _record_memory_history_impl(enabled, *args, **kwargs)


def _record_memory_history_impl(enabled: str | None = "all", context: str | None = "all", stacks: str = "all",
                                max_entries: int = sys.maxsize, device: _device_t = None,
                                clear_history: bool = False, compile_context: bool = False,
                                global_record_annotations: bool = False,
                                skip_actions: list[str] | None = None) -> None:
    _lazy_init()
    if enabled is not None and context is None:
        context = "all"
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 0:
        raise ValueError(f"_record_memory_history: max_entries must be a non-negative int, got {max_entries!r}")
    if skip_actions is not None and (isinstance(skip_actions, str)
                                     or not all(isinstance(a, str) for a in skip_actions)):
        raise TypeError(f"_record_memory_history: skip_actions is a list of action names, got {skip_actions!r}")
    _C._record_memory_history(enabled, context if enabled is not None else None, stacks,
                              min(max_entries, sys.maxsize), clear_history, list(skip_actions or []))


def _record_memory_history_legacy(enabled: bool, record_context: bool = True, trace_alloc_max_entries: int = 1,
                                  trace_alloc_record_context: bool = False, device: _device_t = None,
                                  record_context_cpp: bool = False, clear_history: bool = False,
                                  compile_context: bool = False, global_record_annotations: bool = False,
                                  skip_actions: list[str] | None = None) -> None:
    # torch.cuda's mapping of the boolean form onto the current one.
    if not enabled:
        _record_memory_history_impl(None)
        return
    tracing = trace_alloc_max_entries > 1
    _record_memory_history_impl(
        "all" if tracing else "state",
        ("all" if trace_alloc_record_context else "state") if record_context else None,
        "all" if record_context_cpp else "python",
        max(trace_alloc_max_entries, 1), clear_history=clear_history, skip_actions=skip_actions)


def _snapshot(device: _device_t = None, augment_with_fx_traces: bool = False) -> dict[str, Any]:
    """The allocator's state in PyTorch's snapshot format: {"segments", "device_traces", "allocator_settings"}.

    `augment_with_fx_traces` adds torch.cuda's FX debug fields to the frames of compiled code.
    """
    _lazy_init()
    snapshot = _C._memory_snapshot(True)
    if augment_with_fx_traces:
        from torch.cuda.memory import _augment_memory_snapshot_stack_traces  # device-neutral: it edits frames

        snapshot = _augment_memory_snapshot_stack_traces(snapshot)
    return snapshot


def _dump_snapshot(filename: str = "dump_snapshot.pickle", augment_with_fx_traces: bool = False) -> None:
    """Write :func:`_snapshot` to `filename`, for pytorch.org/memory_viz or ``torch.cuda._memory_viz``."""
    snapshot = _snapshot(augment_with_fx_traces=augment_with_fx_traces)
    with open(filename, "wb") as f:
        pickle.dump(snapshot, f, protocol=4)  # MemoryViz.js reads protocols 2 to 4


def memory_snapshot(mempool_id: tuple[int, int] | None = None, include_traces: bool = True) -> list[dict[str, Any]]:
    """The segments of every core, as ``torch.cuda.memory_snapshot()`` lists them.

    The neuron allocator has one memory pool, ``(0, 0)``: `mempool_id` may
    name it (or be None); `include_traces=False` skips copying the trace.
    """
    if mempool_id is not None and tuple(mempool_id) != (0, 0):
        raise ValueError(f"memory_snapshot: the neuron allocator has one memory pool, (0, 0); got {mempool_id!r}")
    _lazy_init()
    return _C._memory_snapshot(bool(include_traces))["segments"]


# ---------------------------------------------------------------- summary


def _format_size(n: int, reference: int) -> str:
    prefixes = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"]
    prefix = prefixes[0]
    for candidate in prefixes[1:]:
        if reference < 768 * 1024:
            break
        prefix, n, reference = candidate, n // 1024, reference / 1024
    return f"{n:6d} {prefix}"


def _format_count(n: int, reference: int) -> str:
    prefixes = [" ", "K", "M"]
    prefix = prefixes[0]
    for candidate in prefixes[1:]:
        if reference < 750 * 1000:
            break
        prefix, n, reference = candidate, n // 1000, reference / 1000
    return f"{n:7d} {prefix} "


def memory_summary(device: _device_t = None, abbreviated: bool = False) -> str:
    """A readable table of :func:`memory_stats` for a core, laid out as ``torch.cuda.memory_summary``."""
    index = _checked_index(device)
    stats = memory_stats(index)
    free, total = mem_get_info(index)
    rows = [
        ("allocated_bytes", "Allocated memory", _format_size),
        ("active_bytes", "Active memory", _format_size),
        ("requested_bytes", "Requested memory", _format_size),
        ("reserved_bytes", "HBM reserved memory", _format_size),
        ("inactive_split_bytes", "Non-releasable memory", _format_size),
        ("allocation", "Allocations", _format_count),
        ("active", "Active allocs", _format_count),
        ("segment", "HBM reserved segments", _format_count),
        ("inactive_split", "Non-releasable allocs", _format_count),
    ]
    lines = ["=" * 75, f"{'':17}PyTorch NEURON memory summary, device ID {index}".ljust(75), "-" * 75,
             f"  {'':7}NEURON OOMs: {stats.get('num_ooms', 0):<12d} | {'':6}alloc retries: "
             f"{stats.get('num_alloc_retries', 0)}".ljust(75), "=" * 75,
             "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  "]
    for key, name, fmt in rows:
        lines.append("-" * 75)
        subs = [("all", name)] + ([] if abbreviated else [("large_pool", "      from large pool"),
                                                          ("small_pool", "      from small pool")])
        reference: list[int] | None = None
        for sub, label in subs:
            values = [stats.get(f"{key}.{sub}.{field}", 0) for field in ("current", "peak", "allocated", "freed")]
            reference = reference or values
            cells = " | ".join(fmt(v, r) for v, r in zip(values, reference, strict=True))
            lines.append(f" {label:<21} | {cells} ")
    for key, name in (("oversize_allocations", "Oversize allocations"), ("oversize_segments", "Oversize segments")):
        lines.append("-" * 75)
        values = [stats.get(f"{key}.{field}", 0) for field in ("current", "peak", "allocated", "freed")]
        lines.append(f" {name:<21} | " + " | ".join(_format_count(v, v) for v in values) + " ")
    lines.append("-" * 75)
    lines.append(f" HBM of the core: {format_bytes(total)}, free {format_bytes(free)}".ljust(75))
    lines.append("=" * 75)
    return "|" + "|\n|".join(lines) + "|\n"
