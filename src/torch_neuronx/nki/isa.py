"""``nki.isa``: the NeuronCore instructions, run eagerly on host tiles with the hardware's rules checked.

Each instruction takes ``dst=`` first, as in NKI 0.6. It first checks its
operands (memory region, partition size, free sizes, dtypes, tile limits of
the target generation) and raises :class:`NkiValidationError` at the kernel's
line on a violation; then it runs as one or a few torch ops in the arithmetic
AWS documents for its engine (float32 math; bit patterns for bitvec
operators; GpSimd's exact integers for an all-int32 ``tensor_tensor``), the
result rounded to ``dst``'s dtype. Instructions sit above the tensor and
memory model (``_tensor``), which they register with for ``t[...] = x``.
``nc_matmul`` accumulates in float32 in PSUM: the first write to a PSUM
location overwrites, later writes accumulate (``accumulate=None``), or as
``accumulate=True/False`` says.
"""

from __future__ import annotations

import enum
import functools
import inspect
import math
import warnings
from typing import Any

import torch

from torch_neuronx.nki import _dtypes, _errors
from torch_neuronx.nki._errors import NkiRangeWarning, NkiValidationError
from torch_neuronx.nki._ops import BINARY, BITVEC, REDUCE, UNARY, V4_ONLY, op_name
from torch_neuronx.nki._tensor import (
    HBM,
    ON_CHIP,
    Launch,
    MemoryRegion,
    NkiTensor,
    allocate,
    column_major_gather,
    covers,
    current,
    in_bounds,
    prepare_write,
    read,
    register_operations,
    resolve,
    write,
)
from torch_neuronx.nki._tensor import NkiTensor as _NkiTensor
from torch_neuronx.nki._tensor import int_operand as _int_immediate  # shared with the views below the isa

__all__ = [
    "NkiValidationError", "activation", "activation_reduce", "affine_select", "dma_copy", "dma_transpose",
    "dge_mode", "engine", "get_nc_version", "iota", "memset", "nc_matmul", "nc_transpose", "nc_version",
    "oob_mode", "reciprocal", "reduce_cmd", "register_alloc", "register_load", "register_move", "register_store",
    "tensor_copy", "tensor_copy_predicated", "tensor_partition_reduce", "tensor_reduce", "tensor_scalar",
    "tensor_tensor", "tensor_tensor_scan", "VirtualRegister", "matmul_perf_mode", "scalar_tensor_tensor",
    "tensor_scalar_reduce", "dma_engine", "nonzero_with_count", "nc_stream_shuffle", "activate2",
    "dma_compute", "max8", "nc_find_index8", "nc_match_replace8", "bn_stats", "bn_aggr", "tensor_scalar_cumulative",
    "exponential", "nc_n_gather", "select_reduce", "range_select",
]


class engine(enum.Enum):  # noqa: N801 - the NKI API's name
    """NeuronCore engines."""

    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    dma = 4
    vector = 5
    sync = 6


tensor_engine, vector_engine, scalar_engine, gpsimd_engine, unknown_engine = (
    engine.tensor, engine.vector, engine.scalar, engine.gpsimd, engine.unknown)


class reduce_cmd(enum.Enum):  # noqa: N801
    """Accumulator-register commands of the Scalar Engine."""

    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class dge_mode(enum.Enum):  # noqa: N801
    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class oob_mode(enum.Enum):  # noqa: N801
    error = 0
    skip = 1


class matmul_perf_mode(enum.Enum):  # noqa: N801
    none = "none"
    double_row = "double_row"


class nc_version(enum.Enum):  # noqa: N801
    gen2 = 2
    gen3 = 3
    gen4 = 4


def get_nc_version() -> nc_version:
    """The NeuronCore generation the running kernel is checked against."""
    return nc_version(current().target.nc_version)


def get_nc_sub_version() -> int:
    return 0


class VirtualRegister:
    """An engine register holding an integer (``nisa.register_alloc``)."""

    def __init__(self, value: int = 0) -> None:
        self.value = int(value)

    def __int__(self) -> int:
        return self.value

    def __index__(self) -> int:
        return self.value

    def __repr__(self) -> str:
        return f"VirtualRegister({self.value})"


def register_alloc(x: int | None = None) -> VirtualRegister:
    return VirtualRegister(0 if x is None else int(x))


def register_move(dst: VirtualRegister, src: Any) -> None:
    dst.value = int(src)


def register_load(dst: VirtualRegister, src: NkiTensor) -> None:
    launch = _begin("nisa.register_load")
    _tile("nisa.register_load", "src", src, launch)
    if launch.compute:
        dst.value = int(read(src).reshape(-1)[0].item())


def register_store(dst: NkiTensor, src: Any) -> None:
    launch = _begin("nisa.register_store")
    _tile("nisa.register_store", "dst", dst, launch)
    if launch.compute:
        write(dst, torch.full(dst.shape, int(src), dtype=torch.int64))


# --------------------------------------------------------------------------------------------- checks


def _begin(instruction: str) -> Launch:
    launch = current()
    launch.count(instruction)
    return launch


def _tile(instruction: str, operand: str, t: Any, launch: Launch,
          allowed: tuple[MemoryRegion, ...] = ON_CHIP) -> NkiTensor:
    if not isinstance(t, _NkiTensor):
        raise NkiValidationError("err-invalid-operand", instruction, f"expected an NKI tensor, got "
                                 f"{type(t).__name__}", operand=operand)
    if t.buffer not in allowed:
        if t.buffer in HBM and all(a in ON_CHIP for a in allowed):
            raise NkiValidationError(
                "err-unsupported-memory", instruction,
                f"is {t.name!r} in {t.buffer.value} (HBM); compute engines read and write only on-chip memory",
                operand=operand, value=t.buffer.value, limit=" or ".join(a.value for a in allowed),
                hint="copy it into an SBUF tile first (nisa.dma_copy or nl.load)")
        raise NkiValidationError("err-unsupported-memory", instruction, f"is {t.name!r} in {t.buffer.value}",
                                 operand=operand, value=t.buffer.value, limit=" or ".join(a.value for a in allowed))
    if t.on_chip and t.shape[0] > launch.target.pmax:
        raise NkiValidationError(
            "err-size-of-dimension-exceed-arch-limit", instruction,
            f"partition dimension (shape[0]) of {t.name!r} view {t.shape} is {t.shape[0]}", operand=operand,
            value=t.shape[0], limit=f"{launch.target.pmax} partitions (nl.tile_size.pmax)",
            hint="tile the partition dimension in chunks of at most 128")
    if t.on_chip and t.shape[0] > 1 and t.strides[0] != t.storage.free:
        raise NkiValidationError(
            "err-partition-stride", instruction,
            f"view {t.shape} of {t.name!r} steps {t.strides[0] // max(t.storage.free, 1)} partitions at a time: the "
            "hardware does not allow P dimension striding", operand=operand, value=t.strides[0],
            limit=f"consecutive partitions (partition stride {t.storage.free} elements)",
            hint="slice the partition dimension with step 1 (t[0:64], not t[0:128:2])")
    return t


def _check_op_target(instruction: str, name: str, launch: Launch, operand: str = "op") -> None:
    if name in V4_ONLY and launch.target.nc_version < 4:
        raise NkiValidationError("err-unsupported-operator", instruction, f"nl.{name} exists only on "
                                 f"NeuronCore-v4 (trn3), not on {launch.target.name}", operand=operand, value=name,
                                 limit="NeuronCore-v4 or newer",
                                 hint="compare nl.abs of both inputs and select with nisa.tensor_copy_predicated")


def _same_layout(instruction: str, a_name: str, a: NkiTensor, b_name: str, b: NkiTensor) -> None:
    if a.shape[0] != b.shape[0] or a.free_size != b.free_size:
        raise NkiValidationError(
            "err-shape-mismatch", instruction,
            f"{a_name} {a.shape} and {b_name} {b.shape} differ in partitions or elements per partition",
            operand=b_name, value=b.shape, limit=f"{a.shape[0]} partitions x {a.free_size} elements",
            hint="operands of one instruction have the same partition size and free size")


def _not_both_psum(instruction: str, names: tuple[str, str], a: NkiTensor, b: NkiTensor) -> None:
    if a.buffer is MemoryRegion.psum and b.buffer is MemoryRegion.psum:
        raise NkiValidationError("err-unsupported-memory", instruction, f"{names[0]} and {names[1]} are both in "
                                 "PSUM; at most one input of this instruction may be", operand=names[1],
                                 value="psum", limit="at most one input in PSUM (the other in SBUF)",
                                 hint="copy one of them to SBUF with nisa.tensor_copy")


def _native(t: NkiTensor) -> torch.dtype:
    """The dtype to compute a bit-exact move of `t` in: its storage dtype (int64 for integers)."""
    return torch.int64 if _dtypes.is_int(t.dtype) and t.dtype != "bool" else _dtypes.torch_dtype(t.dtype)


def _flat(t: NkiTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The tile as (partitions, elements per partition) in the compute dtype."""
    return read(t).reshape(t.shape[0], -1).to(dtype)


def _reduce_res_tile(ins: str, reduce_res: Any, p: int, launch: Any) -> None:
    """A `reduce_res` operand (one value per partition): a tile of `p` partitions and one element each, or None."""
    if reduce_res is None:
        return
    _tile(ins, "reduce_res", reduce_res, launch)
    if reduce_res.shape[0] != p or reduce_res.free_size != 1:
        raise NkiValidationError("err-shape-mismatch", ins, f"reduce_res {reduce_res.shape}", operand="reduce_res",
                                 value=reduce_res.shape, limit=f"({p}, 1)")


def _vector_operand(instruction: str, operand: str, value: Any, partitions: int, launch: Launch,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor | float | None:
    """A compile-time scalar, or a (partitions, 1) on-chip tile broadcast along the free dimension."""
    if value is None:
        return None
    if isinstance(value, _NkiTensor):
        _tile(instruction, operand, value, launch)
        if value.shape[0] != partitions or value.free_size != 1:
            raise NkiValidationError("err-shape-mismatch", instruction, f"{value.name!r} {value.shape} is not a "
                                     f"({partitions}, 1) vector", operand=operand, value=value.shape,
                                     limit=f"({partitions}, 1)")
        return _flat(value, dtype) if launch.compute else None
    try:
        return float(value) if dtype.is_floating_point else int(value)
    except (TypeError, ValueError):
        raise NkiValidationError("err-invalid-operand", instruction, f"{value!r} is neither a scalar nor a "
                                 "tile", operand=operand) from None


def _binary(name: str, a: Any, b: Any) -> torch.Tensor:
    fn = BINARY.get(name)
    if fn is None:
        raise NkiValidationError("err-unsupported-operator", "alu", f"{name!r} is not a binary ALU operator",
                                 operand="op", limit=", ".join(sorted(BINARY)))
    if not torch.is_tensor(a) and not torch.is_tensor(b):
        return fn(torch.tensor(a), b)
    return fn(a, b)


def _unary(name: str, x: torch.Tensor) -> torch.Tensor:
    fn = UNARY.get(name)
    if fn is None:
        raise NkiValidationError("err-unsupported-operator", "activation", f"{name!r} is not an activation "
                                 "function", operand="op", limit=", ".join(sorted(UNARY)))
    return fn(x)


def _ensure_dst(instruction: str, dst: Any) -> None:
    if dst is None:
        raise NkiValidationError("err-missing-dst", instruction, "every nki.isa instruction takes its output "
                                 "tile as dst= (NKI 0.6)", operand="dst",
                                 hint="allocate it with nl.ndarray(shape, dtype, buffer=nl.sbuf) and pass dst=")


def _check_arith_dtypes(instruction: str, name: str, *tiles: tuple[str, NkiTensor]) -> torch.dtype:
    if name in BITVEC:
        for operand, t in tiles:
            if not _dtypes.is_int(t.dtype):
                raise NkiValidationError("err-unsupported-dtype", instruction, f"bitvec operator {name} on "
                                         f"{t.dtype} tile {t.name!r}", operand=operand, value=t.dtype,
                                         limit="integer dtypes")
        return torch.int64
    return _dtypes.compute_dtype(*(t.dtype for _, t in tiles))


# --------------------------------------------------------------------------------------------- data movement


def dma_copy(dst: NkiTensor, src: NkiTensor, priority: Any = None, oob_mode: oob_mode = oob_mode.error,
             dge_mode: dge_mode = dge_mode.unknown, engine: engine = engine.unknown, name: str | None = None) -> Any:
    """``dst = src`` through the DMA engines, between HBM and SBUF (never PSUM)."""
    ins = "nisa.dma_copy"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    dma_regions = (MemoryRegion.sbuf, *HBM)
    for operand, t in (("dst", dst), ("src", src)):
        if isinstance(t, _NkiTensor) and t.buffer is MemoryRegion.psum:
            raise NkiValidationError(
                "err-dma-psum", ins, f"is {t.name!r} in PSUM: DMA engines move data between HBM and SBUF only",
                operand=operand, value="psum", limit="hbm or sbuf",
                hint="copy the PSUM tile to SBUF with nisa.tensor_copy, then DMA the SBUF tile")
        _tile(ins, operand, t, launch, dma_regions)
        _one_index_per_row(ins, operand, t)
    if src.size != dst.size:
        raise NkiValidationError("err-shape-mismatch", ins, f"src {src.shape} has {src.size} elements, dst "
                                 f"{dst.shape} has {dst.size}", operand="dst", value=dst.size, limit=src.size)
    _check_dma_options(ins, launch, priority, dge_mode)
    _check_dma_engine(ins, engine, dge_mode)
    if launch.compute:
        skip = oob_mode is not _OOB_ERROR
        values = read(src, skip_oob=skip)
        if src.dtype != dst.dtype:
            values = values.to(torch.float32)  # the DMA casts through float32
        values = values.reshape(dst.shape)
        if skip and src.gather is not None:
            # AWS oob_mode.skip "silently skips any operations involving out-of-bounds indices": dst keeps its
            # values where the gathered index is out of bounds
            ok = in_bounds(resolve(src)).reshape(dst.shape)
            if not bool(ok.all()):
                values = torch.where(ok, values, read(dst).to(values.dtype))
        write(dst, values, skip_oob=skip)
    return dst


def _one_index_per_row(ins: str, operand: str, t: NkiTensor) -> None:
    """A gather/scatter view (``.ap(vector_offset=)``) takes one index per row it addresses; only dma_transpose reads
    the first ``src.shape[0]`` of more (AWS: "indices.shape[0] * indices.shape[1] must be >= src.shape[0]")."""
    g = t.gather
    if g is not None and math.prod(g.index_shape) != t.shape[g.dim]:
        raise NkiValidationError("err-invalid-access-pattern", ins, f"vector_offset has {math.prod(g.index_shape)} "
                                 f"indices for the {t.shape[g.dim]} rows {t.name!r} addresses", operand=operand,
                                 value=math.prod(g.index_shape), limit=f"{t.shape[g.dim]} indices, one per row",
                                 hint="give as many indices as the pattern's indirect dimension counts")


def _check_dma_options(ins: str, launch: Launch, priority: Any, dge: Any) -> None:
    """AWS dma_copy/dma_transpose: hardware DGE only on NeuronCore-v3 or newer; ``priority`` (QoS level 0-3)
    is NeuronCore-v4+ only."""
    target = launch.target
    if dge is _HWDGE and target.nc_version < 3:
        raise NkiValidationError("err-unsupported-feature", ins, f"dge_mode=hwdge on {target.name}: hardware DGE "
                                 "exists from NeuronCore-v3 (trn2)", operand="dge_mode", value="hwdge",
                                 limit="NeuronCore-v3 or newer", hint="leave dge_mode unset (the compiler picks)")
    if priority is not None:
        if target.nc_version < 4:
            raise NkiValidationError("err-unsupported-feature", ins, f"priority={priority!r} on {target.name}: DMA "
                                     "priority levels are NeuronCore-v4+ only", operand="priority", value=priority,
                                     limit="NeuronCore-v4 (trn3) or newer", hint="drop priority=")
        if not isinstance(priority, int) or not 0 <= priority <= 3:
            raise NkiValidationError("err-invalid-operand", ins, f"priority {priority!r}", operand="priority",
                                     value=priority, limit="an int 0..3 (lower is higher priority)")


def _check_dma_engine(ins: str, chosen: Any, dge: Any) -> None:
    """AWS dma_copy ``engine``: the engine that generates hardware-DGE descriptors, ``engine.sync`` or
    ``engine.scalar``, only valid with ``dge_mode=hwdge`` (``engine.unknown``, the default, lets the compiler pick)."""
    if chosen is engine.unknown:
        return
    if chosen not in (engine.sync, engine.scalar):
        raise NkiValidationError("err-unsupported-engine", ins, f"engine={getattr(chosen, 'name', chosen)}: engine= "
                                 "names the engine that generates hardware-DGE descriptors", operand="engine",
                                 value=getattr(chosen, "name", chosen), limit="nisa.engine.sync or nisa.engine.scalar",
                                 hint="leave engine unset (nisa.dma_engine is sendrecv's dma_engine=, not this)")
    if dge is not _HWDGE:
        raise NkiValidationError("err-invalid-operand", ins, f"engine={chosen.name} without dge_mode=hwdge",
                                 operand="engine", value=chosen.name, limit="only with dge_mode=nisa.dge_mode.hwdge",
                                 hint="add dge_mode=nisa.dge_mode.hwdge, or leave engine unset")


_OOB_ERROR = oob_mode.error
_HWDGE = dge_mode.hwdge


def dma_transpose(dst: NkiTensor, src: NkiTensor, axes: Any = None, priority: Any = None,
                  dge_mode: dge_mode = dge_mode.unknown, oob_mode: oob_mode = oob_mode.error,
                  name: str | None = None) -> Any:
    """Transpose `src` (HBM or SBUF) into SBUF `dst` on the DMA engine: axes (1, 0), (2, 1, 0) or (3, 1, 2, 0)."""
    ins = "nisa.dma_transpose"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    _tile(ins, "src", src, launch, (MemoryRegion.sbuf, *HBM))
    _tile(ins, "dst", dst, launch, (MemoryRegion.sbuf,))
    default = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}
    perm = tuple(axes) if axes is not None else default.get(src.ndim)
    if perm not in default.values() or len(perm) != src.ndim:
        raise NkiValidationError("err-unsupported-feature", ins, f"axes {axes} for a {src.ndim}-D source",
                                 operand="axes", limit="(1, 0), (2, 1, 0) or (3, 1, 2, 0)")
    if src.dtype != dst.dtype:
        raise NkiValidationError("err-unsupported-dtype", ins, f"dst is {dst.dtype}, src {src.dtype}",
                                 operand="dst", limit="the same dtype")
    _check_dma_options(ins, launch, priority, dge_mode)
    if dge_mode is _HWDGE:
        if _dtypes.itemsize(src.dtype) != 2:
            raise NkiValidationError("err-unsupported-dtype", ins, f"a hardware-DGE transpose of {src.dtype} "
                                     f"({_dtypes.itemsize(src.dtype)} bytes per element)", operand="src",
                                     value=src.dtype, limit="a 2-byte dtype (bfloat16, float16, int16, uint16)",
                                     hint="leave dge_mode unset, or transpose on the Tensor Engine (nc_transpose)")
        _check_hwdge_transpose_shape(ins, src)
    if src.gather is not None:
        _check_gather_transpose(ins, src, launch, dge_mode)
        src = column_major_gather(src)  # AWS: 2-D indices are read column-major, indices.T.flatten()
    out_shape = tuple(src.shape[p] for p in perm)
    if math.prod(out_shape) != dst.size:
        raise NkiValidationError("err-shape-mismatch", ins, f"dst {dst.shape} cannot hold the transpose "
                                 f"{out_shape}", operand="dst", value=dst.shape, limit=out_shape)
    if launch.compute:
        write(dst, read(src).permute(perm).reshape(dst.shape))
    return dst


def _check_hwdge_transpose_shape(ins: str, src: NkiTensor) -> None:
    """AWS dma_transpose (hardware DGE): 2-D sources have src.shape[0] == 16; 3-D/4-D sources src.shape[0] in
    {1, 2, 4, 8, 16} with src.shape[0] * src.shape[-2] a multiple of 16; src.shape[-1] <= 128."""
    first = src.shape[0]
    if src.ndim == 2 and first != 16:
        raise NkiValidationError("err-unsupported-feature", ins, f"a hardware-DGE transpose of a 2-D source "
                                 f"{src.shape}", operand="src", value=first, limit="src.shape[0] == 16",
                                 hint="transpose 16-row blocks, or leave dge_mode unset")
    if src.ndim > 2 and (first not in (1, 2, 4, 8, 16) or (first * src.shape[-2]) % 16):
        raise NkiValidationError("err-unsupported-feature", ins, f"a hardware-DGE transpose of {src.shape}",
                                 operand="src", value=src.shape, limit="src.shape[0] in {1, 2, 4, 8, 16} and "
                                 "src.shape[0] * src.shape[-2] a multiple of 16")
    if src.shape[-1] > 128:
        raise NkiValidationError("err-unsupported-feature", ins, f"a hardware-DGE transpose of {src.shape}",
                                 operand="src", value=src.shape[-1], limit="src.shape[-1] <= 128")


def _check_gather_transpose(ins: str, src: NkiTensor, launch: Launch, dge: Any) -> None:
    """AWS dma_transpose, indirect (gather) transpose: TRN2+ only, software DGE, a 2-byte src dtype."""
    target = launch.target
    if target.nc_version < 3:
        raise NkiValidationError("err-unsupported-feature", ins, f"an indirect (vector_offset) transpose on "
                                 f"{target.name}: the DMA gather-transpose is TRN2+ only", operand="src",
                                 limit="NeuronCore-v3 (trn2) or newer",
                                 hint="gather with nisa.dma_copy, then transpose with nisa.nc_transpose")
    if dge is _HWDGE:
        raise NkiValidationError("err-unsupported-feature", ins, "an indirect transpose with dge_mode=hwdge",
                                 operand="dge_mode", value="hwdge", limit="unknown or swdge")
    if _dtypes.itemsize(src.dtype) != 2:
        raise NkiValidationError("err-unsupported-dtype", ins, f"an indirect transpose of {src.dtype} "
                                 f"({_dtypes.itemsize(src.dtype)} bytes per element)", operand="src",
                                 value=src.dtype, limit="a 2-byte dtype (bfloat16, float16, int16, uint16)")
    _check_gather_indices(ins, src)


def _check_gather_indices(ins: str, src: NkiTensor) -> None:
    """AWS dma_transpose, indirect transpose constraints: 2-D uint32 indices with 16..128 rows, a multiple of 16
    (exactly 128 rows when there is more than one column); src.shape[0] a multiple of 16, src.shape[-1] <= 128; a
    4-D src has src.shape[1] or src.shape[2] equal to 1."""
    assert src.gather is not None
    index_shape = src.gather.index_shape
    index_dtype = getattr(src.gather.source, "dtype", None)
    rows = index_shape[0]
    if index_dtype is not None and index_dtype != "uint32":
        raise NkiValidationError("err-unsupported-dtype", ins, f"an indirect (gather) transpose with indices of "
                                 f"{index_dtype}", operand="vector_offset", value=index_dtype, limit="uint32")
    problems = [
        (len(index_shape) != 2, "vector_offset", f"indices of shape {index_shape}", "2-D indices"),
        (not (16 <= rows <= 128 and rows % 16 == 0), "vector_offset", f"indices with {rows} rows",
         "16 to 128 rows, a multiple of 16"),
        (len(index_shape) == 2 and index_shape[1] > 1 and rows != 128, "vector_offset",
         f"indices of shape {index_shape}", "exactly 128 rows when indices have more than one column"),
        (src.shape[0] % 16 != 0, "src", f"src.shape[0] = {src.shape[0]} gathered rows", "a multiple of 16"),
        (src.shape[-1] > 128, "src", f"src.shape[-1] = {src.shape[-1]}", "at most 128"),
        (src.ndim == 4 and 1 not in src.shape[1:3], "src", f"a 4-D src {src.shape}",
         "src.shape[1] or src.shape[2] equal to 1"),
    ]
    for broken, operand, found, limit in problems:
        if broken:
            raise NkiValidationError("err-unsupported-feature", ins, f"an indirect (gather) transpose with {found}",
                                     operand=operand, value=found, limit=limit)


def tensor_copy(dst: NkiTensor, src: NkiTensor, engine: engine = engine.unknown, name: str | None = None, *,
                dtype: Any = None) -> Any:
    """Copy an on-chip tile (SBUF or PSUM) to another on chip, bit-exact when the dtypes agree.

    NKI 0.6's reference signature has no ``dtype``; AWS's own matmul tutorial (aws-neuron/nki-samples,
    ``matrix_multiplication_nki_kernels.py``) passes ``dtype=`` equal to dst's dtype, which changes nothing and is
    accepted. A ``dtype`` that differs from dst's has no documented meaning and is refused.
    """
    ins = "nisa.tensor_copy"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    _tile(ins, "src", src, launch)
    _tile(ins, "dst", dst, launch)
    if dtype is not None and _canonical_or_none(dtype) != dst.dtype:
        raise NkiValidationError("err-unsupported-feature", ins, f"dtype={dtype!r} differs from dst's {dst.dtype}: "
                                 "NKI 0.6's reference signature has no dtype (the dtype of dst is the cast)",
                                 operand="dtype", value=str(dtype), limit=f"dst's own dtype ({dst.dtype}) or unset",
                                 hint="drop dtype= and allocate dst in the dtype you want")
    _same_layout(ins, "src", src, "dst", dst)
    if engine is _GPSIMD and MemoryRegion.psum in (src.buffer, dst.buffer):
        raise NkiValidationError("err-unsupported-memory", ins, "the GpSimd engine cannot access PSUM",
                                 operand="engine", value="gpsimd", limit="vector or scalar with PSUM operands")
    if engine is _SCALAR and launch.target.nc_version == 2:
        raise NkiValidationError("err-unsupported-engine", ins, "NeuronCore-v2 has no Scalar Engine tensor_copy",
                                 operand="engine", value="scalar", limit="vector or gpsimd on NeuronCore-v2 "
                                 "(scalar from NeuronCore-v3)", hint="use nisa.activation(op=nl.copy) or engine=vector")
    if launch.compute:
        values = read(src)
        if src.dtype != dst.dtype:
            values = values.to(torch.float32)
        write(dst, values.reshape(dst.shape))
    return dst


def _canonical_or_none(dtype: Any) -> str | None:
    try:
        return _dtypes.canonical(dtype)
    except _dtypes.DTypeError:
        return None


_GPSIMD, _SCALAR, _TENSOR, _VECTOR, _UNKNOWN = engine.gpsimd, engine.scalar, engine.tensor, engine.vector, \
    engine.unknown


def _memset_value(ins: str, dst: NkiTensor, value: Any) -> float | int | bool:
    if isinstance(value, _NkiTensor) or isinstance(value, (str, bytes)) or value is None:
        raise NkiValidationError("err-memset-value", ins, f"value {value!r} is not a compile-time number",
                                 operand="value")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise NkiValidationError("err-memset-value", ins, f"value {value!r} is not a number",
                                 operand="value") from None
    dt = dst.dtype
    if dt == "bool":
        if number not in (0.0, 1.0):
            raise NkiValidationError("err-memset-value", ins, f"value {value!r} for a bool tile", operand="value",
                                     value=value, limit="0, 1, True or False")
        return bool(number)
    if _dtypes.is_int(dt):
        info = torch.iinfo(_dtypes.torch_dtype(dt))
        if not math.isfinite(number) or number != int(number) or not info.min <= int(number) <= info.max:
            raise NkiValidationError(
                "err-memset-value", ins, f"value {value!r} does not match the {dt} dtype of {dst.name!r}",
                operand="value", value=value, limit=f"integers in [{info.min}, {info.max}]",
                hint="give an integer the destination dtype can hold")
        return int(number)
    if math.isinf(number) and dt not in _dtypes.HAS_INF:
        raise NkiValidationError("err-memset-value", ins, f"{dt} has no infinity", operand="value", value=value,
                                 limit=f"finite values up to {_dtypes.FINITE_MAX[dt]}")
    if math.isfinite(number) and abs(number) > _dtypes.FINITE_MAX.get(dt, math.inf):
        raise NkiValidationError("err-memset-value", ins, f"value {value!r} overflows {dt}", operand="value",
                                 value=value, limit=f"|value| <= {_dtypes.FINITE_MAX[dt]}")
    return number


def memset(dst: NkiTensor, value: Any, engine: engine = engine.unknown, name: str | None = None) -> Any:
    """Fill an on-chip tile with a compile-time constant that its dtype can hold."""
    ins = "nisa.memset"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    _tile(ins, "dst", dst, launch)
    number = _memset_value(ins, dst, value)
    if launch.compute:
        write(dst, torch.full(dst.shape, number, dtype=torch.float32 if isinstance(number, float) else torch.int64))
    return dst


# --------------------------------------------------------------------------------------------- vector / scalar


def tensor_tensor(dst: NkiTensor, data1: NkiTensor, data2: NkiTensor, op: Any, engine: engine = engine.unknown,
                  name: str | None = None) -> Any:
    """``dst = op(data1, data2)`` element-wise (Vector or GpSimd Engine)."""
    ins = "nisa.tensor_tensor"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    for operand, t in (("data1", data1), ("data2", data2), ("dst", dst)):
        _tile(ins, operand, t, launch)
    _same_layout(ins, "data1", data1, "data2", data2)
    _same_layout(ins, "data1", data1, "dst", dst)
    _not_both_psum(ins, ("data1", "data2"), data1, data2)
    name_ = op_name(op)
    if name_ == "power" and MemoryRegion.psum in (data1.buffer, data2.buffer, dst.buffer):
        raise NkiValidationError("err-unsupported-memory", ins, "nl.power runs on GpSimd, which cannot access PSUM",
                                 operand="op", value="power", limit="SBUF operands and dst for nl.power",
                                 hint="copy the PSUM operand to SBUF with nisa.tensor_copy first")
    _check_op_target(ins, name_, launch)
    if name_ in BITVEC:
        cdt = _check_arith_dtypes(ins, name_, ("data1", data1), ("data2", data2))
    else:
        # AWS: float32 math, except that all-int32/uint32 operands default to GpSimd's exact integer arithmetic
        # (not when engine=vector is asked for, nor when an operand is in PSUM, which GpSimd cannot reach)
        int32_only = data1.dtype in _INT32 and data2.dtype in _INT32 and dst.dtype in _INT32
        on_gpsimd = int32_only and engine is not _VECTOR and MemoryRegion.psum not in (data1.buffer, data2.buffer,
                                                                                       dst.buffer)
        cdt = torch.int64 if on_gpsimd and name_ != "power" else torch.float32
    if launch.compute:
        a, b = _flat(data1, cdt), _flat(data2, cdt)
        if name_ in BITVEC:
            a, b = _bit_pattern(a, data1.dtype), _bit_pattern(b, data2.dtype)
        if name_ == "divide" and cdt == torch.int64:
            write(dst, _integer_divide(ins, a, b).reshape(dst.shape))
        else:
            write(dst, _binary(name_, a, b).reshape(dst.shape))
    return dst


def _integer_divide(ins: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """GpSimd's int32 divide: AWS promises "exact results for all 32-bit integer values" for all-int32 tensor_tensor;
    the quotient rounds toward zero, as the float32 path's cast to an integer does (and as C's integer division),
    so the two agree wherever float32 is exact. A zero divisor has no documented result: refused."""
    if bool((b == 0).any()):
        raise NkiValidationError("err-invalid-operand", ins, "an int32 divide by zero on GpSimd has no documented "
                                 "result", operand="data2", hint="mask the zeros first (nisa.tensor_copy_predicated)")
    return torch.div(a, b, rounding_mode="trunc")


def _bit_pattern(values: Any, dtype: str) -> Any:
    """Integers as the unsigned bit patterns of `dtype`'s width: AWS's bitvec operators "treat input elements as
    bit patterns", and nl.right_shift is a logical shift (int32 -8 >> 1 is 0x7FFFFFFC; no arithmetic shift)."""
    mask = (1 << (8 * _dtypes.itemsize(dtype))) - 1
    if torch.is_tensor(values):
        return values.to(torch.int64) & mask
    return int(values) & mask


def tensor_scalar(dst: NkiTensor, data: NkiTensor, op0: Any, operand0: Any, reverse0: bool = False,
                  op1: Any = None, operand1: Any = None, reverse1: bool = False, engine: engine = engine.unknown,
                  name: str | None = None) -> Any:
    """``dst = (data op0 operand0) op1 operand1`` with scalars or (P, 1) vectors broadcast along the free dim."""
    ins = "nisa.tensor_scalar"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    _tile(ins, "data", data, launch)
    _tile(ins, "dst", dst, launch)
    _same_layout(ins, "data", data, "dst", dst)
    if op1 is None and operand1 is not None:
        raise NkiValidationError("err-invalid-operand", ins, "operand1 is given without op1", operand="operand1")
    n0, n1 = op_name(op0), (op_name(op1) if op1 is not None else None)
    for operand, n in (("op0", n0), ("op1", n1)):
        if n is not None:
            _check_op_target(ins, n, launch, operand)
    if n1 is not None and (n0 in BITVEC) != (n1 in BITVEC):
        raise NkiValidationError("err-unsupported-operator", ins, f"op0 {n0} and op1 {n1} mix a bitvec and an "
                                 "arithmetic operator", operand="op1", value=n1,
                                 limit="both bitvec or both arithmetic",
                                 hint="split it into two nisa.tensor_scalar instructions")
    if n0 in BITVEC and engine not in (_VECTOR, _UNKNOWN):
        raise NkiValidationError("err-unsupported-engine", ins, f"bitvec operator {n0} runs on the Vector Engine",
                                 operand="engine", value=getattr(engine, "name", engine), limit="engine.vector")
    if engine is _GPSIMD and n0 != "rsqrt":
        raise NkiValidationError("err-unsupported-engine", ins, f"engine=gpsimd with op0={n0}", operand="engine",
                                 value="gpsimd", limit="gpsimd only for nl.rsqrt; vector, scalar or unknown otherwise")
    if n0 not in BITVEC:
        for operand, value in (("operand0", operand0), ("operand1", operand1)):
            if isinstance(value, _NkiTensor) and value.dtype != "float32":
                raise NkiValidationError("err-unsupported-dtype", ins, f"{operand} {value.name!r} is {value.dtype}",
                                         operand=operand, value=value.dtype, limit="float32 (arithmetic operators)")
    if engine is _SCALAR and launch.target.nc_version == 3 and (n0, n1) not in _SCALAR_TS_COMBOS:
        raise NkiValidationError("err-unsupported-operator", ins, f"the Scalar Engine on trn2 does not run op0={n0}, "
                                 f"op1={n1}", operand="op0", value=(n0, n1),
                                 limit="multiply then add, multiply alone, or add alone",
                                 hint="use engine=nisa.engine.vector (or leave engine unset)")
    tiles = [("data", data)] + [(n, t) for n, t in (("operand0", operand0), ("operand1", operand1))
                                if isinstance(t, _NkiTensor)]
    if n0 in BITVEC or n1 in BITVEC:
        cdt = _check_arith_dtypes(ins, "bitwise_and", *tiles)
    else:
        cdt = torch.float32  # arithmetic runs in float32 whatever the tile dtypes
    p = data.shape[0]
    v0 = _vector_operand(ins, "operand0", operand0, p, launch, cdt)
    v1 = _vector_operand(ins, "operand1", operand1, p, launch, cdt)
    if launch.compute:
        x = _flat(data, cdt)
        if n0 in BITVEC:
            x, v0, v1 = (_bit_pattern(x, data.dtype), *(
                None if v is None else _bit_pattern(v, o.dtype if isinstance(o, _NkiTensor) else data.dtype)
                for v, o in ((v0, operand0), (v1, operand1))))
        x = _apply(n0, x, v0, reverse0)
        if n1 is not None:
            x = _apply(n1, x, v1, reverse1)
        write(dst, x.reshape(dst.shape))
    return dst


_INT32 = ("int32", "uint32")
_PARTITION_REDUCE = {"add", "average", "mean", "maximum", "bitwise_or", "bitwise_and"}
_SCALAR_TS_COMBOS = {("multiply", "add"), ("multiply", None), ("add", None)}  # AWS: trn2 Scalar Engine tensor_scalar


def _apply(name: str, x: torch.Tensor, operand: Any, reverse: bool) -> torch.Tensor:
    if name in UNARY and name not in BINARY:
        return _unary(name, x)
    if operand is None:
        raise NkiValidationError("err-invalid-operand", "nisa.tensor_scalar", f"binary operator {name} has no "
                                 "operand", operand="operand0")
    return _binary(name, operand, x) if reverse else _binary(name, x, operand)


def activation(dst: NkiTensor, op: Any, data: NkiTensor, bias: Any = None, scale: Any = 1.0,
               reduce_op: Any = None, reduce_res: NkiTensor | None = None, reduce_cmd: reduce_cmd = reduce_cmd.idle,
               name: str | None = None) -> Any:
    """``dst = op(data * scale + bias)`` on the Scalar Engine, with an optional add-reduction along the free dim.

    With ``reduce_op`` and ``reduce_res`` and the default ``reduce_cmd.idle``, ``reduce_res`` receives this
    instruction's row sums (as ``reset_reduce``); the other commands drive the engine's accumulators as documented.
    """
    ins = "nisa.activation"
    if name is _AS_ACTIVATION_REDUCE:  # called by activation_reduce, whose rules differ (reduce_op)
        ins, name = "nisa.activation_reduce", None
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    _tile(ins, "data", data, launch)
    _tile(ins, "dst", dst, launch)
    _same_layout(ins, "data", data, "dst", dst)
    p = data.shape[0]
    if launch.target.nc_version == 2 and bias is not None and not isinstance(bias, _NkiTensor):
        raise NkiValidationError("err-activation-bias-invalid-type", ins, "NeuronCore-v2 takes the bias as a "
                                 f"({p}, 1) vector, not a scalar", operand="bias", value=bias,
                                 limit=f"a ({p}, 1) tile")
    if isinstance(scale, _NkiTensor) and scale.dtype != "float32":
        raise NkiValidationError("err-unsupported-dtype", ins, f"scale {scale.name!r} is {scale.dtype}",
                                 operand="scale", value=scale.dtype, limit="float32")
    if isinstance(bias, _NkiTensor) and bias.dtype == "tfloat32":
        raise NkiValidationError("err-unsupported-dtype", ins, f"bias {bias.name!r} is tfloat32", operand="bias",
                                 value="tfloat32", limit="any dtype but tfloat32")
    b = _vector_operand(ins, "bias", bias, p, launch)
    s = _vector_operand(ins, "scale", scale, p, launch)
    fn = op_name(op)
    if fn == "reciprocal" and bias is not None and launch.target.nc_version == 2:
        # AWS nki.api.shared (engine selection): activation(op=nl.reciprocal) does not support bias on v2
        raise NkiValidationError("err-activation-bias-invalid-type", ins, "nl.reciprocal on the Scalar Engine takes "
                                 "no bias on NeuronCore-v2", operand="bias", limit="no bias on trn1",
                                 hint="add the bias with nisa.tensor_scalar first, or use nisa.reciprocal")
    red = op_name(reduce_op) if reduce_op is not None else None
    allowed = _activation_reduce_ops(ins, launch)
    if red is not None and red not in allowed:
        raise NkiValidationError("err-unsupported-operator", ins, f"reduce_op {red}", operand="reduce_op",
                                 value=red, limit=" or ".join(f"nl.{r}" for r in sorted(allowed)) +
                                 f" ({'nisa.activation' if ins == 'nisa.activation' else ins} on "
                                 f"{launch.target.name})")
    _reduce_res_tile(ins, reduce_res, p, launch)
    if not launch.compute:
        return dst
    x = _flat(data)
    if s is not None:
        x = x * s
    if b is not None:
        x = x + b
    if fn in _VALID_RANGE:
        _warn_out_of_range(ins, fn, x, launch)
    out = _scalar_sin(x) if fn == "sin" else _unary(fn, x)
    write(dst, out.reshape(dst.shape))
    # AWS activation pseudo-code: reset/reset_reduce zero reduce_regs, reduce/reset_reduce fold this output into
    # them, idle leaves them alone; reduce_res (when given) reads reduce_regs out, whatever the command
    if reduce_cmd is not _IDLE or reduce_res is not None:
        regs = _regs(launch)
        if reduce_cmd in (_RESET, _RESET_REDUCE):
            regs[:p] = _REDUCE_IDENTITY[red] if red else 0.0  # 0 for add (AWS: reduce_regs = 0)
        if reduce_cmd in (_REDUCE, _RESET_REDUCE) and red is not None:
            regs[:p] = REDUCE[red](torch.cat([regs[:p, None], out], dim=1))
        if reduce_res is not None:
            write(reduce_res, regs[:p].reshape(reduce_res.shape))
    return dst


def _activation_reduce_ops(ins: str, launch: Launch) -> set[str]:
    """nisa.activation: "reduce_op must be nl.add". nisa.activation_reduce, the more specific text for its own
    reduce_op: "On NeuronCore-v2, the reduce_op must be nl.add", so from v3 it takes the arithmetic reductions of
    the ALU table that the Scalar Engine's accumulators fold (add, multiply, maximum, minimum)."""
    if ins == "nisa.activation_reduce" and launch.target.nc_version >= 3:
        return {"add", "multiply", "maximum", "minimum"}
    return {"add"}


# AWS nki.api.shared tbl-act-func, "Valid Input Range" of the Scalar Engine's activation functions narrower than
# [-inf, inf] (reciprocal: the magnitude); outside it the hardware "will generate invalid output results"
_VALID_RANGE = {"log": (2.0 ** -64, 2.0 ** 64, False), "sqrt": (2.0 ** -116, 2.0 ** 118, False),
                "rsqrt": (2.0 ** -87, 2.0 ** 97, False), "reciprocal": (2.0 ** -42, 2.0 ** 42, True),
                "arctan": (-math.pi / 2, math.pi / 2, False)}


def _warn_out_of_range(ins: str, fn: str, x: torch.Tensor, launch: Launch) -> None:
    """Warn (once per launch and function) when inputs leave AWS's valid input range: the instance's result there
    is invalid, the interpreter's is torch's exact value, so the two differ silently otherwise."""
    key = f"activation-input-range:{fn}"  # listed in the launch report's warnings
    if key in launch.ledger.warned:
        return
    lo, hi, magnitude = _VALID_RANGE[fn]
    v = x.abs() if magnitude else x
    bad = (v < lo) | (v > hi)
    if not bool(bad.any()):
        return
    launch.ledger.warned.add(key)
    first = float(x[bad][0])
    filename, lineno, _ = _errors.kernel_location()
    span = f"+-[{lo:g}, {hi:g}]" if magnitude else f"[{lo:g}, {hi:g}]"
    warnings.warn_explicit(f"{ins}(op=nl.{fn}): input {first:g} is outside the Scalar Engine's valid input range "
                           f"{span} (AWS nki.api.shared); the instance gives invalid results there, this "
                           "interpreter the exact function", NkiRangeWarning, filename, lineno)


def _scalar_sin(x: torch.Tensor) -> torch.Tensor:
    """The Scalar Engine's sin: AWS nki.api.shared says it does no range reduction and extrapolates a cubic
    outside [-PI, PI] (``sin(9.0)`` returns ~27.65, which nki.simulate reproduces). The cubic here is sin's
    Taylor cubic at +-PI, -(x - PI) + (x - PI)**3 / 6 (odd), which gives 27.65 at 9.0; inside [-PI, PI] torch.sin.
    nl.sin range-reduces first and is accurate everywhere."""
    d = x - torch.sign(x) * math.pi
    cubic = -d + d * d * d / 6.0
    return torch.where(x.abs() > math.pi, cubic, torch.sin(x))


_AS_ACTIVATION_REDUCE: Any = object()
_IDLE, _RESET, _REDUCE, _RESET_REDUCE = reduce_cmd.idle, reduce_cmd.reset, reduce_cmd.reduce, reduce_cmd.reset_reduce


def _regs(launch: Launch) -> torch.Tensor:
    if launch.reduce_regs is None:
        launch.reduce_regs = torch.full((launch.target.pmax,), float("nan"))
    return launch.reduce_regs


def activation_reduce(dst: NkiTensor, op: Any, data: NkiTensor, reduce_op: Any, reduce_res: NkiTensor,
                      bias: Any = None, scale: Any = 1.0, name: str | None = None) -> Any:
    """``activation`` with ``reduce_cmd=reset_reduce``: ``reduce_res`` gets the reduction of this instruction's
    output (nl.add on trn1; add, multiply, maximum or minimum from trn2, see _activation_reduce_ops)."""
    return activation(dst, op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
                      reduce_cmd=reduce_cmd.reset_reduce, name=_AS_ACTIVATION_REDUCE)


def reciprocal(dst: NkiTensor, data: NkiTensor, name: str | None = None) -> Any:
    ins = "nisa.reciprocal"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    _tile(ins, "data", data, launch)
    _tile(ins, "dst", dst, launch)
    _same_layout(ins, "data", data, "dst", dst)
    if launch.compute:
        write(dst, torch.reciprocal(_flat(data)).reshape(dst.shape))
    return dst


def _reduce_axes(ins: str, data: NkiTensor, axis: Any) -> tuple[int, ...]:
    items = axis if isinstance(axis, (list, tuple, range)) else (axis,)
    axes = tuple(_int_immediate(ins, "axis", a) for a in items)  # "1" or 1.0 is refused, not coerced
    axes = tuple(a + data.ndim if a < 0 else a for a in axes)
    expected = tuple(range(data.ndim - len(axes), data.ndim))
    if not axes or sorted(axes) != list(expected) or 0 in axes:
        raise NkiValidationError("err-unsupported-reduce-axis", ins, f"axis {axis} of a {data.ndim}-D tile "
                                 f"{data.shape}", operand="axis", value=axis,
                                 limit="the last free dimensions, ending at the last one; never the partition "
                                 "dimension 0", hint="reduce across partitions with nisa.nc_transpose or a matmul "
                                 "against a ones vector")
    return tuple(sorted(axes))


def tensor_reduce(dst: NkiTensor, op: Any, data: NkiTensor, axis: Any, negate: bool = False,
                  keepdims: bool = False, name: str | None = None) -> Any:
    """Reduce the last free dimensions of `data` with `op` (Vector Engine)."""
    ins = "nisa.tensor_reduce"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    _tile(ins, "data", data, launch)
    _tile(ins, "dst", dst, launch)
    axes = _reduce_axes(ins, data, axis)
    kept = math.prod(data.shape[1:axes[0]])
    if dst.shape[0] != data.shape[0] or dst.free_size != kept:
        raise NkiValidationError("err-shape-mismatch", ins, f"dst {dst.shape} for reducing axes {axes} of "
                                 f"{data.shape}", operand="dst", value=dst.shape,
                                 limit=f"{data.shape[0]} partitions x {kept} elements")
    name_ = op_name(op)
    if name_ not in REDUCE:
        raise NkiValidationError("err-unsupported-operator", ins, f"reduction operator {name_}", operand="op",
                                 limit=", ".join(sorted(REDUCE)))
    if negate and name_ in BITVEC:
        raise NkiValidationError("err-unsupported-operator", ins, f"negate=True with bitvec operator {name_}",
                                 operand="negate", value=True, limit="negate only with an arithmetic operator",
                                 hint="negate with nisa.tensor_scalar(op0=nl.multiply, operand0=-1) after")
    cdt = _check_arith_dtypes(ins, name_, ("data", data))
    if name_ not in BITVEC:
        cdt = torch.float32  # AWS: arithmetic reductions cast to float32 and reduce in float32 math
    if launch.compute:
        x = read(data).to(cdt).flatten(axes[0])
        out = REDUCE[name_](x)
        if negate:
            out = -out
        write(dst, out.reshape(dst.shape))
    return dst


def tensor_partition_reduce(dst: NkiTensor, op: Any, data: NkiTensor, name: str | None = None) -> Any:
    """Reduce across partitions (GpSimd): dst has one partition."""
    ins = "nisa.tensor_partition_reduce"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    _tile(ins, "data", data, launch, (MemoryRegion.sbuf,))
    _tile(ins, "dst", dst, launch, (MemoryRegion.sbuf,))
    if dst.free_size != data.free_size:
        raise NkiValidationError("err-shape-mismatch", ins, f"dst {dst.shape} for data {data.shape}",
                                 operand="dst", limit=f"{data.free_size} elements per partition")
    name_ = op_name(op)
    if name_ not in _PARTITION_REDUCE:  # AWS tensor_partition_reduce: add, average, max, bitwise_or, bitwise_and
        raise NkiValidationError("err-unsupported-operator", ins, f"reduction operator {name_}", operand="op",
                                 value=name_, limit="nl.add, nl.average, nl.max, nl.bitwise_or or nl.bitwise_and")
    cdt = torch.int64 if name_ in BITVEC else torch.float32
    if name_ in BITVEC:
        _check_arith_dtypes(ins, name_, ("data", data))
    if launch.compute:
        out = REDUCE[name_](_flat(data, cdt).T)
        write(dst, out.reshape(dst.shape))
    return dst


def tensor_tensor_scan(dst: NkiTensor, data0: NkiTensor, data1: NkiTensor, initial: Any, op0: Any, op1: Any,
                       reverse0: bool = False, reverse1: bool = False, name: str | None = None) -> Any:
    """Per partition: ``r[i] = op1(op0(data0[i], r[i-1]), data1[i])`` from ``r[-1] = initial`` (Vector Engine)."""
    ins = "nisa.tensor_tensor_scan"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    for operand, t in (("data0", data0), ("data1", data1), ("dst", dst)):
        _tile(ins, operand, t, launch)
    _same_layout(ins, "data0", data0, "data1", data1)
    _same_layout(ins, "data0", data0, "dst", dst)
    _not_both_psum(ins, ("data0", "data1"), data0, data1)
    p = data0.shape[0]
    init = _vector_operand(ins, "initial", initial, p, launch)
    n0, n1 = op_name(op0), op_name(op1)
    for n in (n0, n1):
        if n not in BINARY or n in BITVEC:
            raise NkiValidationError("err-unsupported-operator", ins, f"{n} is not a binary arithmetic operator",
                                     operand="op0" if n == n0 else "op1")
    if launch.compute:
        a, b = _flat(data0), _flat(data1)
        state = init.reshape(p) if torch.is_tensor(init) else torch.full((p,), float(init))  # type: ignore[arg-type]
        out = torch.empty_like(a)
        f0, f1 = BINARY[n0], BINARY[n1]
        for i in range(a.shape[1]):
            t = f0(state, a[:, i]) if reverse0 else f0(a[:, i], state)
            state = f1(b[:, i], t) if reverse1 else f1(t, b[:, i])
            out[:, i] = state
        write(dst, out.reshape(dst.shape))
    return dst


def tensor_copy_predicated(dst: NkiTensor, src: Any, predicate: NkiTensor, reverse_pred: bool = False,
                           name: str | None = None) -> Any:
    """Copy `src` (tile or scalar) into `dst` where `predicate` is non-zero (or zero, with reverse_pred)."""
    ins = "nisa.tensor_copy_predicated"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    _tile(ins, "dst", dst, launch)
    _tile(ins, "predicate", predicate, launch)
    _same_layout(ins, "dst", dst, "predicate", predicate)
    if predicate.dtype not in ("uint8", "uint16", "uint32"):
        raise NkiValidationError("err-unsupported-dtype", ins, f"predicate {predicate.name!r} is {predicate.dtype}",
                                 operand="predicate", value=predicate.dtype, limit="uint8, uint16 or uint32",
                                 hint="compute the mask into a uint8 tile (a comparison with dst=uint8)")
    if isinstance(src, _NkiTensor) and src.dtype != dst.dtype:
        raise NkiValidationError("err-unsupported-dtype", ins, f"src is {src.dtype}, dst {dst.dtype}",
                                 operand="src", value=src.dtype, limit=f"the dtype of dst ({dst.dtype})",
                                 hint="cast with nisa.tensor_copy first")
    if isinstance(src, _NkiTensor):
        _tile(ins, "src", src, launch)
        _same_layout(ins, "dst", dst, "src", src)
        _not_both_psum(ins, ("src", "predicate"), src, predicate)
    if launch.compute:
        mask = _flat(predicate) != 0
        if reverse_pred:
            mask = ~mask
        native = _native(dst)  # src and dst share a dtype: the copy is bit-exact, integers included
        new = _flat(src, native) if isinstance(src, _NkiTensor) else torch.tensor(src).to(native).expand(mask.shape)
        write(dst, torch.where(mask, new, _flat(dst, native)).reshape(dst.shape))
    return dst


def _float_immediate(ins: str, operand: str, value: Any) -> float:
    """A compile-time number operand (int, float, NumPy scalar): a string, a tile or None is refused, not parsed."""
    if not isinstance(value, (str, bytes, bool, _NkiTensor)) and value is not None:
        try:
            return float(value)
        except (TypeError, ValueError):
            pass
    raise NkiValidationError("err-invalid-operand", ins, f"{operand} {value!r} is not a number", operand=operand,
                             value=value, limit="a compile-time float32 scalar", hint="pass a Python float")


def _pattern_values(ins: str, dst: NkiTensor, pattern: Any, offset: int, channel_multiplier: int) -> torch.Tensor:
    """The affine values of iota / affine_select in the engine's 32-bit integer arithmetic (AWS: "computed in 32-bit
    integer arithmetic", an int32 offset and channel_multiplier, a pattern of up to 4 [step, num] pairs)."""
    try:
        raw = [(s, n) for s, n in pattern]
    except (TypeError, ValueError):
        raise NkiValidationError("err-invalid-access-pattern", ins, f"pattern {pattern!r} is not a list of "
                                 "[step, num] pairs", operand="pattern", limit="up to 4 [step, num] pairs") from None
    pairs = [(_int_immediate(ins, "pattern", s), _int_immediate(ins, "pattern", n)) for s, n in raw]
    offset = _int_immediate(ins, "offset", offset)  # AWS: int32 immediates; 0.25 is refused, not truncated
    channel_multiplier = _int_immediate(ins, "channel_multiplier", channel_multiplier)
    if len(pairs) > 4:
        raise NkiValidationError("err-invalid-access-pattern", ins, f"pattern {pattern} has {len(pairs)} dimensions",
                                 operand="pattern", value=len(pairs), limit="up to 4 [step, num] pairs")
    for operand, number in (("offset", offset), ("channel_multiplier", channel_multiplier),
                            *(("pattern", step) for step, _ in pairs)):
        if not _INT32_MIN <= int(number) <= _INT32_MAX:
            raise NkiValidationError("err-invalid-operand", ins, f"{operand} {number} is not an int32", operand=operand,
                                     value=number, limit=f"[{_INT32_MIN}, {_INT32_MAX}]")
    count = math.prod(n for _, n in pairs)
    if count != dst.free_size:
        raise NkiValidationError("err-shape-mismatch", ins, f"pattern {pattern} has {count} elements per "
                                 f"partition, dst {dst.shape} {dst.free_size}", operand="pattern",
                                 limit=dst.free_size)
    values = torch.full((), int(offset), dtype=torch.int64)
    for i, (step, n) in enumerate(pairs):
        shape = [1] * len(pairs)
        shape[i] = n
        values = values + (torch.arange(n, dtype=torch.int64) * step).reshape(shape)
    values = values.reshape(1, -1) + (torch.arange(dst.shape[0], dtype=torch.int64) * int(channel_multiplier))[:, None]
    return (values - _INT32_MIN) % (1 << 32) + _INT32_MIN  # wraps around as 32-bit integers do


_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


def iota(dst: NkiTensor, pattern: Any, offset: int = 0, channel_multiplier: int = 0, name: str | None = None) -> Any:
    """``dst[p, i] = offset + p * channel_multiplier + sum(step_k * i_k)`` (GpSimd, int32 arithmetic)."""
    ins = "nisa.iota"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    _tile(ins, "dst", dst, launch, (MemoryRegion.sbuf,))
    values = _pattern_values(ins, dst, pattern, offset, channel_multiplier)
    if launch.compute:
        write(dst, values.reshape(dst.shape))
    return dst


def affine_select(dst: NkiTensor, pattern: Any, channel_multiplier: int, on_true_tile: NkiTensor,
                  on_false_value: float, cmp_op: Any = None, offset: int = 0, name: str | None = None) -> Any:
    """``dst = on_true_tile where cmp_op(affine value, 0) else on_false_value`` (e.g. a causal mask)."""
    ins = "nisa.affine_select"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    _tile(ins, "dst", dst, launch, (MemoryRegion.sbuf,))
    _tile(ins, "on_true_tile", on_true_tile, launch, (MemoryRegion.sbuf,))
    _same_layout(ins, "on_true_tile", on_true_tile, "dst", dst)
    values = _pattern_values(ins, dst, pattern, offset, channel_multiplier)
    on_false_value = _float_immediate(ins, "on_false_value", on_false_value)  # AWS: "must be float32"
    cmp = op_name(cmp_op) if cmp_op is not None else "equal"
    if launch.compute:
        mask = _binary(cmp, values.to(torch.float32), 0.0) != 0
        # AWS: on_true_tile goes through float32 only when its dtype differs from dst's
        cdt = _native(dst) if on_true_tile.dtype == dst.dtype else torch.float32
        out = torch.where(mask, _flat(on_true_tile, cdt), torch.tensor(float(on_false_value)).to(cdt))
        write(dst, out.reshape(dst.shape))
    return dst


# --------------------------------------------------------------------------------------------- tensor engine

_MATMUL_DTYPES = {"float8_e4m3", "float8_e5m2", "bfloat16", "float16", "tfloat32", "float32"}


def nc_matmul(dst: NkiTensor, stationary: NkiTensor, moving: NkiTensor, is_stationary_onezero: bool = False,
              is_moving_onezero: bool = False, is_transpose: bool = False, accumulate: bool | None = None,
              tile_position: Any = (), tile_size: Any = (), perf_mode: Any = None, name: str | None = None) -> Any:
    """``dst = stationary.T @ moving`` on the Tensor Engine: SBUF in, PSUM out, float32 accumulation."""
    ins = "nisa.nc_matmul"
    launch = _begin(ins)
    target = launch.target
    _ensure_dst(ins, dst)
    for operand, t in (("stationary", stationary), ("moving", moving)):
        if isinstance(t, _NkiTensor) and t.buffer is not MemoryRegion.sbuf:
            raise NkiValidationError("err-unsupported-memory", ins, f"is {t.name!r} in {t.buffer.value}: the "
                                     "Tensor Engine reads its operands from SBUF", operand=operand,
                                     value=t.buffer.value, limit="sbuf",
                                     hint="copy the operand into an SBUF tile first")
        _tile(ins, operand, t, launch, (MemoryRegion.sbuf,))
    if isinstance(dst, _NkiTensor) and dst.buffer is not MemoryRegion.psum:
        raise NkiValidationError("err-unsupported-memory", ins, f"is {dst.name!r} in {dst.buffer.value}: the "
                                 "Tensor Engine writes to PSUM", operand="dst", value=dst.buffer.value,
                                 limit="psum", hint="allocate dst with buffer=nl.psum, then nisa.tensor_copy it "
                                 "to SBUF")
    _tile(ins, "dst", dst, launch, (MemoryRegion.psum,))
    double_row = _perf_mode_name(perf_mode) == "double_row"
    k, m, n = stationary.shape[0], stationary.free_size, moving.free_size
    if double_row:
        _check_double_row(ins, stationary, moving, launch, tile_size)
        m, n = m // 2, n // 2  # the first free dimension (2) is the second half of the contraction
    rows, cols = _check_tiling(ins, tile_position, tile_size, launch)
    if moving.shape[0] != k:
        raise NkiValidationError("err-matmul-partition-mismatch", ins, f"stationary has {k} partitions, moving "
                                 f"{moving.shape[0]}: the contraction runs over the partition dimension of both",
                                 operand="moving", value=moving.shape[0], limit=k)
    if k > rows:
        raise NkiValidationError("err-size-of-dimension-exceed-arch-limit", ins, f"contraction (partition) size {k}",
                                 operand="stationary", value=k, limit=f"{rows} rows of the systolic array")
    if m > cols:
        raise NkiValidationError(
            "err-matmul-stationary-fmax", ins, f"free size of {stationary.name!r} {stationary.shape} is {m}",
            operand="stationary", value=m, limit=f"{cols} (nl.tile_size.gemm_stationary_fmax)",
            hint="tile the stationary free dimension (the output's partition dimension) in chunks of 128")
    moving_max = target.gemm_moving_fmax
    what = "nl.tile_size.gemm_moving_fmax, one PSUM bank of float32"
    if target.nc_version >= 4:
        moving_max = 4096 if dst.dtype == "float32" else 8192
        what = f"8 PSUM banks of {dst.dtype} on {target.name}"
    if n > moving_max:
        raise NkiValidationError(
            "err-matmul-moving-fmax", ins, f"free size of {moving.name!r} {moving.shape} is {n}", operand="moving",
            value=n, limit=f"{moving_max} ({what})", hint=f"tile the moving free dimension in chunks of {moving_max}")
    if dst.shape[0] != m or dst.free_size != n:
        raise NkiValidationError("err-shape-mismatch", ins, f"dst {dst.shape} for stationary {stationary.shape} and "
                                 f"moving {moving.shape}", operand="dst", value=dst.shape,
                                 limit=f"{m} partitions x {n} elements")
    allowed = _MATMUL_DTYPES | ({"float8_e4m3fn"} if target.nc_version >= 4 else set())
    for operand, t in (("stationary", stationary), ("moving", moving)):
        if t.dtype not in allowed:
            raise NkiValidationError("err-unsupported-dtype", ins, f"{t.name!r} is {t.dtype}", operand=operand,
                                     value=t.dtype, limit=", ".join(sorted(allowed)))
    if {stationary.dtype, moving.dtype} == {"float8_e4m3", "float8_e4m3fn"}:
        raise NkiValidationError("err-unsupported-dtype", ins, f"stationary is {stationary.dtype}, moving "
                                 f"{moving.dtype}: legacy float8_e4m3 and OCP float8_e4m3fn cannot be mixed in "
                                 "one matmul", operand="moving", value=moving.dtype, limit=stationary.dtype)
    wide = {"float32", "tfloat32"}
    if (stationary.dtype in wide) != (moving.dtype in wide):
        raise NkiValidationError("err-unsupported-dtype", ins, f"stationary is {stationary.dtype}, moving "
                                 f"{moving.dtype}: a float32/tfloat32 operand needs a float32/tfloat32 partner",
                                 operand="moving", value=moving.dtype, limit="float32 or tfloat32" if
                                 stationary.dtype in wide else "not float32/tfloat32 (as stationary)")
    dst_ok = {"float32"} | ({"bfloat16"} if target.nc_version >= 4 else set())
    if is_transpose:
        dst_ok = dst_ok | {stationary.dtype}
    if dst.dtype not in dst_ok:
        raise NkiValidationError("err-matmul-dst-dtype", ins, f"dst {dst.name!r} is {dst.dtype} on {target.name}",
                                 operand="dst", value=dst.dtype, limit=" or ".join(sorted(dst_ok)),
                                 hint="allocate the PSUM tile as nl.float32 and cast when copying it out")
    if not launch.compute:
        return dst
    dst = resolve(dst)
    s = read(stationary).reshape(-1, m).to(torch.float32)  # double_row: (2k, m), contraction over (p, row)
    mv = read(moving).reshape(-1, n).to(torch.float32)
    if is_transpose and target.nc_version >= 3 and _is_identity(mv):
        result = s.T.contiguous()  # v3+ transpose mode: bit-accurate, NaN and Inf pass through
    else:
        result = s.T @ mv  # v2 only labels the instruction; any other moving operand multiplies
    st = dst.storage
    acc = st.acc.as_strided(dst.shape, dst.strides, dst.offset)  # type: ignore[union-attr]
    flags = acc.reshape(m, n)
    whole = covers(dst)
    all_set = (whole and st.acc_full) or bool(flags.all())
    if accumulate is True and not all_set and not _value_initialized(st, dst, flags):
        v4 = target.nc_version >= 4
        raise NkiValidationError("err-psum-accumulate-uninitialized", ins, f"accumulate=True into PSUM {dst.name!r} "
                                 f"that no {'instruction' if v4 else 'matmul'} has written since it was allocated"
                                 f"{'' if v4 else ' or overwritten'}", operand="accumulate",
                                 limit="PSUM a matmul or another instruction (memset, tensor_copy) wrote" if v4 else
                                 f"PSUM a matmul wrote (a memset or tensor_copy does not count on {target.name})",
                                 hint="start the group with accumulate=False (or leave "
                                 "accumulate=None: first write overwrites, later ones accumulate)")
    prepare_write(dst)
    target_view = st.data.as_strided(dst.shape, dst.strides, dst.offset)  # type: ignore[union-attr]
    every = accumulate is True or (accumulate is None and all_set)
    if every and dst.dtype == "float32":
        target_view.add_(result.reshape(dst.shape))  # the whole group accumulates: one in-place float32 add
    else:
        if accumulate is False or (not every and not bool(flags.any())):
            new = result
        elif every:
            new = _flat(dst) + result
        else:
            new = torch.where(flags, _flat(dst) + result, result)
        target_view.copy_(_dtypes.round_to(new.reshape(dst.shape), dst.dtype))
    if not (whole and st.acc_full):
        acc.fill_(True)
    st.acc_full = st.acc_full or whole
    st.written = True
    return dst


def _value_initialized(st: Any, dst: NkiTensor, flags: torch.Tensor) -> bool:
    """NeuronCore-v4: whether every element of `dst` holds a value some instruction wrote. AWS nc_matmul: "On
    NeuronCore-v2 and NeuronCore-v3, matmul accumulating into a PSUM location that was value-initialized by a
    non-matmul instruction (e.g., memset, tensor_copy) is not supported", so v4 accumulates onto it; onto a location
    nothing wrote, accumulate=True is "undefined behavior on all targets"."""
    if st.init is None:  # trn1/trn2: only a matmul opens an accumulation group
        return False
    written = st.init.as_strided(dst.shape, dst.strides, dst.offset).reshape(flags.shape)
    return bool((flags | written).all())


def _perf_mode_name(perf_mode: Any) -> str:
    if perf_mode is None:
        return "none"
    return str(getattr(perf_mode, "value", perf_mode))


def _check_double_row(ins: str, stationary: NkiTensor, moving: NkiTensor, launch: Launch, tile_size: Any) -> None:
    """AWS nc_matmul: FP8 double-row mode from NeuronCore-v3, operands [K, 2, ...], no column tiling."""
    target = launch.target
    if target.nc_version < 3:
        raise NkiValidationError("err-unsupported-feature", ins, f"perf_mode=double_row on {target.name}: "
                                 "NeuronCore-v2 has no performance mode", operand="perf_mode", value="double_row",
                                 limit="NeuronCore-v3 or newer")
    fp8 = {"float8_e4m3", "float8_e5m2"} | ({"float8_e4m3fn"} if target.nc_version >= 4 else set())
    for operand, t in (("stationary", stationary), ("moving", moving)):
        if t.dtype not in fp8:
            raise NkiValidationError("err-unsupported-dtype", ins, f"perf_mode=double_row with {operand} "
                                     f"{t.dtype}", operand=operand, value=t.dtype, limit=", ".join(sorted(fp8)),
                                     hint="double_row is the FP8 double-performance mode")
        if t.ndim < 3 or t.shape[1] != 2:
            raise NkiValidationError("err-shape-mismatch", ins, f"perf_mode=double_row needs {operand} as "
                                     f"[K, 2, ...], got {t.shape}", operand=operand, value=t.shape,
                                     limit="first free dimension of size 2")
    if tile_size and _int_immediate(ins, "tile_size", tile_size[1]) != 128:
        raise NkiValidationError("err-unsupported-feature", ins, "perf_mode=double_row with column tiling",
                                 operand="tile_size", value=tuple(tile_size), limit="column_size 128")


def _check_tiling(ins: str, tile_position: Any, tile_size: Any, launch: Launch) -> tuple[int, int]:
    """AWS nc_matmul tiling mode: rows/columns of 128, 64 (v2+) or 32 (v3+); positions multiples of the size."""
    target = launch.target
    if not tile_size:
        if tile_position and any(_int_immediate(ins, "tile_position", v) for v in tile_position):
            raise NkiValidationError("err-unsupported-feature", ins, f"tile_position {tuple(tile_position)} without "
                                     "tile_size", operand="tile_size", hint="set both to enable tiling mode")
        return target.pmax, target.gemm_stationary_fmax
    sizes = (64, 128) if target.nc_version == 2 else (32, 64, 128)
    if len(tile_size) != 2:
        raise NkiValidationError("err-invalid-operand", ins, f"tile_size {tile_size!r}", operand="tile_size",
                                 value=tile_size, limit="(row_size, column_size)")
    row_size, col_size = (_int_immediate(ins, "tile_size", v) for v in tile_size)
    for what, value in (("row_size", row_size), ("column_size", col_size)):
        if value not in sizes:
            raise NkiValidationError("err-unsupported-feature", ins, f"tile_size {what} {value} on {target.name}",
                                     operand="tile_size", value=value, limit=" or ".join(map(str, sizes)) +
                                     (" (NeuronCore-v2 has 2 x 64 row tiles)" if target.nc_version == 2 else ""))
    position = tuple(_int_immediate(ins, "tile_position", v) for v in tile_position) if tile_position else (0, 0)
    for what, start, size in (("start_row", position[0], row_size), ("start_column", position[1], col_size)):
        if start % size or not 0 <= start < 128:
            raise NkiValidationError("err-unsupported-feature", ins, f"tile_position {what} {start} for a "
                                     f"{what.split('_')[1]} size of {size}", operand="tile_position", value=start,
                                     limit=f"a multiple of {size} below 128")
    return row_size, col_size


def _is_identity(values: torch.Tensor) -> bool:
    return values.shape[0] == values.shape[1] and bool(torch.equal(values, torch.eye(values.shape[0])))


def nc_transpose(dst: NkiTensor, data: NkiTensor, engine: engine = engine.unknown, name: str | None = None) -> Any:
    """Swap partition and free dims: Tensor Engine (SBUF -> PSUM, up to 128x128) or Vector Engine (up to 32x32)."""
    ins = "nisa.nc_transpose"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    _tile(ins, "data", data, launch)
    _tile(ins, "dst", dst, launch)
    use_tensor = engine is _TENSOR or (engine is _UNKNOWN and data.buffer is MemoryRegion.sbuf
                                       and dst.buffer is MemoryRegion.psum)
    p, f = data.shape[0], data.free_size
    if use_tensor:
        if data.buffer is not MemoryRegion.sbuf or dst.buffer is not MemoryRegion.psum:
            raise NkiValidationError("err-unsupported-memory", ins, "the Tensor Engine transposes SBUF into PSUM",
                                     operand="dst" if data.buffer is MemoryRegion.sbuf else "data",
                                     limit="data in sbuf, dst in psum")
        limit = launch.target.gemm_stationary_fmax
    else:
        limit = 32
    if p > limit or f > limit:
        raise NkiValidationError(
            "err-transpose-size", ins, f"{data.name!r} is {p} x {f} on the {'Tensor' if use_tensor else 'Vector'} "
            "Engine", operand="data", value=(p, f), limit=f"{limit} x {limit}",
            hint="transpose 128x128 blocks on the Tensor Engine (dst in PSUM), or split the tile")
    if dst.shape[0] != f or dst.free_size != p:
        raise NkiValidationError("err-shape-mismatch", ins, f"dst {dst.shape} for the transpose of {data.shape}",
                                 operand="dst", value=dst.shape, limit=f"{f} partitions x {p} elements")
    if dst.dtype != data.dtype:
        raise NkiValidationError("err-unsupported-dtype", ins, f"dst is {dst.dtype}, data {data.dtype}",
                                 operand="dst", value=dst.dtype, limit=data.dtype)
    if launch.compute:
        values = read(data).reshape(p, f)
        if use_tensor and launch.target.nc_version == 2 and values.is_floating_point() and \
                not bool(torch.isfinite(values).all()):
            # AWS: on NeuronCore-v2 the Tensor Engine transposes by a matmul with the identity, not bit-accurate
            # with NaN/Inf (they spread along the output row); from v3 every transpose is bit-accurate
            values = (values.to(torch.float32).T @ torch.eye(p)).T
        write(dst, values.T.reshape(dst.shape))
    return dst


def new_tile(shape: Any, dtype: Any, buffer: MemoryRegion = MemoryRegion.sbuf) -> NkiTensor:
    return allocate(shape, dtype, buffer)


def scalar_tensor_tensor(dst: NkiTensor, data: NkiTensor, op0: Any, operand0: Any, op1: Any, operand1: NkiTensor,
                         reverse0: bool = False, reverse1: bool = False, name: str | None = None) -> Any:
    """``dst = (data op0 operand0) op1 operand1`` on the Vector Engine, float32 math, arithmetic operators only."""
    ins = "nisa.scalar_tensor_tensor"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    for operand, t in (("data", data), ("operand1", operand1), ("dst", dst)):
        _tile(ins, operand, t, launch)
    _same_layout(ins, "data", data, "operand1", operand1)
    _same_layout(ins, "data", data, "dst", dst)
    _not_both_psum(ins, ("data", "operand1"), data, operand1)
    n0, n1 = op_name(op0), op_name(op1)
    for operand, n in (("op0", n0), ("op1", n1)):
        _check_op_target(ins, n, launch, operand)
        if n in BITVEC or n not in BINARY:
            raise NkiValidationError("err-unsupported-operator", ins, f"{n} is not an arithmetic binary operator",
                                     operand=operand, value=n, limit="arithmetic ALU operators (no bitvec)")
    v0 = _vector_operand(ins, "operand0", operand0, data.shape[0], launch)
    if launch.compute:
        x = _apply(n0, _flat(data), v0, reverse0)
        x = _apply(n1, x, _flat(operand1), reverse1)
        write(dst, x.reshape(dst.shape))
    return dst


_REDUCE_IDENTITY = {"add": 0.0, "multiply": 1.0, "maximum": -math.inf, "minimum": math.inf}


def tensor_scalar_reduce(dst: NkiTensor, data: NkiTensor, op0: Any, operand0: Any, reduce_op: Any,
                         reduce_res: NkiTensor | None = None, reverse0: bool = False,
                         reduce_cmd: reduce_cmd = reduce_cmd.reset_reduce, reduce_init: Any = None,
                         reduce_res_negate: bool = False, name: str | None = None) -> Any:
    """``dst = data op0 operand0`` and its reduction over every free axis into the Vector Engine's accumulators."""
    ins = "nisa.tensor_scalar_reduce"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    _tile(ins, "data", data, launch)
    _tile(ins, "dst", dst, launch)
    _same_layout(ins, "data", data, "dst", dst)
    n0, red = op_name(op0), op_name(reduce_op)
    _check_op_target(ins, n0, launch, "op0")
    if n0 in BITVEC:
        raise NkiValidationError("err-unsupported-operator", ins, f"bitvec operator {n0}", operand="op0", value=n0,
                                 limit="an arithmetic operator")
    if red not in _REDUCE_IDENTITY:
        raise NkiValidationError("err-unsupported-operator", ins, f"reduce_op {red}", operand="reduce_op", value=red,
                                 limit="nl.add, nl.multiply, nl.max or nl.min")
    if reverse0:
        raise NkiValidationError("err-unsupported-feature", ins, "reverse0 is documented as not supported yet",
                                 operand="reverse0", value=True, limit="False")
    if reduce_cmd not in (_RESET_REDUCE, _REDUCE, _LOAD_REDUCE):
        raise NkiValidationError("err-unsupported-feature", ins, f"reduce_cmd {reduce_cmd}", operand="reduce_cmd",
                                 limit="reset_reduce, reduce or load_reduce")
    if (reduce_init is not None) != (reduce_cmd is _LOAD_REDUCE):
        raise NkiValidationError("err-invalid-operand", ins, "reduce_init goes with reduce_cmd=load_reduce, and only "
                                 "with it", operand="reduce_init")
    p = data.shape[0]
    v0 = _vector_operand(ins, "operand0", operand0, p, launch)
    init = _vector_operand(ins, "reduce_init", reduce_init, p, launch)
    _reduce_res_tile(ins, reduce_res, p, launch)
    if not launch.compute:
        return dst
    x = _apply(n0, _flat(data), v0, False)
    write(dst, x.reshape(dst.shape))
    if launch.vector_regs is None:
        launch.vector_regs = torch.full((launch.target.pmax,), float("nan"))
    regs = launch.vector_regs
    if reduce_cmd is _RESET_REDUCE:
        regs[:p] = _REDUCE_IDENTITY[red]
    elif reduce_cmd is _LOAD_REDUCE:
        regs[:p] = init.reshape(p) if torch.is_tensor(init) else float(init)  # type: ignore[arg-type]
    regs[:p] = REDUCE[red](torch.cat([regs[:p, None], x], dim=1))
    if reduce_res is not None:
        write(reduce_res, (-regs[:p] if reduce_res_negate else regs[:p]).reshape(reduce_res.shape))
    return dst


_LOAD_REDUCE = reduce_cmd.load_reduce


def nonzero_with_count(dst: NkiTensor, src: NkiTensor, index_offset: int = 0, padding_val: int = -1,
                       name: str | None = None) -> Any:
    """Per GpSimd core (partitions 0, 16, ..., 112 only): the indices of src's non-zero elements plus
    `index_offset`, then `padding_val`, then the count, into int32 `dst` (one element wider than src)."""
    ins = "nisa.nonzero_with_count"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    if launch.target.nc_version < 3:
        raise NkiValidationError("err-unsupported-feature", ins, f"not on {launch.target.name}", operand="dst",
                                 limit="NeuronCore-v3 or newer")
    _tile(ins, "src", src, launch, (MemoryRegion.sbuf,))
    _tile(ins, "dst", dst, launch, (MemoryRegion.sbuf,))
    if src.dtype not in ("float32", "int32"):
        raise NkiValidationError("err-unsupported-dtype", ins, f"src is {src.dtype}", operand="src", value=src.dtype,
                                 limit="float32 or int32")
    if dst.dtype != "int32":
        raise NkiValidationError("err-unsupported-dtype", ins, f"dst is {dst.dtype}", operand="dst", value=dst.dtype,
                                 limit="int32")
    if dst.shape[0] != src.shape[0] or dst.free_size != src.free_size + 1:
        raise NkiValidationError("err-shape-mismatch", ins, f"dst {dst.shape} for src {src.shape}", operand="dst",
                                 value=dst.shape, limit=f"{src.shape[0]} partitions x {src.free_size + 1} elements")
    if launch.compute:
        values = _flat(src, _native(src))
        out = _flat(dst, torch.int64)
        n = src.free_size
        for p in range(0, src.shape[0], 16):  # each of the 8 GpSimd cores reads and writes its first partition
            found = torch.nonzero(values[p] != 0).reshape(-1) + int(index_offset)
            row = torch.full((n + 1,), int(padding_val), dtype=torch.int64)
            row[:found.numel()] = found
            row[n] = found.numel()
            out[p] = row
        write(dst, out.reshape(dst.shape))
    return dst


class dma_engine(enum.Enum):  # noqa: N801 - the NKI API's name
    """DMA transfer engines (accepted as ``engine=`` of the DMA instructions; one queue here)."""

    dma = 1
    gpsimd_dma = 2


_ACTIVATE2_STAGES = {("multiply", "add"), ("multiply", "subtract"), ("multiply", "bypass"), ("add", "bypass"),
                     ("subtract", "bypass"), ("bypass", "bypass")}
_ACTIVATE2_REDUCE = {"add": 0.0, "maximum": -math.inf, "minimum": math.inf, "abs_max": 0.0, "abs_min": math.inf}


def activate2(dst: NkiTensor, op: Any, data: NkiTensor, imm0: Any, imm1: Any, op0: Any, op1: Any,
              relu_param: Any = 0.0, reverse0: bool = False, reverse1: bool = False, reduce_op: Any = None,
              reduce_res: NkiTensor | None = None, reduce_cmd: reduce_cmd = reduce_cmd.idle,
              name: str | None = None) -> Any:
    """trn3's Scalar Engine pipeline: ``op((data op0 imm0) op1 imm1)``, then an optional reduction into the
    engine's accumulators (shared with ``activation``), float32 math."""
    ins = "nisa.activate2"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    if launch.target.nc_version < 4:
        raise NkiValidationError("err-unsupported-feature", ins, f"not on {launch.target.name}", operand="op",
                                 limit="NeuronCore-v4 (trn3) or newer", hint="use nisa.activation")
    _tile(ins, "data", data, launch)
    _tile(ins, "dst", dst, launch)
    _same_layout(ins, "data", data, "dst", dst)
    n0, n1 = op_name(op0), op_name(op1)
    if (n0, n1) not in _ACTIVATE2_STAGES:
        raise NkiValidationError("err-unsupported-operator", ins, f"op0={n0}, op1={n1}", operand="op0",
                                 value=(n0, n1), limit="multiply+add, multiply+subtract, multiply, add, subtract "
                                 "or bypass+bypass")
    if (reverse0 and n0 == "bypass") or (reverse1 and n1 == "bypass"):
        raise NkiValidationError("err-invalid-operand", ins, "a reverse flag for a bypassed operator",
                                 operand="reverse0" if reverse0 and n0 == "bypass" else "reverse1")
    red = op_name(reduce_op) if reduce_op is not None else None
    if red is not None and red not in _ACTIVATE2_REDUCE:
        raise NkiValidationError("err-unsupported-operator", ins, f"reduce_op {red}", operand="reduce_op", value=red,
                                 limit="nl.add, nl.maximum, nl.minimum, nl.abs_max or nl.abs_min")
    p = data.shape[0]
    v0 = _vector_operand(ins, "imm0", imm0, p, launch)
    v1 = _vector_operand(ins, "imm1", imm1, p, launch)
    alpha = _vector_operand(ins, "relu_param", relu_param, p, launch)
    _reduce_res_tile(ins, reduce_res, p, launch)
    if not launch.compute:
        return dst
    x = _flat(data)
    if n0 != "bypass":
        x = _apply(n0, x, v0, reverse0)
    if n1 != "bypass":
        x = _apply(n1, x, v1, reverse1)
    fn = op_name(op)
    out = torch.where(x > 0, x, x * alpha) if fn == "prelu" else _unary(fn, x)  # type: ignore[operator]
    write(dst, out.reshape(dst.shape))
    regs = _regs(launch)
    if reduce_cmd in (_RESET, _RESET_REDUCE):
        regs[:p] = _ACTIVATE2_REDUCE.get(red or "add", 0.0)
    if reduce_cmd in (_REDUCE, _RESET_REDUCE) and red is not None:
        regs[:p] = _fold(red, torch.cat([regs[:p, None], out], dim=1))
    if reduce_res is not None:
        write(reduce_res, regs[:p].reshape(reduce_res.shape))
    return dst


def _fold(name: str, values: torch.Tensor) -> torch.Tensor:
    """``acc = reduce_op(acc, v)`` along each row, the accumulator first (abs_max/abs_min keep the later of a tie)."""
    if name in ("abs_max", "abs_min"):
        mags = values.abs()
        best = mags.amax(dim=1, keepdim=True) if name == "abs_max" else mags.amin(dim=1, keepdim=True)
        hits = (mags == best).to(torch.int64) * torch.arange(1, values.shape[1] + 1)
        return values.gather(1, (hits.argmax(dim=1, keepdim=True))).reshape(-1)
    return REDUCE[name](values)


def dma_compute(dst: NkiTensor, srcs: Any, reduce_op: Any, scales: Any = None, unique_indices: bool = True,
                oob_mode: oob_mode = oob_mode.error, name: str | None = None) -> Any:
    """``dst = srcs[0] * scales[0] + srcs[1] * scales[1] + ...`` in the DMA engines' float32 math; a source with
    ``vector_offset`` gives the documented read-modify-write gather or scatter (HBM or SBUF, never PSUM)."""
    ins = "nisa.dma_compute"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    sources = list(srcs) if isinstance(srcs, (list, tuple)) else [srcs]
    dma_regions = (MemoryRegion.sbuf, *HBM)
    for operand, t in (("dst", dst), *((f"srcs[{i}]", t) for i, t in enumerate(sources))):
        if isinstance(t, _NkiTensor) and t.buffer is MemoryRegion.psum:
            raise NkiValidationError("err-dma-psum", ins, f"is {t.name!r} in PSUM", operand=operand, value="psum",
                                     limit="hbm or sbuf")
        _tile(ins, operand, t, launch, dma_regions)
        _one_index_per_row(ins, operand, t)
        if t.size != dst.size:
            raise NkiValidationError("err-shape-mismatch", ins, f"{operand} {t.shape} for dst {dst.shape}",
                                     operand=operand, value=t.size, limit=dst.size)
    if op_name(reduce_op) != "add":
        raise NkiValidationError("err-unsupported-operator", ins, f"reduce_op {op_name(reduce_op)}",
                                 operand="reduce_op", limit="nl.add")
    factors = [1.0] * len(sources) if scales is None else [float(f) for f in scales]
    if len(factors) != len(sources) or any(f != 1.0 for f in factors):
        raise NkiValidationError("err-unsupported-feature", ins, f"scales {scales}", operand="scales",
                                 limit="all 1.0 (or None), one per source")
    indirect = any(t.gather is not None for t in (dst, *sources))
    if indirect and (len(sources) != 2 or not unique_indices):
        raise NkiValidationError("err-unsupported-feature", ins, "read-modify-write with vector_offset",
                                 operand="srcs", limit="exactly 2 sources and unique_indices=True")
    if launch.compute:
        total = sum(read(t).to(torch.float32).reshape(dst.shape) for t in sources)
        write(dst, total, skip_oob=oob_mode is not _OOB_ERROR)  # type: ignore[arg-type]
    return dst


def nc_stream_shuffle(dst: NkiTensor, src: NkiTensor, shuffle_mask: Any, name: str | None = None) -> Any:
    """Within each quadrant of 32 partitions, output partition i copies input partition ``shuffle_mask[i]``
    (255: left unmodified); the same mask for every quadrant (Vector Engine, SBUF or PSUM, in place allowed)."""
    ins = "nisa.nc_stream_shuffle"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    _tile(ins, "src", src, launch)
    _tile(ins, "dst", dst, launch)
    if dst.dtype != src.dtype:
        raise NkiValidationError("err-unsupported-dtype", ins, f"dst is {dst.dtype}, src {src.dtype}", operand="dst",
                                 value=dst.dtype, limit=src.dtype)
    if dst.free_size != src.free_size:
        raise NkiValidationError("err-shape-mismatch", ins, f"dst {dst.shape} for src {src.shape}", operand="dst",
                                 value=dst.free_size, limit=f"{src.free_size} elements per partition")
    mask = [int(m) for m in shuffle_mask]
    if len(mask) != 32 or any(not (0 <= m < 32 or m == 255) for m in mask):
        raise NkiValidationError("err-invalid-operand", ins, f"shuffle_mask {mask}", operand="shuffle_mask",
                                 limit="32 entries, each a partition 0..31 of the quadrant or 255 (unmodified)")
    active = -(-max(src.shape[0], dst.shape[0]) // 32) * 32
    starts = {128: (0,), 96: (0,), 64: (0, 64), 32: (0, 32, 64, 96)}[active]
    for operand, t in (("src", src), ("dst", dst)):
        first = (resolve(t) if launch.compute else t).offset // max(t.storage.free, 1)
        if first not in starts:
            raise NkiValidationError("err-unsupported-feature", ins, f"{operand} starts at partition {first} with "
                                     f"{active} active partitions", operand=operand, value=first,
                                     limit=" or ".join(map(str, starts)))
    if launch.compute:
        values = _flat(src, _native(src))
        out = _flat(dst, _native(dst)).clone()
        for p in range(dst.shape[0]):
            quadrant, lane = divmod(p, 32)
            source = quadrant * 32 + mask[lane]
            if mask[lane] != 255 and source < src.shape[0]:
                out[p] = values[source]
        write(dst, out.reshape(dst.shape))
    return dst


# --------------------------------------------------------------------------------------------- search and statistics
# aws-neuron/aws-neuron-sdk nki/api/nki/isa/__init__.py (NKI 0.6): max8, nc_find_index8, nc_match_replace8,
# bn_stats, bn_aggr, tensor_scalar_cumulative, exponential, nc_n_gather, select_reduce, range_select


def _free_elements(ins: str, operand: str, t: NkiTensor, low: int, high: int) -> None:
    if not low <= t.free_size <= high:
        raise NkiValidationError("err-size-of-dimension-exceed-arch-limit", ins, f"{operand} {t.shape} has "
                                 f"{t.free_size} elements per partition", operand=operand, value=t.free_size,
                                 limit=f"{low} to {high} elements per partition")


def _eight_wide(ins: str, operand: str, t: NkiTensor, partitions: int) -> None:
    if t.shape[0] != partitions or t.free_size != 8:
        raise NkiValidationError("err-shape-mismatch", ins, f"{operand} {t.shape}", operand=operand, value=t.shape,
                                 limit=f"({partitions}, 8): 8 elements per partition")


def max8(dst: NkiTensor, src: NkiTensor, name: str | None = None) -> Any:
    """The 8 largest values of each partition of `src` (8 to 16,384 elements), in descending order, compared in
    float32 (Vector Engine)."""
    ins = "nisa.max8"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    _tile(ins, "src", src, launch)
    _tile(ins, "dst", dst, launch)
    _free_elements(ins, "src", src, 8, 16384)
    _eight_wide(ins, "dst", dst, src.shape[0])
    if launch.compute:
        top = torch.topk(_flat(src), 8, dim=1, largest=True, sorted=True).values
        write(dst, top.reshape(dst.shape))
    return dst


_INDEX8_DTYPES = {"uint16": 0xFFFF, "uint32": 0xFFFFFFFF}


def _match8(data: torch.Tensor, vals: torch.Tensor, order: range) -> torch.Tensor:
    """Per partition, the position of each of the 8 `vals` in `data`, taken in `order`: each value claims the first
    position equal to it that no value before it in `order` claimed (-1 where none is left)."""
    found = torch.full(vals.shape, -1, dtype=torch.int64)
    claimed = torch.zeros(data.shape, dtype=torch.bool)
    columns = torch.arange(data.shape[1])
    for i in order:
        hits = (data == vals[:, i:i + 1]) & ~claimed
        any_hit = hits.any(dim=1)
        first = torch.where(hits, columns, data.shape[1]).amin(dim=1)
        found[:, i] = torch.where(any_hit, first, -1)
        rows = torch.nonzero(any_hit).reshape(-1)
        claimed[rows, first[rows]] = True
    return found


def nc_find_index8(dst: NkiTensor, data: NkiTensor, vals: NkiTensor, name: str | None = None) -> Any:
    """Per partition, the index of the first occurrence in `data` of each of the 8 `vals` (uint16/uint32 `dst`;
    all ones where a value is absent; repeated values take successive occurrences, in ascending order)."""
    ins = "nisa.nc_find_index8"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    for operand, t in (("data", data), ("vals", vals), ("dst", dst)):
        _tile(ins, operand, t, launch)
    _free_elements(ins, "data", data, 8, 16384)
    _eight_wide(ins, "vals", vals, data.shape[0])
    _eight_wide(ins, "dst", dst, data.shape[0])
    if dst.dtype not in _INDEX8_DTYPES:
        raise NkiValidationError("err-unsupported-dtype", ins, f"dst is {dst.dtype}", operand="dst", value=dst.dtype,
                                 limit="uint32 (default) or uint16")
    if launch.compute:
        found = _match8(_flat(data), _flat(vals), range(8))
        write(dst, torch.where(found < 0, _INDEX8_DTYPES[dst.dtype], found).reshape(dst.shape))
    return dst


def nc_match_replace8(dst: NkiTensor, data: NkiTensor, vals: NkiTensor, imm: float,
                      dst_idx: NkiTensor | None = None, name: str | None = None) -> Any:
    """`data` with the first occurrence of each of the 8 `vals` replaced by `imm` (Vector Engine); repeated values
    are taken from the last to the first, each replacing the next occurrence, and `dst_idx` receives the positions."""
    ins = "nisa.nc_match_replace8"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    for operand, t in (("data", data), ("vals", vals), ("dst", dst)):
        _tile(ins, operand, t, launch)
    _same_layout(ins, "data", data, "dst", dst)
    _free_elements(ins, "data", data, 8, 16384)
    _eight_wide(ins, "vals", vals, data.shape[0])
    if dst_idx is not None:
        _tile(ins, "dst_idx", dst_idx, launch)
        _eight_wide(ins, "dst_idx", dst_idx, data.shape[0])
    try:
        replacement = float(imm)
    except (TypeError, ValueError):
        raise NkiValidationError("err-invalid-operand", ins, f"imm {imm!r} is not a number", operand="imm") from None
    if launch.compute:
        values = _flat(data)
        found = _match8(values, _flat(vals), range(7, -1, -1))
        if dst_idx is not None and bool((found < 0).any()):
            # the reference does not say what dst_idx holds for a value that is absent: refuse, not guess
            raise NkiValidationError("err-unsupported-feature", ins, "a value of vals is absent from data, and the "
                                     "API reference does not document dst_idx for it", operand="dst_idx",
                                     hint="check with nc_find_index8 first, or pass no dst_idx")
        out = values.clone()
        rows, cols = torch.nonzero(found >= 0, as_tuple=True)
        out[rows, found[rows, cols]] = replacement
        write(dst, out.reshape(dst.shape))
        if dst_idx is not None:
            write(dst_idx, found.reshape(dst_idx.shape))
    return dst


def bn_stats(dst: NkiTensor, data: NkiTensor, name: str | None = None) -> Any:
    """Per partition, (count, mean, variance * count) of the even-indexed and then of the odd-indexed elements of
    `data` (at most 512 per partition), in float32 (Vector Engine)."""
    ins = "nisa.bn_stats"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    _tile(ins, "data", data, launch)
    _tile(ins, "dst", dst, launch)
    _free_elements(ins, "data", data, 1, 512)  # nl.tile_size.bn_stats_fmax
    if dst.shape[0] != data.shape[0] or dst.free_size != 6:
        raise NkiValidationError("err-shape-mismatch", ins, f"dst {dst.shape}", operand="dst", value=dst.shape,
                                 limit=f"({data.shape[0]}, 6): 6 statistics per partition")
    if launch.compute:
        x = _flat(data)
        parts = []
        for half in (x[:, 0::2], x[:, 1::2]):
            count = half.shape[1]
            # an empty half (one element per partition) reports count 0; its mean and sum of squares are 0 here,
            # which bn_aggr weighs by that count of 0
            mean = half.mean(dim=1) if count else torch.zeros(x.shape[0])
            m2 = ((half - mean[:, None]) ** 2).sum(dim=1)
            parts += [torch.full((x.shape[0],), float(count)), mean, m2]
        write(dst, torch.stack(parts, dim=1).reshape(dst.shape))
    return dst


def bn_aggr(dst: NkiTensor, data: NkiTensor, name: str | None = None) -> Any:
    """Per partition, the mean and the (population) variance of the elements that the (count, mean,
    variance * count) triples of one or more ``bn_stats`` outputs describe, in float32 (Vector Engine)."""
    ins = "nisa.bn_aggr"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    _tile(ins, "data", data, launch)
    _tile(ins, "dst", dst, launch)
    if data.free_size % 3:
        raise NkiValidationError("err-shape-mismatch", ins, f"data {data.shape} has {data.free_size} elements per "
                                 "partition", operand="data", value=data.free_size,
                                 limit="a multiple of 3 ((count, mean, variance * count) triples of bn_stats)")
    if dst.shape[0] != data.shape[0] or dst.free_size != 2:
        raise NkiValidationError("err-shape-mismatch", ins, f"dst {dst.shape}", operand="dst", value=dst.shape,
                                 limit=f"({data.shape[0]}, 2): a mean and a variance per partition")
    if launch.compute:
        triples = _flat(data).reshape(data.shape[0], -1, 3)
        count, mean, m2 = triples.unbind(dim=2)
        total = count.sum(dim=1)
        weighted = torch.where(count > 0, count * mean, 0.0)
        overall = weighted.sum(dim=1) / total
        spread = torch.where(count > 0, m2 + count * (mean - overall[:, None]) ** 2, 0.0)
        write(dst, torch.stack([overall, spread.sum(dim=1) / total], dim=1).reshape(dst.shape))
    return dst


_CUMULATIVE_INIT = {"add": 0.0, "subtract": 0.0, "multiply": 1.0, "maximum": -math.inf, "minimum": math.inf}
_NO_INT32 = ("int32", "uint32")


def tensor_scalar_cumulative(dst: NkiTensor, src: NkiTensor, op0: Any, op1: Any, imm0: Any, imm1: Any = None,
                             reduce_cmd: reduce_cmd = reduce_cmd.reset_reduce, name: str | None = None) -> Any:
    """Per partition, along the free elements: ``reg = op1(src[i] op0 imm0, reg); dst[i] = reg`` in float32, with
    the Vector Engine's accumulators (shared with tensor_scalar_reduce) as the running value."""
    ins = "nisa.tensor_scalar_cumulative"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    _tile(ins, "src", src, launch)
    _tile(ins, "dst", dst, launch)
    _same_layout(ins, "src", src, "dst", dst)
    for operand, t in (("src", src), ("dst", dst)):
        if t.dtype in _NO_INT32:
            raise NkiValidationError("err-unsupported-dtype", ins, f"{operand} is {t.dtype}", operand=operand,
                                     value=t.dtype, limit="bf16, fp16, fp32, fp8, uint8, uint16, int8 or int16")
    n0, n1 = op_name(op0), op_name(op1)
    if n0 in BITVEC or n0 not in BINARY:
        raise NkiValidationError("err-unsupported-operator", ins, f"op0 {n0}", operand="op0", value=n0,
                                 limit="an arithmetic operator")
    _check_op_target(ins, n0, launch, "op0")
    if n1 not in _CUMULATIVE_INIT:
        raise NkiValidationError("err-unsupported-operator", ins, f"op1 {n1}", operand="op1", value=n1,
                                 limit="nl.add, nl.subtract, nl.multiply, nl.maximum or nl.minimum")
    if reduce_cmd not in (_RESET_REDUCE, _REDUCE, _LOAD_REDUCE):
        raise NkiValidationError("err-unsupported-feature", ins, f"reduce_cmd {reduce_cmd}", operand="reduce_cmd",
                                 limit="reset_reduce, reduce or load_reduce")
    if (imm1 is not None) != (reduce_cmd is _LOAD_REDUCE):
        raise NkiValidationError("err-invalid-operand", ins, "imm1 goes with reduce_cmd=load_reduce, and only with it",
                                 operand="imm1")
    p = src.shape[0]
    for operand, value in (("imm0", imm0), ("imm1", imm1)):
        if isinstance(value, _NkiTensor) and value.dtype != "float32":
            raise NkiValidationError("err-unsupported-dtype", ins, f"{operand} is {value.dtype}", operand=operand,
                                     value=value.dtype, limit="float32")
    v0 = _vector_operand(ins, "imm0", imm0, p, launch)
    v1 = _vector_operand(ins, "imm1", imm1, p, launch)
    if not launch.compute:
        return dst
    x = _apply(n0, _flat(src), v0, False)
    regs = _vector_regs(launch)
    if reduce_cmd is _RESET_REDUCE:
        regs[:p] = _CUMULATIVE_INIT[n1]
    elif reduce_cmd is _LOAD_REDUCE:
        regs[:p] = v1.reshape(p) if torch.is_tensor(v1) else float(v1)  # type: ignore[arg-type]
    out = torch.empty_like(x)
    reg = regs[:p].clone()
    for i in range(x.shape[1]):  # the documented order: op1(element, reg), one element at a time
        reg = _binary(n1, x[:, i], reg).to(torch.float32)
        out[:, i] = reg
    regs[:p] = reg
    write(dst, out.reshape(dst.shape))
    return dst


def _vector_regs(launch: Launch) -> torch.Tensor:
    """The Vector Engine's accumulators, NaN until an instruction sets them (as the engine's unknown state)."""
    if launch.vector_regs is None:
        launch.vector_regs = torch.full((launch.target.pmax,), float("nan"))
    return launch.vector_regs


def exponential(dst: NkiTensor, src: NkiTensor, max_value: Any = 0.0, reduce_res: NkiTensor | None = None,
                reduce_cmd: reduce_cmd = reduce_cmd.idle, reduce_init: Any = 0.0, name: str | None = None) -> Any:
    """trn3's Vector Engine ``dst = exp(src - max_value)`` in float32, optionally summed into the Vector Engine's
    accumulators (``reset_reduce``, ``reduce``, ``load_reduce``) and read out into `reduce_res`."""
    ins = "nisa.exponential"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    if launch.target.nc_version < 4:
        raise NkiValidationError("err-unsupported-feature", ins, f"not on {launch.target.name}", operand="dst",
                                 limit="NeuronCore-v4 (trn3) or newer",
                                 hint="use nisa.activation(op=nl.exp, bias=-max) on the Scalar Engine")
    _tile(ins, "src", src, launch)
    _tile(ins, "dst", dst, launch)
    _same_layout(ins, "src", src, "dst", dst)
    if reduce_cmd not in (_IDLE, _RESET_REDUCE, _REDUCE, _LOAD_REDUCE):
        raise NkiValidationError("err-unsupported-feature", ins, f"reduce_cmd {reduce_cmd}", operand="reduce_cmd",
                                 limit="idle, reset_reduce, reduce or load_reduce")
    if reduce_cmd is not _LOAD_REDUCE and not (isinstance(reduce_init, (int, float)) and reduce_init == 0.0):
        raise NkiValidationError("err-invalid-operand", ins, "reduce_init is set without reduce_cmd=load_reduce",
                                 operand="reduce_init", value=reduce_init, limit="unset or 0.0")
    if reduce_res is not None and reduce_cmd is _IDLE:
        # AWS: with idle "no accumulation performed, accumulator state unknown": nothing defined to read out
        raise NkiValidationError("err-invalid-operand", ins, "reduce_res with reduce_cmd=idle reads accumulators "
                                 "whose state the reference calls unknown", operand="reduce_res",
                                 hint="pass reduce_cmd=nisa.reduce_cmd.reset_reduce (or reduce, load_reduce)")
    p = src.shape[0]
    for operand, value in (("max_value", max_value), ("reduce_init", reduce_init)):
        if isinstance(value, _NkiTensor) and value.dtype != "float32":
            raise NkiValidationError("err-unsupported-dtype", ins, f"{operand} is {value.dtype}", operand=operand,
                                     value=value.dtype, limit="float32")
    shift = _vector_operand(ins, "max_value", max_value, p, launch)
    init = _vector_operand(ins, "reduce_init", reduce_init, p, launch)
    _reduce_res_tile(ins, reduce_res, p, launch)
    if not launch.compute:
        return dst
    out = torch.exp(_flat(src) - shift)
    write(dst, out.reshape(dst.shape))
    regs = _vector_regs(launch)
    if reduce_cmd is _IDLE:
        regs[:p] = float("nan")  # AWS: the state may still change under idle; a later reduce must reset first
        return dst
    if reduce_cmd is _RESET_REDUCE:
        regs[:p] = 0.0
    elif reduce_cmd is _LOAD_REDUCE:
        regs[:p] = init.reshape(p) if torch.is_tensor(init) else float(init)  # type: ignore[arg-type]
    # AWS: accumulator += dst[i], the engine's float32 values (before the cast to dst's dtype, as activation's)
    regs[:p] = regs[:p] + out.sum(dim=1)
    if reduce_res is not None:
        write(reduce_res, regs[:p].reshape(reduce_res.shape))
    return dst


def nc_n_gather(dst: NkiTensor, data: NkiTensor, indices: NkiTensor, name: str | None = None) -> Any:
    """Within each partition, ``dst[p, j] = data[p].flatten()[indices[p, j]]`` (GpSimd Engine, SBUF only, uint32
    indices, dst of data's dtype: a bit-exact move)."""
    ins = "nisa.nc_n_gather"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    for operand, t in (("data", data), ("indices", indices), ("dst", dst)):
        _tile(ins, operand, t, launch, (MemoryRegion.sbuf,))
    if indices.dtype != "uint32":
        raise NkiValidationError("err-unsupported-dtype", ins, f"indices is {indices.dtype}", operand="indices",
                                 value=indices.dtype, limit="uint32")
    if dst.dtype != data.dtype:
        raise NkiValidationError("err-unsupported-dtype", ins, f"dst is {dst.dtype}, data {data.dtype}",
                                 operand="dst", value=dst.dtype, limit=f"the dtype of data ({data.dtype})")
    _same_layout(ins, "indices", indices, "dst", dst)
    if data.shape[0] != dst.shape[0]:
        raise NkiValidationError("err-shape-mismatch", ins, f"data {data.shape} and dst {dst.shape}", operand="data",
                                 value=data.shape[0], limit=f"{dst.shape[0]} partitions")
    if launch.compute:
        index = _flat(indices, torch.int64)
        if bool(((index < 0) | (index >= data.free_size)).any()):
            raise NkiValidationError("err-tensor-access-out-of-bound", ins, "an index leaves its partition's "
                                     f"{data.free_size} elements", operand="indices",
                                     limit=f"[0, {data.free_size})")
        write(dst, _flat(data, _native(data)).gather(1, index).reshape(dst.shape))
    return dst


_FP32_MIN = -3.4028234663852886e38
_RANGE_COMPARE = ("equal", "less", "less_equal", "greater", "greater_equal")


def _vector_reduce_max(launch: Launch, values: torch.Tensor, cmd: Any, reduce_res: NkiTensor | None) -> None:
    """Fold per-partition maxima of `values` into the Vector Engine's accumulators as `cmd` says (reset_reduce from
    -inf, reduce on top; idle leaves them unknown) and read them out into `reduce_res`."""
    p = values.shape[0]
    regs = _vector_regs(launch)
    if cmd is _IDLE:
        regs[:p] = float("nan")  # AWS: under idle the accumulator state may still change
        return
    if cmd is _RESET_REDUCE:
        regs[:p] = -math.inf
    regs[:p] = torch.maximum(regs[:p], values.amax(dim=1))
    if reduce_res is not None:
        write(reduce_res, regs[:p].reshape(reduce_res.shape))


def _check_vector_reduce(ins: str, launch: Launch, cmd: Any, reduce_op: Any, reduce_res: NkiTensor | None,
                         p: int) -> None:
    if op_name(reduce_op) != "maximum":
        raise NkiValidationError("err-unsupported-operator", ins, f"reduce_op {op_name(reduce_op)}",
                                 operand="reduce_op", value=op_name(reduce_op), limit="nl.maximum")
    if cmd not in (_IDLE, _RESET_REDUCE, _REDUCE):
        raise NkiValidationError("err-unsupported-feature", ins, f"reduce_cmd {cmd}", operand="reduce_cmd",
                                 limit="idle, reset_reduce or reduce")
    if reduce_res is None:
        return
    if cmd is _IDLE:
        raise NkiValidationError("err-invalid-operand", ins, "reduce_res with reduce_cmd=idle: no reduction runs, "
                                 "and the reference calls the accumulators' state unknown then", operand="reduce_res",
                                 hint="pass reduce_cmd=nisa.reduce_cmd.reset_reduce")
    _reduce_res_tile(ins, reduce_res, p, launch)
    if not _dtypes.is_float(reduce_res.dtype):
        raise NkiValidationError("err-unsupported-dtype", ins, f"reduce_res is {reduce_res.dtype}",
                                 operand="reduce_res", value=reduce_res.dtype, limit="a float dtype")


def select_reduce(dst: NkiTensor, predicate: NkiTensor, on_true: NkiTensor, on_false: Any,
                  reduce_res: NkiTensor | None = None, reduce_cmd: reduce_cmd = reduce_cmd.idle,
                  reduce_op: Any = None, reverse_pred: bool = False, name: str | None = None) -> Any:
    """``dst = where(predicate, on_true, on_false)`` (Vector Engine), with the row maxima folded into the Vector
    Engine's accumulators when `reduce_cmd` is ``reset_reduce`` (from -inf) or ``reduce``."""
    ins = "nisa.select_reduce"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    for operand, t in (("predicate", predicate), ("on_true", on_true), ("dst", dst)):
        _tile(ins, operand, t, launch)
    _same_layout(ins, "on_true", on_true, "dst", dst)
    _same_layout(ins, "on_true", on_true, "predicate", predicate)
    _not_both_psum(ins, ("on_true", "predicate"), on_true, predicate)
    if predicate.dtype not in ("int8", "uint8", "int16", "uint16"):
        raise NkiValidationError("err-unsupported-dtype", ins, f"predicate is {predicate.dtype}", operand="predicate",
                                 value=predicate.dtype, limit="int8, uint8, int16 or uint16")
    if on_true.dtype in ("tfloat32", "int32", "uint32"):
        raise NkiValidationError("err-unsupported-dtype", ins, f"on_true is {on_true.dtype}", operand="on_true",
                                 value=on_true.dtype, limit="any dtype but tfloat32, int32 and uint32")
    p = on_true.shape[0]
    _check_vector_reduce(ins, launch, reduce_cmd, _MAXIMUM if reduce_op is None else reduce_op, reduce_res, p)
    fallback = _vector_operand(ins, "on_false", on_false, p, launch)
    if not launch.compute:
        return dst
    mask = _flat(predicate, torch.int64) != 0
    if reverse_pred:
        mask = ~mask
    result = torch.where(mask, _flat(on_true), fallback)  # type: ignore[arg-type]
    write(dst, result.reshape(dst.shape))
    _vector_reduce_max(launch, result, reduce_cmd, reduce_res)
    return dst


def range_select(dst: NkiTensor, on_true_tile: NkiTensor, comp_op0: Any, comp_op1: Any, bound0: NkiTensor,
                 bound1: NkiTensor, reduce_cmd: reduce_cmd = reduce_cmd.reset_reduce,
                 reduce_res: NkiTensor | None = None, reduce_op: Any = None, range_start: int = 0,
                 on_false_value: float = _FP32_MIN, name: str | None = None) -> Any:
    """``dst = where(op0(i, bound0) & op1(i, bound1), on_true_tile, FP32_MIN)`` where i is range_start plus the
    free index, compared in float32 (Vector Engine, trn2 and trn3), with the row maxima into the accumulators."""
    ins = "nisa.range_select"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    if launch.target.nc_version < 3:
        raise NkiValidationError("err-unsupported-feature", ins, f"not on {launch.target.name}", operand="dst",
                                 limit="NeuronCore-v3 (trn2) or newer")
    _tile(ins, "on_true_tile", on_true_tile, launch)
    _tile(ins, "dst", dst, launch)
    _same_layout(ins, "on_true_tile", on_true_tile, "dst", dst)
    if not _dtypes.is_float(on_true_tile.dtype):
        raise NkiValidationError("err-unsupported-dtype", ins, f"on_true_tile is {on_true_tile.dtype}",
                                 operand="on_true_tile", value=on_true_tile.dtype, limit="a float dtype")
    ops = []
    for operand, op in (("comp_op0", comp_op0), ("comp_op1", comp_op1)):
        n = op_name(op)
        if n not in _RANGE_COMPARE:
            raise NkiValidationError("err-unsupported-operator", ins, f"{operand} {n}", operand=operand, value=n,
                                     limit=", ".join(f"nl.{c}" for c in _RANGE_COMPARE))
        ops.append(n)
    p = on_true_tile.shape[0]
    bounds = []
    for operand, bound in (("bound0", bound0), ("bound1", bound1)):
        if not isinstance(bound, _NkiTensor) or bound.dtype != "float32":
            raise NkiValidationError("err-unsupported-dtype", ins, f"{operand} must be a float32 ({p}, 1) tile",
                                     operand=operand, value=getattr(bound, "dtype", type(bound).__name__),
                                     limit="float32")
        bounds.append(_vector_operand(ins, operand, bound, p, launch))
    if not isinstance(range_start, int) or isinstance(range_start, bool):
        raise NkiValidationError("err-invalid-operand", ins, f"range_start {range_start!r}", operand="range_start",
                                 limit="a compile-time integer")
    if range_start + on_true_tile.free_size > 2 ** 24 or range_start < -(2 ** 24):
        raise NkiValidationError("err-invalid-operand", ins, "range_start plus the free index leaves float32's "
                                 "exact integers", operand="range_start", value=range_start, limit="within 2^24")
    on_false_value = _float_immediate(ins, "on_false_value", on_false_value)
    if torch.tensor(on_false_value, dtype=torch.float32).item() != _FP32_MIN:  # as written to fp32
        raise NkiValidationError("err-invalid-operand", ins, f"on_false_value {on_false_value!r}",
                                 operand="on_false_value", value=on_false_value,
                                 limit="FP32_MIN (-3.4028235e+38), a hardware constraint")
    _check_vector_reduce(ins, launch, reduce_cmd, _MAXIMUM if reduce_op is None else reduce_op, reduce_res, p)
    if not launch.compute:
        return dst
    index = (range_start + torch.arange(on_true_tile.free_size, dtype=torch.float32)).expand(p, -1)
    mask = _binary(ops[0], index, bounds[0]).bool() & _binary(ops[1], index, bounds[1]).bool()
    result = torch.where(mask, _flat(on_true_tile), torch.tensor(_FP32_MIN, dtype=torch.float32))
    write(dst, result.reshape(dst.shape))
    _vector_reduce_max(launch, result, reduce_cmd, reduce_res)
    return dst


_MAXIMUM = "maximum"  # the default reduce_op of select_reduce / range_select (nl.maximum; nl sits above isa)


# the functions of AWS's NKI 0.6 isa reference that are not emulated, with why (docs/nki.md, "Not implemented")
_RNG = "the hardware generator's word order, seeding and word-to-float mapping are not documented"
_MULTI_CORE = "needs several NeuronCores running at once; the interpreter runs one program at a time"
_NOT_EMULATED = {
    "sequence_bounds": "the reference leaves its NumPy equivalent empty and does not say whether the end index "
                       "is inclusive",
    "topk": "the reference's 16-partition snake layout and 'each partition selects its own top K' disagree",
    "local_gather": "the reference does not document where each core's gathered elements land in dst",
    "nc_matmul_mx": "trn3 MX block-scaled formats; the scale layout is not emulated",
    "quantize_mx": "trn3 MX block-scaled formats; the scale layout is not emulated",
    "core_barrier": _MULTI_CORE, "sendrecv": _MULTI_CORE,
    "rand2": _RNG, "rand_get_state": _RNG, "rand_set_state": _RNG, "set_rng_seed": _RNG, "rng": _RNG,
    "dropout": _RNG,
}


def __getattr__(name: str) -> Any:
    reason = _NOT_EMULATED.get(name)
    if reason is not None:
        raise AttributeError(f"module 'nki.isa' has no attribute {name!r}: nisa.{name} is in AWS's NKI 0.6 reference "
                             f"but not emulated here ({reason}; docs/nki.md, 'Not implemented')")
    raise AttributeError(f"module 'nki.isa' has no attribute {name!r}")

def _dst_first(fn: Any) -> Any:
    """Turn an older-dialect call (no ``dst``, the result returned) into ``err-missing-dst`` instead of the plain
    TypeError Python raises for a missing argument; any other TypeError passes through unchanged."""
    signature = inspect.signature(fn)
    instruction = f"nisa.{fn.__name__}"

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TypeError:
            try:
                signature.bind(*args, **kwargs)
            except TypeError:
                if "dst" not in kwargs:
                    _ensure_dst(instruction, None)
                if "dtype" in kwargs and "dtype" not in signature.parameters:
                    raise NkiValidationError(
                        "err-unsupported-feature", instruction, "takes no dtype= in NKI 0.6 (the API reference's "
                        "signature); the dtype of dst is the cast", operand="dtype", value=kwargs["dtype"],
                        hint="drop dtype= and allocate dst in the dtype you want") from None
            raise

    return call


for _name in ("dma_copy", "dma_transpose", "tensor_copy", "memset", "tensor_tensor", "tensor_scalar", "activation",
              "activation_reduce", "reciprocal", "tensor_reduce", "tensor_partition_reduce", "tensor_tensor_scan",
              "tensor_copy_predicated", "iota", "affine_select", "nc_matmul", "nc_transpose", "scalar_tensor_tensor",
              "tensor_scalar_reduce", "nonzero_with_count", "nc_stream_shuffle", "activate2",
              "dma_compute", "max8", "nc_find_index8", "nc_match_replace8", "bn_stats", "bn_aggr",
              "tensor_scalar_cumulative", "exponential", "nc_n_gather", "select_reduce", "range_select"):
    globals()[_name] = _dst_first(globals()[_name])
del _name
register_operations(tensor_copy=tensor_copy, dma_copy=dma_copy, memset=memset)  # for t[...] = x (see _tensor)
