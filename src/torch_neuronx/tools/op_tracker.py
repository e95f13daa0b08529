"""Which ATen ops ran on the device, and which fell back to the CPU.

Every op that reaches the device's generic path is counted in C++ (one
relaxed atomic increment). An op "falls back" where TorchNeuron would run it
on the CPU rather than on a NeuronCore (docs/torchneuron.md):

* the ops TorchNeuron's CPU-fallback table lists (linear-algebra
  decompositions: QR, SVD, eigh, Cholesky, LU, LDL, inverse, determinants,
  triangular solves);
* ops on float64 (Trainium has no FP64 units) or complex tensors (NeuronCores
  take no complex dtypes: compiler error NCC_EVRF004), conversions to and from
  them on the device included.

Each warns once, as TorchNeuron's fallbacks do;
``TORCH_NEURONX_FORBID_CPU_FALLBACK=1`` turns them into errors. Reduced-
precision ops that the host has no kernel for (Trainium computes them on a
core) run in float32 and are cast back: that is the emulator's detour, not a
fallback, and :attr:`OpRecord.widened` counts it. The
TorchNeuron API, :func:`get_fallback_ops`, :func:`get_executed_ops` and
:func:`clear_op_tracking`, lists op names; :func:`records` has the counts.
Ops with a kernel of their own (allocation, copies, views) are not counted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import NamedTuple

from torch_neuronx import _C
from torch_neuronx.runtime import env
from torch_neuronx.tools import nki


class OpRecord(NamedTuple):
    name: str  # e.g. "aten::add.Tensor"
    executed: int  # calls that ran on the device
    fallback: int  # calls that fell back to a CPU computation
    widened: int = 0  # of the executed calls, those the emulator ran in float32 (no host kernel for the dtype)


def records() -> list[OpRecord]:
    """Counts since start (or the last reset), most called first."""
    out = [OpRecord(name, total - fb, fb, wide) for name, total, fb, wide in _C._op_counts()]
    out += [OpRecord(name, count, 0) for name, count in nki.launch_counts().items()]  # NKI kernel launches
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
    nki.reset_launch_counts()


def get_fallback_ops() -> list[str]:
    """Names of the ops that ran on the CPU instead of a NeuronCore since the last clear (TorchNeuron's API)."""
    return [r.name for r in records() if r.fallback]


def get_executed_ops() -> list[str]:
    """Names of the ops that ran on a NeuronCore since the last clear (TorchNeuron's API)."""
    return [r.name for r in records() if r.executed]


def clear_op_tracking() -> None:
    """Forget the ops :func:`get_fallback_ops` and :func:`get_executed_ops` list (TorchNeuron's API)."""
    reset()


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
    """TORCH_NEURONX_FORBID_CPU_FALLBACK=1 forbids CPU fallbacks (they raise instead);
    TORCH_NEURONX_ENABLE_STACK_TRACE=1 keeps the Python stack of each op's first fallback."""
    _C._set_fallback_allowed(not env.get("TORCH_NEURONX_FORBID_CPU_FALLBACK"))
    _C._set_fallback_stacks(env.get("TORCH_NEURONX_ENABLE_STACK_TRACE"))


def fallback_stacks() -> dict[str, str]:
    """Op name -> the Python stack of its first CPU fallback (recorded with TORCH_NEURONX_ENABLE_STACK_TRACE=1)."""
    return dict(_C._fallback_stacks())


def allow_fallback(allowed: bool) -> None:
    """Allow or forbid CPU fallbacks in this process (overrides the environment variable)."""
    _C._set_fallback_allowed(allowed)
