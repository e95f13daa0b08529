"""``nki.isa``: the NeuronCore instructions, run eagerly on host tiles with the hardware's rules checked.

Each instruction takes ``dst=`` first, as in NKI 0.6. It first checks its
operands (memory region, partition size, free sizes, dtypes, tile limits of
the target generation) and raises :class:`NkiValidationError` at the kernel's
line on a violation; then it runs as one or a few torch ops: inputs cast to
float32 (integers stay exact when every operand is an integer), the result
rounded to ``dst``'s dtype. ``nc_matmul`` accumulates in float32 in PSUM: the
first write to a PSUM location overwrites, later writes accumulate
(``accumulate=None``), or as ``accumulate=True/False`` says.
"""

from __future__ import annotations

import enum
import math
from typing import Any

import torch

from torch_neuronx.nki import _dtypes
from torch_neuronx.nki._errors import NkiValidationError
from torch_neuronx.nki._ops import BINARY, BITVEC, REDUCE, UNARY, op_name
from torch_neuronx.nki._tensor import (
    HBM,
    ON_CHIP,
    Launch,
    MemoryRegion,
    NkiTensor,
    allocate,
    current,
    read,
    write,
)
from torch_neuronx.nki._tensor import NkiTensor as _NkiTensor

__all__ = [
    "NkiValidationError", "activation", "activation_reduce", "affine_select", "dma_copy", "dma_transpose",
    "dge_mode", "engine", "get_nc_version", "iota", "memset", "nc_matmul", "nc_transpose", "nc_version",
    "oob_mode", "reciprocal", "reduce_cmd", "register_alloc", "register_load", "register_move", "register_store",
    "tensor_copy", "tensor_copy_predicated", "tensor_partition_reduce", "tensor_reduce", "tensor_scalar",
    "tensor_tensor", "tensor_tensor_scan", "VirtualRegister", "matmul_perf_mode",
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
    return t


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
                                 hint="copy one of them to SBUF with nisa.tensor_copy")


def _flat(t: NkiTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The tile as (partitions, elements per partition) in the compute dtype."""
    return read(t).reshape(t.shape[0], -1).to(dtype)


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
    if src.size != dst.size:
        raise NkiValidationError("err-shape-mismatch", ins, f"src {src.shape} has {src.size} elements, dst "
                                 f"{dst.shape} has {dst.size}", operand="dst", value=dst.size, limit=src.size)
    if launch.compute:
        values = read(src)
        if src.dtype != dst.dtype:
            values = values.to(torch.float32)  # the DMA casts through float32
        write(dst, values.reshape(dst.shape), skip_oob=oob_mode is not _OOB_ERROR)
    return dst


_OOB_ERROR = oob_mode.error


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
    out_shape = tuple(src.shape[p] for p in perm)
    if math.prod(out_shape) != dst.size:
        raise NkiValidationError("err-shape-mismatch", ins, f"dst {dst.shape} cannot hold the transpose "
                                 f"{out_shape}", operand="dst", value=dst.shape, limit=out_shape)
    if launch.compute:
        write(dst, read(src).permute(perm).reshape(dst.shape))
    return dst


def tensor_copy(dst: NkiTensor, src: NkiTensor, engine: engine = engine.unknown, name: str | None = None) -> Any:
    """Copy an on-chip tile (SBUF or PSUM) to another on chip, bit-exact when the dtypes agree."""
    ins = "nisa.tensor_copy"
    launch = _begin(ins)
    _ensure_dst(ins, dst)
    _tile(ins, "src", src, launch)
    _tile(ins, "dst", dst, launch)
    _same_layout(ins, "src", src, "dst", dst)
    if engine is _GPSIMD and MemoryRegion.psum in (src.buffer, dst.buffer):
        raise NkiValidationError("err-unsupported-memory", ins, "the GpSimd engine cannot access PSUM",
                                 operand="engine", value="gpsimd", limit="vector or scalar with PSUM operands")
    if engine is _SCALAR and launch.target.nc_version == 2:
        raise NkiValidationError("err-unsupported-engine", ins, "NeuronCore-v2 has no Scalar Engine tensor_copy",
                                 operand="engine", hint="use nisa.activation(op=nl.copy) or engine=vector")
    if launch.compute:
        values = read(src)
        if src.dtype != dst.dtype:
            values = values.to(torch.float32)
        write(dst, values.reshape(dst.shape))
    return dst


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
                                 operand="op")
    cdt = _check_arith_dtypes(ins, name_, ("data1", data1), ("data2", data2))
    if launch.compute:
        write(dst, _binary(name_, _flat(data1, cdt), _flat(data2, cdt)).reshape(dst.shape))
    return dst


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
        x = _apply(n0, x, v0, reverse0)
        if n1 is not None:
            x = _apply(n1, x, v1, reverse1)
        write(dst, x.reshape(dst.shape))
    return dst


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
    b = _vector_operand(ins, "bias", bias, p, launch)
    s = _vector_operand(ins, "scale", scale, p, launch)
    fn = op_name(op)
    red = op_name(reduce_op) if reduce_op is not None else None
    if red is not None and red != "add":
        raise NkiValidationError("err-unsupported-operator", ins, f"reduce_op {red}", operand="reduce_op",
                                 limit="nl.add")
    if reduce_res is not None:
        _tile(ins, "reduce_res", reduce_res, launch)
        if reduce_res.shape[0] != p or reduce_res.free_size != 1:
            raise NkiValidationError("err-shape-mismatch", ins, f"reduce_res {reduce_res.shape}", operand="reduce_res",
                                     limit=f"({p}, 1)")
    if not launch.compute:
        return dst
    x = _flat(data)
    if s is not None:
        x = x * s
    if b is not None:
        x = x + b
    out = _unary(fn, x)
    write(dst, out.reshape(dst.shape))
    cmd = reduce_cmd
    if red is not None and reduce_res is not None and cmd is _IDLE:
        cmd = _RESET_REDUCE
    if cmd is not _IDLE or reduce_res is not None:
        regs = _regs(launch)
        if cmd in (_RESET, _RESET_REDUCE):
            regs[:p] = 0.0
        if cmd in (_REDUCE, _RESET_REDUCE) and red is not None:
            regs[:p] += out.sum(dim=1)
        if reduce_res is not None:
            write(reduce_res, regs[:p].reshape(reduce_res.shape))
    return dst


_IDLE, _RESET, _REDUCE, _RESET_REDUCE = reduce_cmd.idle, reduce_cmd.reset, reduce_cmd.reduce, reduce_cmd.reset_reduce


def _regs(launch: Launch) -> torch.Tensor:
    if launch.reduce_regs is None:
        launch.reduce_regs = torch.full((launch.target.pmax,), float("nan"))
    return launch.reduce_regs


def activation_reduce(dst: NkiTensor, op: Any, data: NkiTensor, reduce_op: Any, reduce_res: NkiTensor,
                      bias: Any = None, scale: Any = 1.0, name: str | None = None) -> Any:
    """``activation`` whose ``reduce_res`` gets the row sums of this instruction's output."""
    return activation(dst, op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
                      reduce_cmd=reduce_cmd.reset_reduce)


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
    axes = (axis,) if isinstance(axis, int) else tuple(int(a) for a in axis)
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
    cdt = _check_arith_dtypes(ins, name_, ("data", data))
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
    if name_ not in REDUCE:
        raise NkiValidationError("err-unsupported-operator", ins, f"reduction operator {name_}", operand="op")
    if launch.compute:
        out = REDUCE[name_](_flat(data).T)
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
    if isinstance(src, _NkiTensor):
        _tile(ins, "src", src, launch)
        _same_layout(ins, "dst", dst, "src", src)
        _not_both_psum(ins, ("src", "predicate"), src, predicate)
    if launch.compute:
        mask = _flat(predicate) != 0
        if reverse_pred:
            mask = ~mask
        new = _flat(src) if isinstance(src, _NkiTensor) else torch.full(mask.shape, float(src))
        write(dst, torch.where(mask, new, _flat(dst)).reshape(dst.shape))
    return dst


def _pattern_values(ins: str, dst: NkiTensor, pattern: Any, offset: int, channel_multiplier: int) -> torch.Tensor:
    pairs = [(int(s), int(n)) for s, n in pattern]
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
    return values


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
    cmp = op_name(cmp_op) if cmp_op is not None else "equal"
    if launch.compute:
        mask = _binary(cmp, values.to(torch.float32), 0.0) != 0
        out = torch.where(mask, _flat(on_true_tile), torch.tensor(float(on_false_value)))
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
    k, m, n = stationary.shape[0], stationary.free_size, moving.free_size
    rows = int(tile_size[0]) if tile_size else target.pmax
    cols = int(tile_size[1]) if tile_size else target.gemm_stationary_fmax
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
    if target.nc_version >= 4:
        moving_max = 4096 if dst.dtype == "float32" else 8192
    if n > moving_max:
        raise NkiValidationError(
            "err-matmul-moving-fmax", ins, f"free size of {moving.name!r} {moving.shape} is {n}", operand="moving",
            value=n, limit=f"{moving_max} (nl.tile_size.gemm_moving_fmax, one PSUM bank of float32)",
            hint="tile the moving free dimension in chunks of 512")
    if dst.shape[0] != m or dst.free_size != n:
        raise NkiValidationError("err-shape-mismatch", ins, f"dst {dst.shape} for stationary {stationary.shape} and "
                                 f"moving {moving.shape}", operand="dst", value=dst.shape,
                                 limit=f"{m} partitions x {n} elements")
    allowed = _MATMUL_DTYPES | ({"float8_e4m3fn"} if target.nc_version >= 4 else set())
    for operand, t in (("stationary", stationary), ("moving", moving)):
        if t.dtype not in allowed:
            raise NkiValidationError("err-unsupported-dtype", ins, f"{t.name!r} is {t.dtype}", operand=operand,
                                     value=t.dtype, limit=", ".join(sorted(allowed)))
    wide = {"float32", "tfloat32"}
    if (stationary.dtype in wide) != (moving.dtype in wide):
        raise NkiValidationError("err-unsupported-dtype", ins, f"stationary is {stationary.dtype}, moving "
                                 f"{moving.dtype}: a float32/tfloat32 operand needs a float32/tfloat32 partner",
                                 operand="moving", value=moving.dtype)
    dst_ok = {"float32"} | ({"bfloat16"} if target.nc_version >= 4 else set())
    if is_transpose:
        dst_ok = dst_ok | {stationary.dtype}
    if dst.dtype not in dst_ok:
        raise NkiValidationError("err-matmul-dst-dtype", ins, f"dst {dst.name!r} is {dst.dtype} on {target.name}",
                                 operand="dst", value=dst.dtype, limit=" or ".join(sorted(dst_ok)),
                                 hint="allocate the PSUM tile as nl.float32 and cast when copying it out")
    if not launch.compute:
        return dst
    s = _flat(stationary)
    mv = _flat(moving)
    if is_transpose:
        result = s.T.contiguous() if mv.shape[0] == mv.shape[1] else s.T @ mv
    else:
        result = s.T @ mv
    st = dst.storage
    acc = st.acc.as_strided(dst.shape, dst.strides, dst.offset)  # type: ignore[union-attr]
    flags = acc.reshape(m, n)
    if accumulate is True and not bool(flags.all()):
        raise NkiValidationError("err-psum-accumulate-uninitialized", ins, f"accumulate=True into PSUM {dst.name!r} "
                                 "that no matmul has written since it was allocated or overwritten",
                                 operand="accumulate", hint="start the group with accumulate=False (or leave "
                                 "accumulate=None: first write overwrites, later ones accumulate)")
    if accumulate is False:
        new = result
    else:
        old = _flat(dst)
        new = torch.where(flags, old + result, result)
    st.data.as_strided(dst.shape, dst.strides, dst.offset).copy_(  # type: ignore[union-attr]
        _dtypes.round_to(new.reshape(dst.shape), dst.dtype))
    acc.fill_(True)
    st.written = True
    return dst


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
        write(dst, read(data).reshape(p, f).T.reshape(dst.shape))
    return dst


def new_tile(shape: Any, dtype: Any, buffer: MemoryRegion = MemoryRegion.sbuf) -> NkiTensor:
    return allocate(shape, dtype, buffer)
