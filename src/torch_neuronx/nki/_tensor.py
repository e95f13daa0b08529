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
live PSUM banks, charged when an on-chip storage is created and released when
the last view of it is dropped, with the high-water mark of the launch.
"""

from __future__ import annotations

import enum
import math
import threading
import warnings
import weakref
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from torch_neuronx.nki import _dtypes
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

    def charge(self, kind: MemoryRegion, amount: int, what: str) -> None:
        if kind is MemoryRegion.sbuf:
            self.sbuf_live += amount
            self.sbuf_peak = max(self.sbuf_peak, self.sbuf_live)
            over = self.sbuf_live > self.target.sbuf_partition_bytes
            detail = (f"live SBUF is {self.sbuf_live} bytes per partition after allocating {what}, over the "
                      f"{self.target.name} budget of {self.target.sbuf_partition_bytes} bytes per partition")
            code = "err-sbuf-capacity-exceeded"
        else:
            self.psum_live += amount
            self.psum_peak = max(self.psum_peak, self.psum_live)
            over = self.psum_live > self.target.psum_banks
            detail = (f"{self.psum_live} PSUM banks are live after allocating {what}, over the "
                      f"{self.target.psum_banks} banks of 2 KiB per partition")
            code = "err-psum-capacity-exceeded"
        if not over or self.mode == "off":
            return
        hint = ("free tiles sooner (allocate inside the loop that uses them), tile smaller, or lower the "
                "buffering; TORCH_NEURONX_NKI_CAPACITY=warn reports this as a warning")
        if self.mode == "strict":
            raise NkiValidationError(code, "nl.ndarray", detail, operand="buffer",
                                     value=self.sbuf_live if kind is MemoryRegion.sbuf else self.psum_live,
                                     limit=self.target.sbuf_partition_bytes if kind is MemoryRegion.sbuf
                                     else self.target.psum_banks, hint=hint)
        if code not in self.warned:
            self.warned.add(code)
            from torch_neuronx.nki._errors import kernel_location

            filename, lineno, _ = kernel_location()
            warnings.warn_explicit(f"[{code}] {detail}. The compiler may reuse or spill memory, but this kernel "
                                   "does not fit as written; TORCH_NEURONX_NKI_CAPACITY=strict makes it an error",
                                   NkiCapacityWarning, filename, lineno)

    def release(self, kind: MemoryRegion, amount: int) -> None:
        if kind is MemoryRegion.sbuf:
            self.sbuf_live -= amount
        else:
            self.psum_live -= amount


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
        self.instructions: Counter[str] = Counter()
        self.shared: list[Storage] = []  # shared_hbm allocations, by order, shared by all programs of the grid
        self.shared_index = 0
        self.names: Counter[str] = Counter()
        self.reduce_regs: torch.Tensor | None = None  # the Scalar Engine's per-partition accumulators

    def count(self, instruction: str) -> None:
        self.instructions[instruction] += 1

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


def push(launch: Launch | None) -> Launch | None:
    previous = getattr(_state, "launch", None)
    _state.launch = launch
    return previous


# --------------------------------------------------------------------------------------------- storages


class Storage:
    """One allocation: a flat host tensor (None when only shapes are traced) in one memory region."""

    __slots__ = ("data", "dtype", "buffer", "name", "shape", "numel", "partitions", "free", "acc", "owner",
                 "written", "__weakref__")

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
        self.owner = owner  # the torch tensor / numpy array a kernel argument aliases
        self.written = False


def _check_shape(shape: Any, instruction: str) -> tuple[int, ...]:
    if isinstance(shape, int):
        shape = (shape,)
    try:
        dims = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise NkiValidationError("err-invalid-shape", instruction, f"shape {shape!r} is not a tuple of ints",
                                 operand="shape") from None
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
    free_bytes = math.prod(dims[1:]) * _dtypes.itemsize(dt)
    if where is MemoryRegion.psum and free_bytes > target.psum_bank_bytes:
        raise NkiValidationError(
            "err-psum-tile-exceeds-bank", instruction,
            f"PSUM tensor {dims} of {dt} holds {free_bytes} bytes per partition", operand="shape",
            value=free_bytes, limit=f"{target.psum_bank_bytes} bytes per partition (one PSUM bank, "
            f"{target.psum_bank_bytes // 4} float32: nl.tile_size.psum_bank_fmax)",
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
    label = name or launch.fresh_name(f"{where.value}_")
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
            data = torch.empty(numel, dtype=tdt)
        if fill == "sentinel":
            data.fill_(_dtypes.sentinel(dt))
        elif fill is not None:
            data.fill_(fill)
        storage = Storage(data, dt, where, label, dims, owner=owner)
    else:
        storage = Storage(None, dt, where, label, dims)
    if where in ON_CHIP:
        if where is MemoryRegion.sbuf:
            amount = free_bytes
        else:
            amount = max(1, -(-free_bytes // target.psum_bank_bytes))
            if launch.compute:
                storage.acc = torch.zeros(storage.numel, dtype=torch.bool)
        launch.ledger.charge(where, amount, f"{label} {dims} {dt}")
        weakref.finalize(storage, _release, launch.ledger, where, amount)
    if where is MemoryRegion.shared_hbm:
        launch.shared.append(storage)
        launch.shared_index += 1
    return NkiTensor.whole(storage)


def _release(ledger: Ledger, kind: MemoryRegion, amount: int) -> None:
    if not ledger.closed:
        ledger.release(kind, amount)


# --------------------------------------------------------------------------------------------- views


class DynamicSlice:
    """``nl.ds(start, size)``: `size` elements from `start`."""

    __slots__ = ("start", "size")

    def __init__(self, start: int, size: int) -> None:
        self.start, self.size = int(start), int(size)

    def __repr__(self) -> str:
        return f"nl.ds({self.start}, {self.size})"


def _oob(instruction: str, what: str, detail: str, operand: str | None = None) -> NkiValidationError:
    return NkiValidationError("err-tensor-access-out-of-bound", instruction, f"{what}: {detail}", operand=operand,
                              hint="keep every index, slice and access pattern inside the tensor's shape")


class NkiTensor:
    """A view of an NKI storage: ``shape``, element ``strides`` and ``offset``, ``dtype``, ``buffer``."""

    __slots__ = ("storage", "shape", "strides", "offset", "indirect")

    def __init__(self, storage: Storage, shape: tuple[int, ...], strides: tuple[int, ...], offset: int,
                 indirect: tuple[int, torch.Tensor | None] | None = None) -> None:
        self.storage = storage
        self.shape = tuple(int(s) for s in shape)
        self.strides = tuple(int(s) for s in strides)
        self.offset = int(offset)
        self.indirect = indirect  # (dim, per-position indices) for vector-offset (gather/scatter) views

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

    @property
    def free_size(self) -> int:
        """Elements per partition (the product of the free dimensions)."""
        return math.prod(self.shape[1:]) if self.shape else 1

    def __repr__(self) -> str:
        return f"NkiTensor({self.name!r}, shape={self.shape}, dtype={self.dtype}, buffer={self.buffer.value})"

    def __len__(self) -> int:
        return self.shape[0]

    def is_indirect(self) -> bool:
        return self.indirect is not None

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
              indirect: tuple[int, torch.Tensor | None] | None = None) -> NkiTensor:
        view = NkiTensor(self.storage, tuple(shape), tuple(strides), offset, indirect)
        view._check_bounds(what)
        return view

    def _check_bounds(self, what: str, instruction: str = "tensor view") -> None:
        st = self.storage
        if any(n <= 0 for n in self.shape):
            raise _oob(instruction, what, f"the view {self.shape} of {st.name!r} is empty")
        dims = list(zip(self.shape, self.strides, strict=True))
        if self.indirect is not None:
            dims = [d for i, d in enumerate(dims) if i != self.indirect[0]]
        if st.buffer in ON_CHIP and st.free and self.shape and self.indirect is None:
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
        if lo < 0 or (self.indirect is None and hi >= st.numel):
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
                step = 1 if step is None else int(step)
                if step <= 0:
                    raise _oob("tensor indexing", self.name, f"slice step {step} on dim {dim}: steps are positive")
                start = 0 if start is None else int(start)
                stop = n if stop is None else int(stop)
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
        from torch_neuronx.nki import isa

        view = self[key]
        if isinstance(value, NkiTensor):
            if view.on_chip and value.on_chip:
                isa.tensor_copy(dst=view, src=value)
            else:
                isa.dma_copy(dst=view, src=value)
        else:
            isa.memset(dst=view, value=value)

    def ap(self, pattern: Sequence[Sequence[int]], offset: int | None = None, scalar_offset: Any = None,
           vector_offset: NkiTensor | None = None, indirect_dim: int = 0, dtype: Any = None) -> NkiTensor:
        """Replace shape and strides with an explicit ``[[stride, count], ...]`` access pattern."""
        try:
            pairs = [(int(s), int(n)) for s, n in pattern]
        except (TypeError, ValueError):
            raise NkiValidationError("err-invalid-access-pattern", ".ap()", f"pattern {pattern!r} is not a list of "
                                     "[stride, count] pairs", operand="pattern") from None
        if not pairs or any(n <= 0 for _, n in pairs):
            raise NkiValidationError("err-invalid-access-pattern", ".ap()", f"pattern {pattern!r} needs positive "
                                     "counts", operand="pattern")
        if dtype is not None and _dtypes.canonical(dtype) != self.dtype:
            raise NkiValidationError("err-unsupported-feature", ".ap()", "dtype reinterpretation through .ap() is "
                                     "not emulated", operand="dtype", hint="use .view(dtype) on a whole tile")
        base = self.offset + (int(offset) if offset is not None else 0)
        strides = [s for s, _ in pairs]
        shape = [n for _, n in pairs]
        if scalar_offset is not None and vector_offset is not None:
            raise NkiValidationError("err-invalid-access-pattern", ".ap()", "scalar_offset and vector_offset are "
                                     "mutually exclusive", operand="scalar_offset")
        if not 0 <= indirect_dim < len(pairs):
            raise _oob(".ap()", self.name, f"indirect_dim {indirect_dim} for a {len(pairs)}-entry pattern")
        if scalar_offset is not None:
            base += _scalar_value(scalar_offset) * strides[indirect_dim]
        if vector_offset is not None:
            if self.on_chip:
                raise NkiValidationError("err-unsupported-memory", ".ap()", "vector_offset indexes an HBM tensor",
                                         operand="vector_offset", value=self.buffer.value)
            indices = None
            launch = current()
            if launch.compute and vector_offset.storage.data is not None:
                indices = read(vector_offset).reshape(-1).to(torch.int64)
                if indices.numel() != shape[indirect_dim]:
                    raise NkiValidationError("err-invalid-access-pattern", ".ap()",
                                             f"vector_offset has {indices.numel()} indices for a dimension of "
                                             f"{shape[indirect_dim]}", operand="vector_offset")
            return self._view(shape, strides, base, f"{self.name}.ap(...)", indirect=(indirect_dim, indices))
        return self._view(shape, strides, base, f"{self.name}.ap(...)")

    def reshape(self, shape: Sequence[int]) -> NkiTensor:
        dims = [int(d) for d in (shape if not isinstance(shape, int) else (shape,))]
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
        dims = [int(d) for d in dims]
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
        shape[dim], strides[dim] = int(size), 0
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
        key[dim] = _scalar_value(index)
        view = self[tuple(key)]
        if dim == 0 and self.on_chip:
            return view
        return view

    # nl-style arithmetic on tiles (the older dialect wrote a + b)
    def _binary(self, other: Any, op: str, reverse: bool = False) -> NkiTensor:
        from torch_neuronx.nki import language as nl

        fn = getattr(nl, op)
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
        from torch_neuronx.nki import language as nl

        return nl.negative(self)

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
        data = None if st.data is None else st.data.view(_dtypes.torch_dtype(new))
        twin = Storage(data, new, st.buffer, st.name, shape, owner=st)  # keeps st (and its ledger charge) alive
        return NkiTensor.whole(twin)

    reinterpret_cast = view


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


def _flat_indices(t: NkiTensor) -> torch.Tensor:
    dim, indices = t.indirect  # type: ignore[misc]
    index = torch.full((), t.offset, dtype=torch.int64)
    for d, (n, s) in enumerate(zip(t.shape, t.strides, strict=True)):
        pos = indices if d == dim else torch.arange(n, dtype=torch.int64)
        view = [1] * t.ndim
        view[d] = n
        index = index + (pos * s).reshape(view)
    return index


def read(t: NkiTensor) -> torch.Tensor:
    """The values of view `t` (a torch view when possible; a gather for indirect views)."""
    data = t.storage.data
    assert data is not None
    if t.indirect is not None:
        index = _flat_indices(t)
        if bool((index < 0).any()) or bool((index >= data.numel()).any()):
            raise _oob("dma", t.name, "an indirect (vector_offset) index points outside the tensor")
        return data[index]
    return data.as_strided(t.shape, t.strides, t.offset)


def write(t: NkiTensor, values: torch.Tensor, *, skip_oob: bool = False) -> None:
    """Store `values` (shaped like `t`, any dtype) into view `t`, rounded to its dtype."""
    st = t.storage
    data = st.data
    assert data is not None
    values = _dtypes.round_to(values, st.dtype)
    if t.indirect is not None:
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


def tensors_in(values: Iterable[Any]) -> list[NkiTensor]:
    return [v for v in values if isinstance(v, NkiTensor)]
