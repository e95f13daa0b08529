"""Which ATen ops ran on the device, and which fell back to the CPU.

Every op that reaches the device's generic path is counted in C++ (one
relaxed atomic increment). An op "falls back" when the device cannot run it
as is and the host computes it another way: today, a reduced-precision op
whose host kernel lacks that dtype runs in float32 and is cast back.
``TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=1`` turns such fallbacks into errors.

Ops with a kernel of their own (allocation, copies, views) are not counted.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import NamedTuple

from torch_neuronx import _C


class OpRecord(NamedTuple):
    name: str  # e.g. "aten::add.Tensor"
    executed: int  # calls that ran on the device
    fallback: int  # calls that fell back to a CPU computation


def records() -> list[OpRecord]:
    """Counts since start (or the last reset), most called first."""
    out = [OpRecord(name, total - fb, fb) for name, total, fb in _C._op_counts()]
    return sorted(out, key=lambda r: (-(r.executed + r.fallback), r.name))


def executed_ops() -> dict[str, int]:
    """Op name -> calls that ran on the device."""
    return {r.name: r.executed for r in records() if r.executed}


def fallback_ops() -> dict[str, int]:
    """Op name -> calls that fell back to the CPU."""
    return {r.name: r.fallback for r in records() if r.fallback}


def reset() -> None:
    """Zero all counts."""
    _C._reset_op_counts()


@contextlib.contextmanager
def track() -> Iterator[list[OpRecord]]:
    """Count only the ops run inside the block: ``with track() as ops: ...; print(ops)``."""
    reset()
    result: list[OpRecord] = []
    try:
        yield result
    finally:
        result.extend(records())


def report() -> str:
    """A readable table of the counts."""
    rows = records()
    if not rows:
        return "no neuron ops recorded"
    width = max(len(r.name) for r in rows)
    lines = [f"{'op':<{width}}  {'device':>8}  {'fallback':>8}"]
    lines += [f"{r.name:<{width}}  {r.executed:>8}  {r.fallback:>8}" for r in rows]
    lines.append(f"{len(rows)} ops, {sum(r.fallback for r in rows)} fallback calls")
    return "\n".join(lines)


def apply_env() -> None:
    """TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=1 forbids CPU fallbacks (they raise instead)."""
    value = os.environ.get("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "").strip().lower()
    _C._set_fallback_allowed(value not in ("1", "true", "yes", "on"))


def allow_fallback(allowed: bool) -> None:
    """Allow or forbid CPU fallbacks in this process (overrides the environment variable)."""
    _C._set_fallback_allowed(allowed)
