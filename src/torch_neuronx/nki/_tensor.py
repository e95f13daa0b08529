"""NKI tensors on the host: storages, views, the launch context and the on-chip capacity ledger.

Every allocation (``nl.ndarray`` and friends, or a kernel argument) is one
:class:`Storage`: a flat torch CPU tensor in the dtype's storage type, filled
with a sentinel until written. An :class:`NkiTensor` is a view on it — shape,
element strides and offset, exactly what ``.ap([[stride, count], ...])``
describes — so slicing, ``.ap()``, ``reshape`` and ``permute`` copy nothing,
and an instruction reads or writes a whole view with one torch op
(``as_strided``). On-chip storages are laid out partition-major: partition
``p`` of an SBUF/PSUM allocation of shape ``(P, *free)`` starts at element
``p * prod(free)``, which is what a pattern's partition stride means.

Views are checked when they are made: an index, slice or access pattern that
leaves its storage — or, on chip, the allocation's bytes of one partition —
raises ``err-tensor-access-out-of-bound``.

The launch context (one per thread) holds the grid position, the target, the
instruction counts and the :class:`Ledger`: live SBUF bytes per partition and
live PSUM banks, charged when an on-chip storage is created and released at
the end of the compiler-loop iteration that allocated it (``loop_iterations``)
or when the last view of it is dropped, with the high-water mark of the launch.

This module is the bottom of the interpreter: it imports neither ``isa`` nor
``language``; the operations a tensor performs on itself (``t[...] = x``,
``a + b``) are registered here by those modules (``register_operations``).
"""

from __future__ import annotations

import enum
import math
import operator
import threading
import warnings
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from torch_neuronx.nki import _dtypes, _errors
from torch_neuronx.nki._errors import NkiCapacityWarning, NkiValidationError
from torch_neuronx.nki._target import Target


class MemoryRegion(enum.Enum):
    """Memory region constants for NKI tensors (``nl.sbuf``, ``nl.psum``, ``nl.hbm``, ``nl.shared_hbm``)."""

    sbuf = "sbuf"
    psum = "psum"
    private_hbm = "private_hbm"
    shared_hbm = "shared_hbm"


def region(buffer: Any) -> MemoryRegion:
    if isinstance(buffer, MemoryRegion):
        return buffer
    text = str(getattr(buffer, "value", buffer)).lower()
    if text == "hbm":
        return MemoryRegion.private_hbm
    try:
        return MemoryRegion(text)
    except ValueError:
        raise NkiValidationError("err-unsupported-memory", "nl.ndarray", f"unknown buffer {buffer!r}",
                                 operand="buffer", hint="use nl.sbuf, nl.psum, nl.hbm or nl.shared_hbm") from None


_PREFIX = {r: f"{r.value}_" for r in MemoryRegion}  # allocation names (Enum.value is slow on the hot path)
ON_CHIP = (MemoryRegion.sbuf, MemoryRegion.psum)
HBM = (MemoryRegion.private_hbm, MemoryRegion.shared_hbm)


# --------------------------------------------------------------------------------------------- launch context


@dataclass
class Ledger:
    """Live on-chip bytes of one launch and their high-water marks (per partition, as the hardware is sized)."""

    target: Target
    mode: str = "warn"  # "warn", "strict" or "off"
    sbuf_live: int = 0
    psum_live: int = 0  # banks
    sbuf_peak: int = 0
    psum_peak: int = 0
    warned: set[str] = field(default_factory=set)
    closed: bool = False
    scopes: list[list[Charge]] = field(default_factory=list)  # open iterations of compiler loops, innermost last

    def charge(self, kind: MemoryRegion, amount: int, what: Callable[[], str]) -> None:
        """Add `amount` live; `what` names the allocation, called only when it goes over the budget (the message
        costs more than the bookkeeping on the hot path)."""
        if kind is MemoryRegion.sbuf:
            self.sbuf_live += amount
            self.sbuf_peak = max(self.sbuf_peak, self.sbuf_live)
            over = self.sbuf_live > self.target.sbuf_partition_bytes
        else:
            self.psum_live += amount
            self.psum_peak = max(self.psum_peak, self.psum_live)
            over = self.psum_live > self.target.psum_banks
        if not over or self.mode == "off":
            return
        if kind is MemoryRegion.sbuf:
            detail = (f"live SBUF is {self.sbuf_live} bytes per partition after allocating {what()}, over the "
                      f"{self.target.name} budget of {self.target.sbuf_partition_bytes} bytes per partition")
            code = "err-sbuf-capacity-exceeded"
        else:
            detail = (f"{self.psum_live} PSUM banks are live after allocating {what()}, over the "
                      f"{self.target.psum_banks} banks of 2 KiB per partition")
            code = "err-psum-capacity-exceeded"
        hint = ("free tiles sooner (allocate inside the loop that uses them), tile smaller, or lower the "
                "buffering; TORCH_NEURONX_NKI_CAPACITY=warn reports this as a warning")
        if self.mode == "strict":
            raise NkiValidationError(code, "nl.ndarray", detail, operand="buffer",
                                     value=self.sbuf_live if kind is MemoryRegion.sbuf else self.psum_live,
                                     limit=self.target.sbuf_partition_bytes if kind is MemoryRegion.sbuf
                                     else self.target.psum_banks, hint=hint)
        if code not in self.warned:
            self.warned.add(code)
            filename, lineno, _ = _errors.kernel_location()
            warnings.warn_explicit(f"[{code}] {detail}. The compiler may reuse or spill memory, but this kernel "
                                   "does not fit as written; TORCH_NEURONX_NKI_CAPACITY=strict makes it an error",
                                   NkiCapacityWarning, filename, lineno)

    def release(self, kind: MemoryRegion, amount: int) -> None:
        if kind is MemoryRegion.sbuf:
            self.sbuf_live -= amount
        else:
            self.psum_live -= amount

    def open_scope(self) -> list[Charge]:
        """Start one iteration of a compiler loop: the tiles it allocates are live for that iteration only."""
        scope: list[Charge] = []
        self.scopes.append(scope)
        return scope

    def close_scope(self, scope: list[Charge]) -> None:
        """End the iteration: release what it allocated, whatever Python still references (the loop variable)."""
        if self.scopes and self.scopes[-1] is scope:
            self.scopes.pop()
        elif scope in self.scopes:
            self.scopes.remove(scope)
        for item in scope:
            item.release()


class Charge:
    """One on-chip allocation's charge to the ledger, released once: at the end of the compiler-loop iteration
    that allocated it, or when the kernel drops its last reference to it (straight-line code, unrolled loops)."""

    __slots__ = ("ledger", "kind", "amount", "released", "watch")

    def __init__(self, ledger: Ledger, kind: MemoryRegion, amount: int) -> None:
        self.ledger, self.kind, self.amount, self.released = ledger, kind, amount, False
        self.watch: Any = None

    def on_drop(self, _ref: Any) -> None:
        self.release()

    def release(self) -> None:
        if not self.released and not self.ledger.closed:
            self.released = True
            self.ledger.release(self.kind, self.amount)


class Launch:
    """State of the kernel launch running on this thread."""

    def __init__(self, kernel_name: str, grid: tuple[int, ...], target: Target, *, compute: bool,
                 capacity: str, device: torch.device | None) -> None:
        self.kernel_name = kernel_name
        self.grid = grid
        self.program_id: tuple[int, ...] = tuple(0 for _ in grid)
        self.target = target
        self.compute = compute  # False: shapes, rules and the ledger only (fake tensors under torch.compile)
        self.ledger = Ledger(target, capacity)
        self.device = device  # where kernel-allocated shared_hbm outputs live (a neuron device, cpu, or None)
        self.instructions: Counter[str] = Counter()  # instructions only (what the engines run)
        self.allocations: Counter[str] = Counter()  # nl.ndarray and friends: memory, no engine time
        self.shared: list[Storage] = []  # shared_hbm allocations, by order, shared by all programs of the grid
        self.shared_index = 0
        self.names: Counter[str] = Counter()
        self.reduce_regs: torch.Tensor | None = None  # the Scalar Engine's per-partition accumulators
        self.vector_regs: torch.Tensor | None = None  # the Vector Engine's accumulators (tensor_scalar_reduce)

    def count(self, instruction: str) -> None:
        self.instructions[instruction] += 1

    def count_allocation(self, what: str) -> None:
        self.allocations[what] += 1

    def fresh_name(self, prefix: str) -> str:
        self.names[prefix] += 1
        return f"{prefix}{self.names[prefix]}"


_state = threading.local()


def current() -> Launch:
    launch = getattr(_state, "launch", None)
    if launch is None:
        raise RuntimeError("NKI language and ISA calls run inside a kernel launch: decorate the function with "
                           "@nki.jit and call it (kernel(*args) or kernel[grid](*args)), or use nki.simulate")
    return launch


def current_or_none() -> Launch | None:
    return getattr(_state, "launch", None)


def current_kernel_name() -> str | None:
    launch = current_or_none()
    return launch.kernel_name if launch else None


_errors.KERNEL_NAME[0] = current_kernel_name  # errors name the kernel without importing this module


def push(launch: Launch | None) -> Launch | None:
    previous = getattr(_state, "launch", None)
    _state.launch = launch
    return previous


# --------------------------------------------------------------------------------------------- storages


class Storage:
    """One allocation: a flat host tensor (None when only shapes are traced) in one memory region."""

    __slots__ = ("data", "dtype", "buffer", "name", "shape", "numel", "partitions", "free", "acc", "owner",
                 "written", "charge", "pending", "acc_full", "init", "__weakref__")

    def __init__(self, data: torch.Tensor | None, dtype: str, buffer: MemoryRegion, name: str,
                 shape: tuple[int, ...], owner: Any = None) -> None:
        self.data = data
        self.dtype = dtype
        self.buffer = buffer
        self.name = name
        self.shape = shape
        self.numel = math.prod(shape)
        self.partitions = shape[0] if shape else 1
        self.free = self.numel // self.partitions if self.partitions else 0
        self.acc: torch.Tensor | None = None  # PSUM: which elements a matmul wrote (accumulation groups)
        self.acc_full = False  # PSUM: every element of acc is set (a whole-tile matmul group is open)
        self.init: torch.Tensor | None = None  # PSUM on trn3: which elements any instruction wrote (nc_matmul)
        self.owner = owner  # the torch tensor / numpy array a kernel argument aliases
        self.written = False
        self.charge: Charge | None = None  # the ledger charge of an on-chip allocation
        self.pending: float | int | bool | None = None  # a sentinel not yet filled in (filled on first partial use)


def int_operand(ins: str, operand: str, value: Any) -> int:
    """A compile-time integer operand (a Python or NumPy int): 0.5, 32.0 or "32" is refused, not truncated or
    parsed, as shapes are (docs/nki.md, err-invalid-operand)."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise NkiValidationError("err-invalid-operand", ins, f"{operand} {value!r} is not an integer", operand=operand,
                             value=value, limit="a compile-time integer", hint="pass a Python int")


class ParDim(int):
    """``nl.par_dim(n)``, the older dialect's partition-dimension marker: an int that remembers where it stood."""


def _check_shape(shape: Any, instruction: str) -> tuple[int, ...]:
    if isinstance(shape, int):
        shape = (shape,)
    try:
        dims = tuple(operator.index(s) for s in shape)  # 3.5 or "4" is refused, not truncated
    except TypeError:
        raise NkiValidationError("err-invalid-shape", instruction, f"shape {shape!r} is not a tuple of ints",
                                 operand="shape", hint="every dimension is a Python int") from None
    if not dims or any(d <= 0 for d in dims):
        raise NkiValidationError("err-invalid-shape", instruction, f"shape {dims} needs positive dimensions",
                                 operand="shape", hint="NKI tensors have no zero-size or negative dimensions")
    return dims


def allocate(shape: Any, dtype: Any, buffer: Any = MemoryRegion.sbuf, name: str = "",
             instruction: str = "nl.ndarray", fill: Any = "sentinel") -> NkiTensor:
    """A new tensor in `buffer`, charged to the ledger when on chip (shared_hbm outputs are shared by the grid)."""
    launch = current()
    dims = _check_shape(shape, instruction)
    try:
        dt = _dtypes.canonical(dtype)
    except _dtypes.DTypeError as exc:
        raise NkiValidationError("err-unsupported-dtype", instruction, str(exc), operand="dtype") from None
    where = region(buffer)
    target = launch.target
    if where in ON_CHIP and dims[0] > target.pmax:
        raise NkiValidationError(
            "err-size-of-dimension-exceed-arch-limit", instruction,
            f"partition dimension (shape[0]) of {name or where.value} tensor {dims} is {dims[0]}",
            operand="shape[0]", value=dims[0], limit=f"{target.pmax} partitions (nl.tile_size.pmax)",
            hint="tile the partition dimension in chunks of at most 128 (a Python list of tiles, or a loop)")
    marked = [i for i, d in enumerate(shape) if isinstance(d, ParDim)] if isinstance(shape, (tuple, list)) else []
    if marked and marked[0] != 0:
        raise NkiValidationError(
            "err-unsupported-feature", instruction, f"nl.par_dim at position {marked[0]} of shape {tuple(shape)}: "
            "the older dialect's block dimensions before the partition dimension", operand="shape",
            value=tuple(dims), limit="the partition dimension first (shape[0])",
            hint="allocate one tile per block (a Python list, or a loop), each (partitions, *free)")
    free_bytes = math.prod(dims[1:]) * _dtypes.itemsize(dt)
    if where is MemoryRegion.sbuf and free_bytes > target.sbuf_partition_bytes:
        # AWS: the elements per partition of a tile must not exceed the physical SBUF partition
        # (nl.tile_size.total_available_sbuf_size): one tile that can never fit, refused in every capacity mode
        # and before any host memory is allocated for it
        raise NkiValidationError(
            "err-size-of-dimension-exceed-arch-limit", instruction,
            f"SBUF tensor {dims} of {dt} holds {free_bytes} bytes per partition", operand="shape",
            value=free_bytes, limit=f"{target.sbuf_partition_bytes} bytes per SBUF partition on {target.name}",
            hint="tile the free dimension so one tile fits a partition")
    # NeuronCore-v4 matmuls write up to 8 banks at once (AWS nc_matmul: moving free size 4096 fp32 / 8192 bf16)
    psum_tile_bytes = target.psum_bank_bytes * (target.psum_banks if target.nc_version >= 4 else 1)
    if where is MemoryRegion.psum and free_bytes > psum_tile_bytes:
        raise NkiValidationError(
            "err-psum-tile-exceeds-bank", instruction,
            f"PSUM tensor {dims} of {dt} holds {free_bytes} bytes per partition", operand="shape",
            value=free_bytes, limit=f"{psum_tile_bytes} bytes per partition on {target.name} (one PSUM bank, "
            f"{target.psum_bank_bytes // 4} float32: nl.tile_size.psum_bank_fmax)" if psum_tile_bytes ==
            target.psum_bank_bytes else f"{psum_tile_bytes} bytes per partition on {target.name} (all 8 PSUM banks)",
            hint="split the free dimension into tiles of at most 512 float32 columns")
    if where is MemoryRegion.shared_hbm and launch.shared_index < len(launch.shared):
        # another program of the grid made this output already: all programs share it
        storage = launch.shared[launch.shared_index]
        launch.shared_index += 1
        if storage.shape != dims or storage.dtype != dt:
            raise NkiValidationError(
                "err-spmd-shared-mismatch", instruction,
                f"program {launch.program_id} allocates shared_hbm tensor #{launch.shared_index} as {dims} {dt}, "
                f"another program as {storage.shape} {storage.dtype}", operand="shape",
                hint="every program of a launch grid must allocate the same shared_hbm outputs")
        return NkiTensor.whole(storage)
    label = name or launch.fresh_name(_PREFIX[where])
    data = None
    if launch.compute:
        tdt = _dtypes.torch_dtype(dt)
        numel = math.prod(dims)
        if where is MemoryRegion.shared_hbm and launch.device is not None and launch.device.type != "cpu":
            from torch_neuronx.nki._host import alias_device_tensor

            owner = torch.empty(numel, dtype=tdt, device=launch.device)
            data = alias_device_tensor(owner)
        else:
            owner = None
            try:
                data = torch.empty(numel, dtype=tdt)
            except (RuntimeError, MemoryError):  # an HBM tensor larger than this host can hold
                raise NkiValidationError(
                    "err-out-of-memory", instruction, f"{where.value} tensor {dims} of {dt} "
                    f"({numel * _dtypes.itemsize(dt)} bytes) cannot be allocated on this host", operand="shape",
                    value=numel * _dtypes.itemsize(dt), hint="allocate smaller tensors") from None
        if fill == "sentinel" and where in ON_CHIP:
            pending = _dtypes.sentinel(dt)  # filled lazily: most tiles are overwritten whole before any read
        elif fill == "sentinel":
            data.fill_(_dtypes.sentinel(dt))
        elif fill is not None:
            data.fill_(fill)
        storage = Storage(data, dt, where, label, dims, owner=owner)
        if fill == "sentinel" and where in ON_CHIP:
            storage.pending = pending
    else:
        storage = Storage(None, dt, where, label, dims)
    if where in ON_CHIP:
        if where is MemoryRegion.sbuf:
            amount = free_bytes
        else:
            amount = max(1, -(-free_bytes // target.psum_bank_bytes))
            if launch.compute:
                storage.acc = torch.zeros(storage.numel, dtype=torch.bool)
                if target.nc_version >= 4:  # v4 may accumulate onto a memset (AWS nc_matmul's v2/v3 note)
                    storage.init = torch.zeros(storage.numel, dtype=torch.bool)
        ledger = launch.ledger
        ledger.charge(where, amount, lambda: f"{label} {dims} {dt}")
        charge = Charge(ledger, where, amount)
        if ledger.scopes:
            ledger.scopes[-1].append(charge)
        # released when the storage goes (reference counting, no cycle): the storage holds the charge, the charge
        # holds a weak reference to the storage whose callback releases it
        charge.watch = weakref.ref(storage, charge.on_drop)
        storage.charge = charge
    if where is MemoryRegion.shared_hbm:
        launch.shared.append(storage)
        launch.shared_index += 1
    return NkiTensor.whole(storage)


def loop_iterations(values: Iterable[int]) -> Iterator[int]:
    """The iterations of a compiler loop (``nl.affine_range`` and friends), each one a ledger scope: the NKI compiler
    allocates a tile declared in a loop body once per iteration, live for that iteration."""
    launch = current_or_none()
    if launch is None:
        yield from values
        return
    ledger = launch.ledger
    for value in values:
        scope = ledger.open_scope()
        try:
            yield value
        finally:
            ledger.close_scope(scope)


# --------------------------------------------------------------------------------------------- views


# The operations a tensor performs on itself (``t[...] = x`` copies, ``a + b`` adds) are instructions, which sit
# above this module: isa.py and language.py register them here when they load, so this module imports neither.
_OPERATIONS: dict[str, Any] = {}


def register_operations(**functions: Any) -> None:
    """Called by the instruction modules at import: name -> instruction or nl operator."""
    _OPERATIONS.update(functions)


def operation(name: str) -> Any:
    fn = _OPERATIONS.get(name)
    if fn is None:  # only reachable if a tensor exists without torch_neuronx.nki loaded, i.e. never in a launch
        raise RuntimeError(f"NKI operation {name!r} is not registered: import torch_neuronx.nki first")
    return fn


class DynamicSlice:
    """``nl.ds(start, size)``: `size` elements from `start`."""

    __slots__ = ("start", "size")

    def __init__(self, start: int, size: int) -> None:
        self.start, self.size = int_operand("nl.ds", "start", start), int_operand("nl.ds", "size", size)

    def __repr__(self) -> str:
        return f"nl.ds({self.start}, {self.size})"


def _oob(instruction: str, what: str, detail: str, operand: str | None = None) -> NkiValidationError:
    return NkiValidationError("err-tensor-access-out-of-bound", instruction, f"{what}: {detail}", operand=operand,
                              hint="keep every index, slice and access pattern inside the tensor's shape")


class NkiTensor:
    """A view of an NKI storage: ``shape``, element ``strides`` and ``offset``, ``dtype``, ``buffer``."""

    __slots__ = ("storage", "shape", "strides", "offset", "gather", "free_size", "dynamic")

    def __init__(self, storage: Storage, shape: tuple[int, ...], strides: tuple[int, ...], offset: int,
                 gather: Gather | None = None, dynamic: tuple[tuple[Any, int], ...] = ()) -> None:
        self.storage = storage
        self.shape = tuple(int(s) for s in shape)
        self.strides = tuple(int(s) for s in strides)
        self.offset = int(offset)  # the static part of the offset
        self.gather = gather  # the vector-offset (gather/scatter) indices of an .ap(vector_offset=) view
        # runtime offsets: (register or 1x1 tile, element stride) pairs, read when an instruction uses the view
        # (AWS: dma_copy's scalar_offset is "dynamic row selection at runtime"; NkiTensor.select's index "is
        # resolved at runtime"), so a register moved or an index tile reloaded after the view was built counts
        self.dynamic = dynamic
        self.free_size = math.prod(self.shape[1:]) if self.shape else 1  # elements per partition

    @classmethod
    def whole(cls, storage: Storage) -> NkiTensor:
        strides, acc = [], 1
        for d in reversed(storage.shape):
            strides.append(acc)
            acc *= d
        return cls(storage, storage.shape, tuple(reversed(strides)), 0)

    # ---- attributes of the NKI API
    @property
    def dtype(self) -> str:
        return self.storage.dtype

    @property
    def buffer(self) -> MemoryRegion:
        return self.storage.buffer

    @property
    def name(self) -> str:
        return self.storage.name

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def on_chip(self) -> bool:
        return self.storage.buffer in ON_CHIP

    def __repr__(self) -> str:
        return f"NkiTensor({self.name!r}, shape={self.shape}, dtype={self.dtype}, buffer={self.buffer.value})"

    def __bool__(self) -> bool:
        """``assert nl.equal(a, b)`` (the API reference's examples): true when every element is non-zero. Without this,
        Python would take a tile's truth from ``len()``, so such an assertion could never fail. True while only
        shapes are traced."""
        if self.storage.data is None:
            return True
        return bool(read(self).ne(0).all())

    def __len__(self) -> int:
        return self.shape[0]

    def is_indirect(self) -> bool:
        return self.gather is not None

    def indirect(self, index: Any, num_elem: int | None = None) -> NkiTensor:
        """NeuronCore-v4 tensor indirection (``.indirect(index)``): not emulated, said so at the call."""
        raise NkiValidationError(
            "err-unsupported-feature", ".indirect()", "tensor indirection views (NeuronCore-v4 compute-engine "
            "gather/scatter) are not emulated", operand="index",
            hint="gather through the DMA with .ap(pattern, vector_offset=idx, indirect_dim=0) and nisa.dma_copy")

    def vector_select(self, dim: int, vector_offset: Any) -> NkiTensor:
        """Per-partition indirect addressing: not emulated, said so at the call."""
        raise NkiValidationError(
            "err-unsupported-feature", ".vector_select()", "per-partition vector_select views are not emulated",
            operand="vector_offset", hint="use .ap(pattern, vector_offset=idx, indirect_dim=0) on an HBM tensor")

    def get_pattern(self) -> list[list[int]]:
        return [[s, n] for s, n in zip(self.strides, self.shape, strict=True)]

    def is_contiguous(self) -> bool:
        expected = 1
        dims = list(zip(self.shape, self.strides, strict=True))
        if self.on_chip:
            dims = dims[1:]
        for n, s in reversed(dims):
            if n != 1 and s != expected:
                return False
            expected *= n
        return True

    # ---- views
    def _view(self, shape: Sequence[int], strides: Sequence[int], offset: int, what: str,
              gather: Gather | None = None) -> NkiTensor:
        view = NkiTensor(self.storage, tuple(shape), tuple(strides), offset, gather, self.dynamic)
        if not view.dynamic:
            view._check_bounds(what)
        return view

    def _check_bounds(self, what: str, instruction: str = "tensor view") -> None:
        st = self.storage
        if any(n <= 0 for n in self.shape):
            raise _oob(instruction, what, f"the view {self.shape} of {st.name!r} is empty")
        dims = list(zip(self.shape, self.strides, strict=True))
        if self.gather is not None:
            dims = [d for i, d in enumerate(dims) if i != self.gather.dim]
        if st.buffer in ON_CHIP and st.free and self.shape and self.gather is None:
            free = st.free
            p_stride = self.strides[0]
            if self.shape[0] > 1 and p_stride % free != 0:
                raise _oob(instruction, what, f"partition stride {p_stride} of a view of {st.name!r} is not a "
                           f"multiple of its {free} elements per partition: a pattern cannot cross partitions")
            first_p = self.offset // free
            last_p = first_p + (self.shape[0] - 1) * p_stride // free
            in_part = self.offset % free
            f_lo = in_part + sum((n - 1) * s for n, s in dims[1:] if s < 0)
            f_hi = in_part + sum((n - 1) * s for n, s in dims[1:] if s > 0)
            if not (0 <= first_p < st.partitions and 0 <= last_p < st.partitions):
                raise _oob(instruction, what, f"partitions {first_p}..{last_p} of {st.name!r}, which has "
                           f"{st.partitions}")
            if f_lo < 0 or f_hi >= free:
                raise _oob(instruction, what, f"free offsets {f_lo}..{f_hi} of {st.name!r}, which holds {free} "
                           "elements per partition")
            return
        lo = self.offset + sum((n - 1) * s for n, s in dims if s < 0)
        hi = self.offset + sum((n - 1) * s for n, s in dims if s > 0)
        if lo < 0 or (self.gather is None and hi >= st.numel):
            raise _oob(instruction, what, f"elements {lo}..{hi} of {st.name!r} {st.shape} (storage of {st.numel} "
                       "elements) are outside it")

    def __getitem__(self, key: Any) -> NkiTensor:
        if not isinstance(key, tuple):
            key = (key,)
        if any(k is Ellipsis for k in key):
            i = next(j for j, k in enumerate(key) if k is Ellipsis)
            fill = self.ndim - (len(key) - 1)
            key = key[:i] + (slice(None),) * fill + key[i + 1:]
        if len(key) > self.ndim:
            raise _oob("tensor indexing", f"{self.name}{list(key)}", f"{len(key)} indices for a "
                       f"{self.ndim}-dimensional tensor")
        shape, strides = [], []
        offset = self.offset
        for dim, (n, s) in enumerate(zip(self.shape, self.strides, strict=True)):
            k = key[dim] if dim < len(key) else slice(None)
            if isinstance(k, NkiTensor):
                raise NkiValidationError("err-unsupported-indexing", "tensor indexing",
                                         "a tensor used as an index", hint="use .ap(..., scalar_offset=) or "
                                         "vector_offset= for dynamic addressing")
            if isinstance(k, DynamicSlice):
                k = slice(k.start, k.start + k.size)
            if isinstance(k, slice):
                start, stop, step = k.start, k.stop, k.step
                step = 1 if step is None else int_operand("tensor indexing", "slice step", step)
                if step <= 0:
                    raise _oob("tensor indexing", self.name, f"slice step {step} on dim {dim}: steps are positive")
                start = 0 if start is None else int_operand("tensor indexing", "slice start", start)
                stop = n if stop is None else int_operand("tensor indexing", "slice stop", stop)
                start = start + n if start < 0 else start
                stop = stop + n if stop < 0 else stop
                if not 0 <= start < stop <= n:
                    raise _oob("tensor indexing", f"{self.name}[...]", f"slice {k.start}:{k.stop} on dim {dim} of "
                               f"size {n}")
                offset += start * s
                shape.append(-(-(stop - start) // step))
                strides.append(s * step)
            else:
                try:
                    index = int(k)
                except (TypeError, ValueError):
                    raise NkiValidationError("err-unsupported-indexing", "tensor indexing",
                                             f"index {k!r} on dim {dim}") from None
                index = index + n if index < 0 else index
                if not 0 <= index < n:
                    raise _oob("tensor indexing", f"{self.name}[...]", f"index {k} on dim {dim} of size {n}")
                offset += index * s
                if dim == 0 and self.on_chip:  # the partition dim stays (size 1)
                    shape.append(1)
                    strides.append(s)
        if not shape:  # an HBM scalar: keep one dimension
            shape, strides = [1], [1]
        if self.on_chip and len(shape) < 2:  # on chip a view keeps a free dimension
            shape, strides = shape + [1], strides + [1]
        return self._view(shape, strides, offset, f"{self.name}[...]")

    def __setitem__(self, key: Any, value: Any) -> None:
        view = self[key]
        if isinstance(value, NkiTensor):
            if view.on_chip and value.on_chip:
                operation("tensor_copy")(dst=view, src=value)
            else:
                operation("dma_copy")(dst=view, src=value)
        else:
            operation("memset")(dst=view, value=value)

    def ap(self, pattern: Sequence[Sequence[int]], offset: int | None = None, scalar_offset: Any = None,
           vector_offset: NkiTensor | None = None, indirect_dim: int = 0, dtype: Any = None) -> NkiTensor:
        """Replace shape and strides with an explicit ``[[stride, count], ...]`` access pattern."""
        try:
            pairs = [(operator.index(s), operator.index(n)) for s, n in pattern]  # 0.5 is refused, not truncated
        except (TypeError, ValueError):
            raise NkiValidationError("err-invalid-access-pattern", ".ap()", f"pattern {pattern!r} is not a list of "
                                     "[stride, count] pairs", operand="pattern") from None
        if not pairs or any(n <= 0 for _, n in pairs):
            raise NkiValidationError("err-invalid-access-pattern", ".ap()", f"pattern {pattern!r} needs positive "
                                     "counts", operand="pattern")
        if dtype is not None and _dtypes.canonical(dtype) != self.dtype:
            raise NkiValidationError("err-unsupported-feature", ".ap()", "dtype reinterpretation through .ap() is "
                                     "not emulated", operand="dtype", hint="use .view(dtype) on a whole tile")
        base = self.offset + (int_operand(".ap()", "offset", offset) if offset is not None else 0)
        strides = [s for s, _ in pairs]
        shape = [n for _, n in pairs]
        if scalar_offset is not None and vector_offset is not None:
            raise NkiValidationError("err-invalid-access-pattern", ".ap()", "scalar_offset and vector_offset are "
                                     "mutually exclusive", operand="scalar_offset")
        if not 0 <= indirect_dim < len(pairs):
            raise _oob(".ap()", self.name, f"indirect_dim {indirect_dim} for a {len(pairs)}-entry pattern")
        dynamic = self.dynamic
        if scalar_offset is not None:
            if _is_static(scalar_offset, ".ap()", "scalar_offset"):
                base += int_operand(".ap()", "scalar_offset", scalar_offset) * strides[indirect_dim]
            else:  # a register or a 1x1 tile: read when the instruction runs
                dynamic = dynamic + ((scalar_offset, strides[indirect_dim]),)
        gather = None
        if vector_offset is not None:
            if self.on_chip:
                raise NkiValidationError("err-unsupported-memory", ".ap()", "vector_offset indexes an HBM tensor",
                                         operand="vector_offset", value=self.buffer.value)
            if not isinstance(vector_offset, NkiTensor):
                raise NkiValidationError("err-invalid-access-pattern", ".ap()", "vector_offset is an on-chip "
                                         f"index tile, not {type(vector_offset).__name__}", operand="vector_offset")
            if vector_offset.buffer is not MemoryRegion.sbuf:
                # AWS dma_copy: the vector_offset indices are "an SBUF tensor of shape (P, 1)"; dma_transpose:
                # "indices tensor must be on SBUF"
                raise NkiValidationError("err-unsupported-memory", ".ap()", f"the vector_offset index tile "
                                         f"{vector_offset.name!r} is in {vector_offset.buffer.value}",
                                         operand="vector_offset", value=vector_offset.buffer.value, limit="sbuf",
                                         hint="load the indices into an SBUF tile first (nisa.dma_copy or nl.load)")
            if vector_offset.size < shape[indirect_dim]:  # more: dma_transpose reads the first ones, see gathered
                raise NkiValidationError("err-invalid-access-pattern", ".ap()",
                                         f"vector_offset has {vector_offset.size} indices for a dimension of "
                                         f"{shape[indirect_dim]}", operand="vector_offset",
                                         value=vector_offset.size, limit=f"{shape[indirect_dim]} indices")
            # the index tile itself, read when the DMA runs (a tile reloaded after .ap() gives the new rows)
            gather = Gather(indirect_dim, None, tuple(vector_offset.shape), source=vector_offset)
        view = NkiTensor(self.storage, tuple(shape), tuple(strides), base, gather, dynamic)
        if not dynamic:
            view._check_bounds(f"{self.name}.ap(...)")
        return view

    def reshape(self, shape: Sequence[int]) -> NkiTensor:
        dims = [int_operand(".reshape()", "shape", d) for d in (shape if not isinstance(shape, int) else (shape,))]
        if -1 in dims:
            known = math.prod(d for d in dims if d != -1)
            dims[dims.index(-1)] = self.size // known if known else 0
        if math.prod(dims) != self.size:
            raise NkiValidationError("err-invalid-shape", ".reshape()", f"{self.shape} ({self.size} elements) "
                                     f"cannot become {tuple(dims)}", operand="shape")
        if self.on_chip and dims[0] != self.shape[0]:
            raise NkiValidationError("err-invalid-shape", ".reshape()", f"the partition dimension {self.shape[0]} "
                                     f"of an on-chip tensor cannot change (to {dims[0]})", operand="shape[0]")
        probe = torch.empty_strided(self.shape, self.strides, device="meta")
        try:
            strides = probe.view(dims).stride()
        except RuntimeError:
            raise NkiValidationError("err-invalid-shape", ".reshape()", f"the layout of this view {self.shape} "
                                     f"(strides {self.strides}) cannot be reshaped without a copy",
                                     operand="shape", hint="copy it into a contiguous tile first") from None
        return self._view(dims, strides, self.offset, f"{self.name}.reshape")

    def permute(self, dims: Sequence[int]) -> NkiTensor:
        dims = [int_operand(".permute()", "dims", d) for d in dims]
        if sorted(dims) != list(range(self.ndim)):
            raise NkiValidationError("err-invalid-shape", ".permute()", f"{dims} is not a permutation of "
                                     f"{list(range(self.ndim))}", operand="dims")
        if self.on_chip and dims[0] != 0:
            raise NkiValidationError("err-invalid-shape", ".permute()", "the partition dimension of an on-chip "
                                     "tensor stays first", operand="dims")
        return self._view([self.shape[d] for d in dims], [self.strides[d] for d in dims], self.offset,
                          f"{self.name}.permute")

    def broadcast(self, dim: int, size: int) -> NkiTensor:
        if self.shape[dim] != 1 or (self.on_chip and dim == 0):
            raise NkiValidationError("err-invalid-shape", ".broadcast()", f"dim {dim} of {self.shape} cannot be "
                                     "broadcast (it must have size 1 and not be the partition dimension)",
                                     operand="dim")
        shape, strides = list(self.shape), list(self.strides)
        shape[dim], strides[dim] = int_operand(".broadcast()", "size", size), 0
        return self._view(shape, strides, self.offset, f"{self.name}.broadcast")

    def expand_dim(self, dim: int) -> NkiTensor:
        if self.on_chip and dim == 0:
            raise NkiValidationError("err-invalid-shape", ".expand_dim()", "cannot insert before the partition "
                                     "dimension", operand="dim")
        shape, strides = list(self.shape), list(self.strides)
        shape.insert(dim, 1)
        strides.insert(dim, strides[dim] * shape[dim + 1] if dim < len(strides) else 1)
        return self._view(shape, strides, self.offset, f"{self.name}.expand_dim")

    def squeeze_dim(self, dim: int) -> NkiTensor:
        if self.shape[dim] != 1 or (self.on_chip and dim == 0):
            raise NkiValidationError("err-invalid-shape", ".squeeze_dim()", f"dim {dim} of {self.shape} cannot be "
                                     "removed", operand="dim")
        shape, strides = list(self.shape), list(self.strides)
        del shape[dim], strides[dim]
        return self._view(shape, strides, self.offset, f"{self.name}.squeeze_dim")

    def reshape_dim(self, dim: int, shape: Sequence[int]) -> NkiTensor:
        return self.reshape(list(self.shape[:dim]) + list(shape) + list(self.shape[dim + 1:]))

    def flatten_dims(self, start_dim: int, end_dim: int) -> NkiTensor:
        merged = math.prod(self.shape[start_dim:end_dim + 1])
        return self.reshape(list(self.shape[:start_dim]) + [merged] + list(self.shape[end_dim + 1:]))

    def slice(self, dim: int, start: int, end: int, step: int = 1) -> NkiTensor:
        key = [slice(None)] * self.ndim
        key[dim] = slice(start, end, step)
        return self[tuple(key)]

    def select(self, dim: int, index: Any) -> NkiTensor:
        key: list[Any] = [slice(None)] * self.ndim
        if _is_static(index, ".select()", "index"):
            key[dim] = operator.index(index)
            return self[tuple(key)]
        # AWS NkiTensor.select: "the index is resolved at runtime": a register or a 1x1 tile, read at each use
        dim = dim + self.ndim if dim < 0 else dim
        key[dim] = 0
        view = self[tuple(key)]
        stride = self.strides[dim]
        limit = self.shape[dim]
        return NkiTensor(view.storage, view.shape, view.strides, view.offset, view.gather,
                         view.dynamic + ((_Bounded(index, limit, f"{self.name}.select({dim})"), stride),))

    # nl-style arithmetic on tiles (the older dialect wrote a + b)
    def _binary(self, other: Any, op: str, reverse: bool = False) -> NkiTensor:
        fn = operation(op)
        return fn(other, self) if reverse else fn(self, other)

    def __add__(self, o: Any) -> NkiTensor:
        return self._binary(o, "add")

    def __radd__(self, o: Any) -> NkiTensor:
        return self._binary(o, "add", True)

    def __sub__(self, o: Any) -> NkiTensor:
        return self._binary(o, "subtract")

    def __rsub__(self, o: Any) -> NkiTensor:
        return self._binary(o, "subtract", True)

    def __mul__(self, o: Any) -> NkiTensor:
        return self._binary(o, "multiply")

    def __rmul__(self, o: Any) -> NkiTensor:
        return self._binary(o, "multiply", True)

    def __truediv__(self, o: Any) -> NkiTensor:
        return self._binary(o, "divide")

    def __neg__(self) -> NkiTensor:
        return operation("negative")(self)

    def view(self, dtype: Any) -> NkiTensor:
        """Reinterpret a whole, contiguous allocation as another dtype (the last dimension scales)."""
        new = _dtypes.canonical(dtype)
        old_size, new_size = _dtypes.itemsize(self.dtype), _dtypes.itemsize(new)
        st = self.storage
        if self.offset != 0 or self.shape != st.shape or not self.is_contiguous():
            raise NkiValidationError("err-unsupported-feature", ".view()", "only a whole contiguous allocation "
                                     "can be reinterpreted here", operand="self")
        last = self.shape[-1] * old_size
        if last % new_size:
            raise NkiValidationError("err-invalid-shape", ".view()", f"last dimension of {last} bytes is not a "
                                     f"multiple of {new_size}", operand="dtype")
        shape = self.shape[:-1] + (last // new_size,)
        if st.data is not None:
            materialize(st)
        data = None if st.data is None else st.data.view(_dtypes.torch_dtype(new))
        twin = Storage(data, new, st.buffer, st.name, shape, owner=st)  # keeps st (and its ledger charge) alive
        return NkiTensor.whole(twin)

    reinterpret_cast = view


def _is_static(value: Any, instruction: str = "", operand: str = "offset") -> bool:
    """Whether an offset is known when the view is built (a Python int), not a register or a tile; anything else
    (0.5, "1") is refused, not truncated when the instruction runs."""
    if isinstance(value, NkiTensor) or (not isinstance(value, int) and hasattr(value, "value")):
        return False  # a 1x1 tile or a register
    int_operand(instruction, operand, value)
    return True


class _Bounded:
    """A runtime index that must stay below `limit` (NkiTensor.select): checked when it is read."""

    __slots__ = ("source", "limit", "what")

    def __init__(self, source: Any, limit: int, what: str) -> None:
        self.source, self.limit, self.what = source, limit, what

    def value(self) -> int:
        index = _scalar_value(self.source)
        if not 0 <= index < self.limit:
            raise _oob("tensor view", self.what, f"runtime index {index} on a dimension of size {self.limit}")
        return index


def resolve(t: NkiTensor) -> NkiTensor:
    """View `t` with its runtime offsets read now (registers, index tiles): what an instruction addresses when it
    runs. Static views come back unchanged; the resolved view is bounds-checked."""
    g = t.gather
    if not t.dynamic and (g is None or g.source is None):
        return t
    offset = t.offset
    for source, stride in t.dynamic:
        offset += (source.value() if isinstance(source, _Bounded) else _scalar_value(source)) * stride
    if g is not None and g.source is not None:
        src = g.source
        values = read(src).to(torch.int64).reshape(-1) if src.storage.data is not None else None
        g = Gather(g.dim, values, g.index_shape, column_major=g.column_major)
    view = NkiTensor(t.storage, t.shape, t.strides, offset, g)
    view._check_bounds(f"{t.name} (runtime offset)")
    return view


def _scalar_value(value: Any) -> int:
    """An int, a register, or a 1x1 tile read now (0 while only shapes are traced)."""
    if isinstance(value, NkiTensor):
        if value.storage.data is None:
            return 0
        return int(read(value).reshape(-1)[0].item())
    reg = getattr(value, "value", None)
    if reg is not None and not isinstance(value, int):
        return int(reg)
    return int(value)


@dataclass(frozen=True)
class Gather:
    """The indices of a vector-offset view: which dimension they replace, the index tile they are read from when
    the instruction runs (`source`), their values once read (None before, and while tracing shapes), the shape of
    the index tile, and whether they are flattened column-major (the DMA's gather-transpose) or row-major."""

    dim: int
    values: torch.Tensor | None
    index_shape: tuple[int, ...]
    source: Any = None
    column_major: bool = False

    def flat(self) -> torch.Tensor:
        assert self.values is not None
        values = self.values.reshape(self.index_shape[0], -1)
        return (values.T if self.column_major else values).reshape(-1)


def column_major_gather(t: NkiTensor) -> NkiTensor:
    """`t` with its vector-offset indices flattened column-major, as the DMA's gather-transpose reads them."""
    g = t.gather
    if g is None:
        return t
    return NkiTensor(t.storage, t.shape, t.strides, t.offset,
                     Gather(g.dim, g.values, g.index_shape, g.source, column_major=True), t.dynamic)


def in_bounds(t: NkiTensor) -> torch.Tensor:
    """Per element of resolved indirect view `t`: whether its vector-offset index lands inside the tensor."""
    index = _flat_indices(t)
    return ((index >= 0) & (index < t.storage.numel)).expand(t.shape)


def _flat_indices(t: NkiTensor) -> torch.Tensor:
    assert t.gather is not None
    dim, indices = t.gather.dim, t.gather.flat()
    indices = indices[:t.shape[dim]]  # AWS dma_transpose: indices.T.flatten()[:src.shape[0]] (others: as many)
    index = torch.full((), t.offset, dtype=torch.int64)
    for d, (n, s) in enumerate(zip(t.shape, t.strides, strict=True)):
        pos = indices if d == dim else torch.arange(n, dtype=torch.int64)
        view = [1] * t.ndim
        view[d] = n
        index = index + (pos * s).reshape(view)
    return index


def materialize(st: Storage) -> None:
    """Fill in a new allocation's sentinel before anything reads it or writes part of it."""
    if st.pending is not None:
        assert st.data is not None
        st.data.fill_(st.pending)
        st.pending = None


def prepare_write(t: NkiTensor) -> None:
    """Before a write to view `t`: a write that covers the whole allocation needs no sentinel first."""
    st = t.storage
    if st.pending is None:
        return
    if covers(t):
        st.pending = None
    else:
        materialize(st)


def covers(t: NkiTensor) -> bool:
    """Whether view `t` is its whole allocation, element for element in order."""
    return (t.gather is None and not t.dynamic and t.offset == 0 and t.size == t.storage.numel
            and t.strides == _contiguous(t.shape))


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def read(t: NkiTensor, *, skip_oob: bool = False) -> torch.Tensor:
    """The values of view `t` (a torch view when possible; a gather for indirect views, whose out-of-bounds
    elements read as 0 with `skip_oob`: the caller keeps its destination there, see :func:`in_bounds`)."""
    data = t.storage.data
    assert data is not None
    if t.storage.pending is not None:
        materialize(t.storage)
    if t.dynamic or t.gather is not None:
        t = resolve(t)
    if t.gather is not None:
        index = _flat_indices(t)
        ok = (index >= 0) & (index < data.numel())
        if not bool(ok.all()):
            if not skip_oob:
                raise _oob("dma", t.name, "an indirect (vector_offset) index points outside the tensor")
            return torch.where(ok, data[torch.where(ok, index, 0)], torch.zeros((), dtype=data.dtype))
        return data[index]
    return data.as_strided(t.shape, t.strides, t.offset)


def write(t: NkiTensor, values: torch.Tensor, *, skip_oob: bool = False) -> None:
    """Store `values` (shaped like `t`, any dtype) into view `t`, rounded to its dtype."""
    st = t.storage
    data = st.data
    assert data is not None
    if st.pending is not None:
        prepare_write(t)
    values = _dtypes.round_to(values, st.dtype)
    if t.dynamic or t.gather is not None:
        t = resolve(t)
    if t.gather is not None:
        index = _flat_indices(t)
        ok = (index >= 0) & (index < data.numel())
        if not bool(ok.all()):
            if not skip_oob:
                raise _oob("dma", t.name, "an indirect (vector_offset) index points outside the tensor")
            data[index[ok]] = values.expand(index.shape)[ok]
        else:
            data[index] = values.expand(index.shape)
    else:
        data.as_strided(t.shape, t.strides, t.offset).copy_(values)
    st.written = True
    if st.acc is not None:  # a non-matmul write ends the PSUM accumulation group there
        st.acc.as_strided(t.shape, t.strides, t.offset).fill_(False)
        st.acc_full = False
        if st.init is not None:
            st.init.as_strided(t.shape, t.strides, t.offset).fill_(True)


def tensors_in(values: Iterable[Any]) -> list[NkiTensor]:
    return [v for v in values if isinstance(v, NkiTensor)]
