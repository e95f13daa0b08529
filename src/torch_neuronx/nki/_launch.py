"""``@nki.jit`` kernels, their launch grid, ``nki.simulate``, and what a launch reports.

A launch binds the arguments (torch tensors — CPU, ``neuron`` or fake — and
NumPy arrays become ``shared_hbm`` tensors over the same memory; other values
pass through), runs the kernel function once per program of the grid in
row-major order, checks that what it returns lives in ``shared_hbm``, and
converts it back: torch tensors on the arguments' device, NumPy arrays for
NumPy arguments, the argument itself when the kernel returns one it wrote.
Under fake tensors (``torch.compile``'s tracing) the same code runs without
computing: shapes, rules and the capacity ledger only.

Every launch leaves a :class:`LaunchReport` (``nki.last_report()``):
instruction counts, the SBUF/PSUM high-water marks against the target's
budget, and the wall time.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from torch_neuronx.nki import _dtypes
from torch_neuronx.nki._errors import NkiValidationError
from torch_neuronx.nki._host import alias_device_tensor, numpy_to_torch, torch_to_numpy
from torch_neuronx.nki._target import Target, current_target
from torch_neuronx.nki._tensor import Launch, MemoryRegion, NkiTensor, Storage, current_or_none, push

log = logging.getLogger("torch_neuronx.nki")
CAPACITY_ENV = "TORCH_NEURONX_NKI_CAPACITY"


@dataclass
class LaunchReport:
    """What one launch did: instruction counts and the on-chip high-water marks against the budget."""

    kernel: str
    grid: tuple[int, ...]
    target: str
    instructions: dict[str, int]
    sbuf_peak_bytes: int  # per partition
    sbuf_budget_bytes: int  # per partition
    psum_peak_banks: int
    psum_banks: int
    seconds: float
    device: str  # "neuron", "cpu", "numpy" or "fake"
    capacity_mode: str = "warn"
    warnings: list[str] = field(default_factory=list)
    allocations: dict[str, int] = field(default_factory=dict)  # nl.ndarray / nl.full calls (not instructions)

    @property
    def total_instructions(self) -> int:
        return sum(self.instructions.values())

    @property
    def over_budget(self) -> bool:
        return self.sbuf_peak_bytes > self.sbuf_budget_bytes or self.psum_peak_banks > self.psum_banks

    def __str__(self) -> str:
        return (f"{self.kernel}{list(self.grid) if self.grid else ''} on {self.target}: "
                f"{self.total_instructions} instructions, SBUF peak {self.sbuf_peak_bytes} of "
                f"{self.sbuf_budget_bytes} bytes/partition, PSUM peak {self.psum_peak_banks} of {self.psum_banks} "
                f"banks, {self.seconds * 1e3:.1f} ms")


_last: list[LaunchReport] = []


def last_report() -> LaunchReport | None:
    """The report of the most recent launch in this process (None before the first)."""
    return _last[-1] if _last else None


def _capacity_mode(option: str | None) -> str:
    from torch_neuronx.runtime import env

    mode = (option or env.get(CAPACITY_ENV) or "warn").strip().lower()
    if mode not in ("warn", "strict", "off"):
        raise ValueError(f"{CAPACITY_ENV}={mode!r}: use warn (default), strict or off")
    return mode


def _grid(value: Any) -> tuple[int, ...]:
    items = value if isinstance(value, tuple) else (value,)
    try:
        grid = tuple(int(g) for g in items)
    except (TypeError, ValueError):
        raise ValueError(f"an NKI launch grid is an int or a tuple of positive ints, got {value!r}") from None
    if not grid or any(g <= 0 for g in grid) or any(isinstance(g, bool) for g in items):
        raise ValueError(f"an NKI launch grid is an int or a tuple of positive ints, got {value!r}")
    return grid


class Kernel:
    """An NKI kernel: call it (``kernel(*args)``) or launch a grid of programs (``kernel[4, 2](*args)``)."""

    def __init__(self, fn: Callable[..., Any], grid: tuple[int, ...] = (), **options: Any) -> None:
        if not callable(fn):
            raise TypeError(f"nki.jit decorates a function, got {fn!r}")
        self.fn = fn
        self.grid = grid
        self.options = options
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    @property
    def name(self) -> str:
        return getattr(self.fn, "__name__", repr(self.fn))

    def __getitem__(self, grid: Any) -> Kernel:
        return Kernel(self.fn, _grid(grid), **self.options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if current_or_none() is not None:  # a kernel calling a kernel: one program, inlined
            return self.fn(*args, **kwargs)
        return _launch_eagerly(self, args, kwargs)

    def __repr__(self) -> str:
        return f"nki.jit({self.name}{', grid=' + str(self.grid) if self.grid else ''})"


def jit(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Make `fn` an NKI kernel (``@nki.jit`` or ``@nki.jit(platform_target="trn2", capacity="strict")``).

    Options: ``platform_target`` (trn1, trn2, trn3; else NEURON_PLATFORM_TARGET_OVERRIDE, else the emulated
    instance), ``capacity`` (warn, strict, off; else TORCH_NEURONX_NKI_CAPACITY). Others (``mode=``) are accepted
    and ignored: every mode runs on this interpreter.
    """
    if fn is None:
        return lambda f: jit(f, **options)
    if isinstance(fn, Kernel):
        return Kernel(fn.fn, fn.grid, **{**fn.options, **options})
    return Kernel(fn, **options)


def simulate(kernel: Any) -> Kernel:
    """``nki.simulate(kernel)(*arrays)``: run on the host; NumPy in, NumPy out (torch in, torch out)."""
    return kernel if isinstance(kernel, Kernel) else Kernel(kernel)


def simulate_kernel(kernel: Any, *args: Any, **kwargs: Any) -> Any:
    """The older spelling: ``nki.simulate_kernel(kernel, *arrays)``."""
    return simulate(kernel)(*args, **kwargs)


# --------------------------------------------------------------------------------------------- arguments


class _Binder:
    """Turns kernel arguments into shared_hbm tensors and results back into the caller's types."""

    def __init__(self, launch: Launch) -> None:
        self.launch = launch
        self.by_storage: dict[int, Any] = {}  # id(storage) -> the caller's tensor/array
        self.copy_back: list[tuple[torch.Tensor, Any]] = []
        self.numpy = False

    def wrap(self, value: Any, name: str) -> Any:
        if isinstance(value, torch.Tensor):
            return self._tensor(value, name)
        if type(value).__module__ == "numpy" and type(value).__name__ == "ndarray":
            self.numpy = True
            try:
                host = numpy_to_torch(value)
                copied = False
            except (ValueError, RuntimeError):  # negative strides: work on a copy, write it back after
                import numpy as np

                host = numpy_to_torch(np.ascontiguousarray(value))
                copied = True
            t = self._tensor(host, name, caller=value)
            if copied:
                self.copy_back.append((host, value))
            return t
        if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) or type(v).__name__ == "ndarray"
                                                    for v in value):
            return type(value)(self.wrap(v, f"{name}[{i}]") for i, v in enumerate(value))
        return value

    def _tensor(self, t: torch.Tensor, name: str, caller: Any = None) -> NkiTensor:
        try:
            dt = _dtypes.canonical(t.dtype)
        except _dtypes.DTypeError:
            raise NkiValidationError(
                "err-unsupported-dtype", "kernel launch", f"argument {name!r} is {t.dtype}, which no NeuronCore "
                "tile holds", operand=name, value=str(t.dtype),
                hint="cast it before the launch (float64 -> .float(), int64 -> .int())") from None
        original = t
        t = t.detach()
        shape = tuple(t.shape) or (1,)
        strides = tuple(t.stride()) or (1,)
        if not self.launch.compute:
            extent = t.storage_offset() + sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) + 1
            storage = Storage(None, dt, MemoryRegion.shared_hbm, name, (max(extent, 1),), owner=t)
        else:
            flat = alias_device_tensor(t)
            storage = Storage(flat, dt, MemoryRegion.shared_hbm, name, (max(flat.numel(), 1),), owner=t)
            if flat.numel() == 0:
                storage.numel = 0
        self.by_storage[id(storage)] = caller if caller is not None else original
        return NkiTensor(storage, shape, strides, t.storage_offset())

    def unwrap(self, value: Any, where: str = "return value") -> Any:
        if isinstance(value, NkiTensor):
            return self._result(value, where)
        if isinstance(value, (list, tuple)):
            return type(value)(self.unwrap(v, f"{where}[{i}]") for i, v in enumerate(value))
        if isinstance(value, dict):
            return {k: self.unwrap(v, f"{where}[{k!r}]") for k, v in value.items()}
        return value

    def _result(self, t: NkiTensor, where: str) -> Any:
        if t.buffer is not MemoryRegion.shared_hbm:
            raise NkiValidationError(
                "err-output-not-in-shared-hbm", "kernel return", f"{where} {t.name!r} is in {t.buffer.value}",
                operand=where, value=t.buffer.value, limit="shared_hbm",
                hint="allocate outputs with nl.ndarray(shape, dtype, buffer=nl.shared_hbm) and store into them")
        st = t.storage
        caller = self.by_storage.get(id(st))
        if caller is not None:
            whole = t.shape == tuple(getattr(caller, "shape", ())) and t.offset == _offset(caller)
            if whole or not isinstance(caller, torch.Tensor):
                return caller
            return caller.as_strided(t.shape, t.strides, t.offset)
        dtype = _dtypes.torch_dtype(st.dtype)
        device = self.launch.device or torch.device("cpu")
        if st.data is None:  # shapes only: a fake tensor when the caller traces
            return torch.empty_strided(t.shape, t.strides, dtype=dtype, device=device)
        if isinstance(st.owner, torch.Tensor):  # allocated on the device: a view of it
            out = st.owner.as_strided(t.shape, t.strides, t.offset)
        else:
            out = st.data.as_strided(t.shape, t.strides, t.offset)
        return torch_to_numpy(out) if self.numpy else out


def _offset(value: Any) -> int:
    return value.storage_offset() if isinstance(value, torch.Tensor) else 0


def _framework(values: list[Any]) -> tuple[bool, torch.device | None, str]:
    """(compute?, device for outputs, label) from the arguments."""
    from torch._subclasses.fake_tensor import FakeTensor

    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    for v in values:
        if isinstance(v, (list, tuple)):
            tensors += [x for x in v if isinstance(x, torch.Tensor)]
    fake = any(isinstance(t, FakeTensor) or t.is_meta for t in tensors)
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise ValueError(f"NKI kernel arguments are on different devices {sorted(str(d) for d in devices)}: "
                         "move them to one device (a kernel runs on one NeuronCore)")
    device = next(iter(devices)) if devices else None
    if fake:
        return False, device, "fake"
    if device is None:
        return True, None, "numpy" if values else "cpu"
    return True, device, device.type


def _launch_eagerly(kernel: Kernel, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A bare kernel call inside torch.compile'd code runs eagerly (a graph break); nki_op / wrap_nki avoid it."""
    return launch(kernel, args, kwargs)


_launch_eagerly = torch.compiler.disable(_launch_eagerly, reason="an NKI kernel launch outside nki_op / wrap_nki")


def launch(kernel: Kernel, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    options = kernel.options
    target: Target = current_target(options.get("platform_target"))
    capacity = _capacity_mode(options.get("capacity"))
    compute, device, label = _framework(list(args) + list(kwargs.values()))
    if label == "numpy" and not any(type(v).__name__ == "ndarray" for v in list(args) + list(kwargs.values())):
        label = "cpu"
    state = Launch(kernel.name, kernel.grid, target, compute=compute, capacity=capacity, device=device)
    previous = push(state)
    # Tiles are small (at most 128 x 512 per instruction): intra-op threads only add synchronisation, which on
    # a loaded host costs more than the work (20x measured on 2 busy cores). One thread while the kernel runs.
    threads = torch.get_num_threads()
    if threads > 1 and previous is None:
        torch.set_num_threads(1)
    start = time.perf_counter()
    profiled = label in ("neuron", "cpu") and torch._C._autograd._profiler_enabled()
    record = torch.profiler.record_function(f"nki::{kernel.name}") if profiled else None
    try:
        if record is not None:
            record.__enter__()
        binder = _Binder(state)
        try:
            bound = inspect.signature(kernel.fn).bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"NKI kernel {kernel.name}: {exc}") from None
        call_args = []
        for pname, value in bound.arguments.items():
            call_args.append((pname, binder.wrap(value, pname)))
        parameters = inspect.signature(kernel.fn).parameters
        pos: list[Any] = []
        kw: dict[str, Any] = {}
        for pname, value in call_args:
            kind = parameters[pname].kind
            if kind is inspect.Parameter.VAR_POSITIONAL:
                pos.extend(value)
            elif kind is inspect.Parameter.VAR_KEYWORD:
                kw.update(value)
            elif kind is inspect.Parameter.KEYWORD_ONLY:
                kw[pname] = value
            else:
                pos.append(value)
        result = None
        programs = itertools.product(*(range(g) for g in kernel.grid)) if kernel.grid else [()]
        for pid in programs:
            state.program_id = tuple(pid)
            state.shared_index = 0
            result = kernel.fn(*pos, **kw)
        out = binder.unwrap(result)
        for host, array in binder.copy_back:
            array[...] = torch_to_numpy(host)
    finally:
        push(previous)
        if threads > 1 and previous is None:
            torch.set_num_threads(threads)
        state.ledger.closed = True
        if record is not None:
            record.__exit__(None, None, None)
    ledger = state.ledger
    report = LaunchReport(kernel.name, kernel.grid, target.name, dict(state.instructions), ledger.sbuf_peak,
                          target.sbuf_partition_bytes, ledger.psum_peak, target.psum_banks,
                          time.perf_counter() - start, label, capacity, sorted(ledger.warned),
                          dict(state.allocations))
    _last[:] = [report]
    log.debug("nki launch: %s", report)
    hook = getattr(sys.modules.get("torch_neuronx.tools.nki"), "_record_launch", None)
    if hook is not None and label == "neuron":
        hook(report)
    return out


__all__ = ["Kernel", "LaunchReport", "jit", "last_report", "simulate", "simulate_kernel"]
