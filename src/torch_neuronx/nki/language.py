"""``nki.language``: tensors, buffers, dtypes, loops, the launch grid and the tile-level convenience operations.

``nl.ndarray``/``nl.zeros`` allocate in a buffer (``nl.sbuf`` by default),
``nl.load``/``nl.store`` are DMAs between HBM and a new SBUF tile, and the
element-wise and reduction functions (``nl.add``, ``nl.exp``, ``nl.sum``, ...)
compute a new SBUF tile — each one instruction, checked like ``nki.isa``'s.
The same functions name operators when passed as ``op=`` to an instruction.
Loops (``nl.affine_range`` and friends) are Python ranges: the interpreter
runs iterations in order, so races between iterations an ``affine_range``
would let the compiler overlap go unseen.
"""

from __future__ import annotations

import builtins
import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

from torch_neuronx.nki import _dtypes, isa
from torch_neuronx.nki._errors import NkiValidationError
from torch_neuronx.nki._ops import BINARY, BITVEC, UNARY
from torch_neuronx.nki._target import current_target
from torch_neuronx.nki._tensor import (
    HBM,
    ON_CHIP,
    DynamicSlice,
    MemoryRegion,
    NkiTensor,
    ParDim,
    allocate,
    current,
    current_or_none,
    loop_iterations,
    read,
    register_operations,
    write,
)

# ----------------------------------------------------------------------------------------------- dtypes, buffers
bool_ = "bool"
int8, int16, int32 = "int8", "int16", "int32"
uint8, uint16, uint32 = "uint8", "uint16", "uint32"
float16, float32, bfloat16, tfloat32 = "float16", "float32", "bfloat16", "tfloat32"
float8_e4m3, float8_e4m3fn, float8_e5m2, float8_e8m0fnu = "float8_e4m3", "float8_e4m3fn", "float8_e5m2", \
    "float8_e8m0fnu"

sbuf = MemoryRegion.sbuf
psum = MemoryRegion.psum
private_hbm = MemoryRegion.private_hbm
hbm = MemoryRegion.private_hbm
shared_hbm = MemoryRegion.shared_hbm
NkiTensor = NkiTensor  # noqa: PLW0127 - re-exported under the API's name


class NKIObject:
    """Base class of NKI configuration objects."""

    def __init__(self, **kwargs: Any) -> None:
        for key, value in kwargs.items():
            setattr(self, key, value)


def is_hbm(buffer: Any) -> bool:
    return _region(buffer) in HBM


def is_on_chip(buffer: Any) -> bool:
    return _region(buffer) in ON_CHIP


def is_psum(buffer: Any) -> bool:
    return _region(buffer) is MemoryRegion.psum


def is_sbuf(buffer: Any) -> bool:
    return _region(buffer) is MemoryRegion.sbuf


def _region(buffer: Any) -> MemoryRegion:
    from torch_neuronx.nki._tensor import region

    return region(getattr(buffer, "buffer", buffer))


class _TileSize(NKIObject):
    """Hardware tile-size constants of the target generation."""

    pmax = 128
    psum_fmax = 512
    psum_bank_fmax = 512
    psum_bank_fmax_bytes = 2048
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512
    psum_min_align = 4
    sbuf_min_align = 4

    @staticmethod
    def _target() -> Any:
        launch = current_or_none()
        return launch.target if launch is not None else current_target()

    @property
    def psum_num_banks(self) -> int:
        return self._target().psum_banks

    @property
    def sbuf_fmax_bytes(self) -> int:
        return self._target().sbuf_partition_bytes

    @property
    def sbuf_fmax(self) -> int:
        return self._target().sbuf_partition_bytes // 4

    @property
    def sbuf_size_bytes(self) -> int:
        target = self._target()
        return target.sbuf_partition_bytes * target.pmax

    @property
    def total_available_sbuf_size(self) -> int:
        return self._target().sbuf_partition_bytes


tile_size = _TileSize()


# ----------------------------------------------------------------------------------------------- creation


def ndarray(shape: Any, dtype: Any, buffer: Any = sbuf, name: str = "", address: Any = None) -> NkiTensor:
    """A new tensor, its contents undefined (the interpreter fills it with NaN / 4 to show reads before writes)."""
    current().count_allocation("nl.ndarray")
    return allocate(shape, dtype, buffer, name)


def zeros(shape: Any, dtype: Any, buffer: Any = sbuf, name: str = "") -> NkiTensor:
    return full(shape, 0, dtype, buffer, name)


def ones(shape: Any, dtype: Any, buffer: Any = sbuf, name: str = "") -> NkiTensor:
    return full(shape, 1, dtype, buffer, name)


def full(shape: Any, fill_value: Any, dtype: Any, buffer: Any = sbuf, name: str = "") -> NkiTensor:
    launch = current()
    launch.count_allocation("nl.full")  # the fill is counted as the nisa.memset instruction it is
    t = allocate(shape, dtype, buffer, name, instruction="nl.full", fill=None)
    if t.on_chip:
        isa.memset(dst=t, value=fill_value)
    elif launch.compute:
        write(t, torch.full(t.shape, float(fill_value)))
    return t


def zeros_like(x: NkiTensor, dtype: Any = None, buffer: Any = None, name: str = "") -> NkiTensor:
    return zeros(x.shape, dtype or x.dtype, buffer or x.buffer, name)


def empty_like(x: NkiTensor, dtype: Any = None, buffer: Any = None, name: str = "") -> NkiTensor:
    return ndarray(x.shape, dtype or x.dtype, buffer or x.buffer, name)


def rand(shape: Any, dtype: Any, buffer: Any = sbuf, name: str = "") -> NkiTensor:
    launch = current()
    t = allocate(shape, dtype, buffer, name, instruction="nl.rand")
    launch.count("nl.rand")
    if launch.compute:
        write(t, torch.rand(t.shape))
    return t


def random_seed(seed: Any) -> None:
    torch.manual_seed(int(seed) if not isinstance(seed, NkiTensor) else int(read(seed).reshape(-1)[0].item()))


def shared_constant(constant: Any) -> NkiTensor:
    import numpy as np

    array = np.load(constant) if isinstance(constant, str) else np.asarray(constant)
    t = allocate(array.shape, array.dtype, shared_hbm, instruction="nl.shared_constant", fill=None)
    if current().compute:
        write(t, torch.from_numpy(np.ascontiguousarray(array)))
    return t


def shared_identity_matrix(n: int, dtype: Any = uint8, dst: NkiTensor | None = None) -> NkiTensor:
    launch = current()
    launch.count("nl.shared_identity_matrix")
    t = dst if dst is not None else allocate((n, n), dtype, sbuf, instruction="nl.shared_identity_matrix")
    if launch.compute:
        write(t, torch.eye(n).reshape(t.shape))
    return t


def device_print(print_prefix: str, tensor: NkiTensor) -> None:
    launch = current()
    if launch.compute:
        print(print_prefix, read(tensor))


# ----------------------------------------------------------------------------------------------- data movement


def load(src: NkiTensor, dtype: Any = None) -> NkiTensor:
    """DMA `src` (HBM) into a new SBUF tile of the same shape."""
    if not isinstance(src, NkiTensor):
        raise NkiValidationError("err-invalid-operand", "nl.load", f"expected an NKI tensor, got "
                                 f"{type(src).__name__}", operand="src")
    tile = allocate(src.shape, dtype or src.dtype, sbuf, instruction="nl.load")
    isa.dma_copy(dst=tile, src=src)
    return tile


def store(dst: NkiTensor, value: NkiTensor) -> NkiTensor:
    """DMA an SBUF tile into `dst` (HBM)."""
    if not isinstance(value, NkiTensor):
        raise NkiValidationError("err-invalid-operand", "nl.store", f"value must be a tile, got "
                                 f"{type(value).__name__}", operand="value")
    isa.dma_copy(dst=dst, src=value)
    return dst


def load_transpose2d(src: NkiTensor, dtype: Any = None) -> NkiTensor:
    tile = allocate((src.shape[1], src.shape[0]), dtype or src.dtype, sbuf, instruction="nl.load_transpose2d")
    isa.dma_transpose(dst=tile, src=src)
    return tile


def ds(start: int, size: int) -> DynamicSlice:
    """`size` elements from `start`, as a slice in an index."""
    return DynamicSlice(start, size)


# ----------------------------------------------------------------------------------------------- tile math


def _values(instruction: str, operand: str, x: Any) -> tuple[Any, str | None]:
    if isinstance(x, NkiTensor):
        launch = current()
        isa._tile(instruction, operand, x, launch)
        return (read(x).to(torch.float32) if launch.compute else None), x.dtype
    if isinstance(x, (int, float, bool)) or hasattr(x, "__float__"):
        return float(x), None
    raise NkiValidationError("err-invalid-operand", instruction, f"{x!r} is neither a tile nor a scalar",
                             operand=operand)


def _bits(instruction: str, operand: str, x: Any) -> tuple[Any, str | None]:
    """An operand of a bitvec operator: an integer tile as the unsigned bit patterns of its dtype's width (AWS:
    bitvec operators "treat input elements as bit patterns"; nl.right_shift is a logical shift), or an int."""
    if isinstance(x, NkiTensor):
        launch = current()
        isa._tile(instruction, operand, x, launch)
        isa._check_arith_dtypes(instruction, "bitwise_and", (operand, x))
        return (isa._bit_pattern(read(x), x.dtype) if launch.compute else None), x.dtype
    try:
        return int(x), None
    except (TypeError, ValueError):
        raise NkiValidationError("err-invalid-operand", instruction, f"{x!r} is neither an integer tile nor an int",
                                 operand=operand) from None


def _out_shape(instruction: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    try:
        return tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        raise NkiValidationError("err-shape-mismatch", instruction, f"tiles {shapes} do not broadcast",
                                 operand="y") from None


def _make_binary(name: str) -> Callable[..., NkiTensor]:
    fn_name = name

    def op(x: Any, y: Any, dtype: Any = None) -> NkiTensor:
        instruction = f"nl.{fn_name}"
        launch = current()
        launch.count(instruction)
        isa._check_op_target(instruction, fn_name, launch, "x")
        if fn_name in BITVEC:
            (xv, xd), (yv, yd) = _bits(instruction, "x", x), _bits(instruction, "y", y)
        else:
            xv, xd = _values(instruction, "x", x)
            yv, yd = _values(instruction, "y", y)
        shapes = [t.shape for t in (x, y) if isinstance(t, NkiTensor)]
        if not shapes:
            raise NkiValidationError("err-invalid-operand", instruction, "needs at least one tile", operand="x")
        out_dtype = dtype or _dtypes.promote(*[d for d in (xd, yd) if d])
        out = allocate(_out_shape(instruction, *shapes), out_dtype, sbuf, instruction=instruction)
        if launch.compute:
            if not torch.is_tensor(xv) and not torch.is_tensor(yv):
                raise AssertionError
            write(out, BINARY[fn_name](xv, yv).expand(out.shape))
        return out

    op.__name__ = op.__qualname__ = name
    op._nki_op = name  # type: ignore[attr-defined]
    op.__doc__ = f"Element-wise {name} of two tiles (or a tile and a scalar), as a new SBUF tile."
    return op


def _make_unary(name: str) -> Callable[..., NkiTensor]:
    fn_name = name

    def op(x: Any, dtype: Any = None) -> NkiTensor:
        instruction = f"nl.{fn_name}"
        launch = current()
        launch.count(instruction)
        xv, xd = _bits(instruction, "x", x) if fn_name in BITVEC else _values(instruction, "x", x)
        if not isinstance(x, NkiTensor):
            raise NkiValidationError("err-invalid-operand", instruction, "needs a tile", operand="x")
        out = allocate(x.shape, dtype or xd, sbuf, instruction=instruction)
        if launch.compute:
            write(out, UNARY[fn_name](xv))
        return out

    op.__name__ = op.__qualname__ = name
    op._nki_op = name  # type: ignore[attr-defined]
    op.__doc__ = f"Element-wise {name} of a tile, as a new SBUF tile."
    return op


add = _make_binary("add")
subtract = _make_binary("subtract")
multiply = _make_binary("multiply")
divide = _make_binary("divide")
maximum = _make_binary("maximum")
minimum = _make_binary("minimum")
power = _make_binary("power")
fmod = _make_binary("fmod")
mod = _make_binary("mod")
abs_max = _make_binary("abs_max")
abs_min = _make_binary("abs_min")
equal = _make_binary("equal")
not_equal = _make_binary("not_equal")
less = _make_binary("less")
less_equal = _make_binary("less_equal")
greater = _make_binary("greater")
greater_equal = _make_binary("greater_equal")
logical_and = _make_binary("logical_and")
logical_or = _make_binary("logical_or")
logical_xor = _make_binary("logical_xor")
bitwise_and = _make_binary("bitwise_and")
bitwise_or = _make_binary("bitwise_or")
bitwise_xor = _make_binary("bitwise_xor")
left_shift = _make_binary("left_shift")
right_shift = _make_binary("right_shift")

exp = _make_unary("exp")
log = _make_unary("log")
sqrt = _make_unary("sqrt")
rsqrt = _make_unary("rsqrt")
tanh = _make_unary("tanh")
sigmoid = _make_unary("sigmoid")
relu = _make_unary("relu")
gelu = _make_unary("gelu")
gelu_apprx_tanh = _make_unary("gelu_apprx_tanh")
gelu_apprx_sigmoid = _make_unary("gelu_apprx_sigmoid")
gelu_dx = _make_unary("gelu_dx")
gelu_apprx_sigmoid_dx = _make_unary("gelu_apprx_sigmoid_dx")
silu = _make_unary("silu")
silu_dx = _make_unary("silu_dx")
softplus = _make_unary("softplus")
mish = _make_unary("mish")
erf = _make_unary("erf")
erf_dx = _make_unary("erf_dx")
reciprocal = _make_unary("reciprocal")
square = _make_unary("square")
abs = _make_unary("abs")  # noqa: A001 - the API's name
negative = _make_unary("negative")
sign = _make_unary("sign")
sin = _make_unary("sin")
cos = _make_unary("cos")
tan = _make_unary("tan")
arctan = _make_unary("arctan")
ceil = _make_unary("ceil")
floor = _make_unary("floor")
trunc = _make_unary("trunc")
copy = _make_unary("copy")
logical_not = _make_unary("logical_not")
invert = _make_unary("invert")


class _Marker:
    """An operator that exists only as an ``op=`` value (``nl.bypass``, ``nl.average``, ``nl.prelu``)."""

    def __init__(self, name: str) -> None:
        self._nki_op = name

    def __repr__(self) -> str:
        return f"nl.{self._nki_op}"


bypass = _Marker("bypass")
average = _Marker("average")
prelu = _Marker("prelu")
identity = _Marker("identity")


def _reduce(name: str, op: str) -> Callable[..., NkiTensor]:
    def reduce(x: NkiTensor, axis: Any, dtype: Any = None, keepdims: bool = False) -> NkiTensor:
        instruction = f"nl.{name}"
        launch = current()
        launch.count(instruction)
        xv, xd = _values(instruction, "x", x)
        axes = isa._reduce_axes(instruction, x, axis)
        # AWS nl.var: "keepdims: currently ignored; result always has keepdims=True shape"
        shape = [1 if i in axes else n for i, n in enumerate(x.shape)] if keepdims or op == "var" else \
            [n for i, n in enumerate(x.shape) if i not in axes]
        out = allocate(tuple(shape), dtype or xd, sbuf, instruction=instruction)
        if launch.compute:
            from torch_neuronx.nki._ops import REDUCE

            flat = xv.flatten(axes[0])
            if op == "all":
                result = (flat != 0).all(dim=-1).to(torch.float32)
            elif op == "var":
                result = flat.var(dim=-1, unbiased=False)
            else:
                result = REDUCE[op](flat)
            write(out, result.reshape(out.shape))
        return out

    reduce.__name__ = reduce.__qualname__ = name
    reduce._nki_op = op  # type: ignore[attr-defined]
    reduce.__doc__ = f"{name} over the given free axes (the last ones), as a new SBUF tile."
    return reduce


sum = _reduce("sum", "add")  # noqa: A001
max = _reduce("max", "maximum")  # noqa: A001
min = _reduce("min", "minimum")  # noqa: A001
mean = _reduce("mean", "mean")
prod = _reduce("prod", "multiply")
var = _reduce("var", "var")
all = _reduce("all", "all")  # noqa: A001


def softmax(x: NkiTensor, axis: int = -1, dtype: Any = None) -> NkiTensor:
    launch = current()
    launch.count("nl.softmax")
    xv, xd = _values("nl.softmax", "x", x)
    isa._reduce_axes("nl.softmax", x, axis)
    out = allocate(x.shape, dtype or xd, sbuf, instruction="nl.softmax")
    if launch.compute:
        write(out, torch.softmax(xv, dim=axis))
    return out


def rms_norm(x: NkiTensor, w: NkiTensor, axis: int, n: int, epsilon: float = 1e-6, dtype: Any = None,
             compute_dtype: Any = None) -> NkiTensor:
    launch = current()
    launch.count("nl.rms_norm")
    xv, xd = _values("nl.rms_norm", "x", x)
    wv, _ = _values("nl.rms_norm", "w", w)
    out = allocate(x.shape, dtype or xd, sbuf, instruction="nl.rms_norm")
    if launch.compute:
        ms = (xv * xv).sum(dim=axis, keepdim=True) / float(n)
        write(out, xv * torch.rsqrt(ms + epsilon) * wv)
    return out


def where(condition: NkiTensor, x: Any, y: Any, dtype: Any = None) -> NkiTensor:
    launch = current()
    launch.count("nl.where")
    cv, _ = _values("nl.where", "condition", condition)
    xv, xd = _values("nl.where", "x", x)
    yv, yd = _values("nl.where", "y", y)
    shapes = [t.shape for t in (condition, x, y) if isinstance(t, NkiTensor)]
    out = allocate(_out_shape("nl.where", *shapes), dtype or _dtypes.promote(*[d for d in (xd, yd) if d]), sbuf,
                   instruction="nl.where")
    if launch.compute:
        xv = xv if torch.is_tensor(xv) else torch.tensor(xv)
        yv = yv if torch.is_tensor(yv) else torch.tensor(yv)
        write(out, torch.where(cv != 0, xv, yv).expand(out.shape))
    return out


def broadcast_to(x: NkiTensor, shape: Any, dtype: Any = None) -> NkiTensor:
    """A new tile of `shape` holding `x` broadcast along its size-1 dimensions (the partition one included)."""
    launch = current()
    launch.count("nl.broadcast_to")
    xv, xd = _values("nl.broadcast_to", "x", x)
    dims = tuple(int(s) for s in shape)
    if len(dims) != x.ndim or any(a != b and a != 1 for a, b in zip(x.shape, dims, strict=True)):
        raise NkiValidationError("err-shape-mismatch", "nl.broadcast_to", f"{x.shape} cannot broadcast to {dims}",
                                 operand="shape", hint="same rank; each dimension equal or broadcast from 1")
    if dims == x.shape and (dtype is None or _dtypes.canonical(dtype) == x.dtype):
        return x
    out = allocate(dims, dtype or xd, sbuf, instruction="nl.broadcast_to")
    if launch.compute:
        write(out, xv.expand(dims))
    return out


def expand_dims(x: NkiTensor, axis: int) -> NkiTensor:
    return x.expand_dim(axis)


def transpose(x: NkiTensor, dtype: Any = None) -> NkiTensor:
    """The 2-D transpose of a tile (on the Tensor Engine: the result is a PSUM tile)."""
    current().count("nl.transpose")
    out = allocate((x.free_size, x.shape[0]), dtype or x.dtype, psum, instruction="nl.transpose")
    isa.nc_transpose(dst=out, data=x, engine=isa.engine.tensor if x.buffer is sbuf else isa.engine.vector)
    return out


def gather_flattened(data: NkiTensor, indices: NkiTensor, axis: int = 0, dtype: Any = None) -> NkiTensor:
    """Per partition, the elements of `data`'s flattened free dimensions at `indices` (AWS nl.gather_flattened),
    into a new SBUF tile shaped like `indices`: GpSimd's ``nisa.nc_n_gather`` (uint32 indices), then a cast to
    `dtype` if one is given. Only the documented default ``axis=0`` is taken: the reference does not say what
    another axis selects."""
    launch = current()
    launch.count("nl.gather_flattened")
    if axis != 0:
        raise NkiValidationError("err-unsupported-feature", "nl.gather_flattened", f"axis={axis}: the reference "
                                 "documents only the gather from the flattened free dimensions", operand="axis",
                                 value=axis, limit="0 (the default)")
    gathered = allocate(indices.shape, data.dtype, sbuf, instruction="nl.gather_flattened")
    isa.nc_n_gather(dst=gathered, data=data, indices=indices)
    if dtype is None or _dtypes.canonical(dtype) == data.dtype:
        return gathered
    out = allocate(indices.shape, dtype, sbuf, instruction="nl.gather_flattened")
    isa.tensor_copy(dst=out, src=gathered)
    return out


def matmul(x: NkiTensor, y: NkiTensor, transpose_x: bool = False) -> NkiTensor:
    """``x @ y`` (or ``x.T @ y`` with transpose_x) into a new float32 PSUM tile."""
    launch = current()
    launch.count("nl.matmul")
    for operand, t in (("x", x), ("y", y)):  # AWS: x and y are tiles on SBUF
        isa._tile("nl.matmul", operand, t, launch, (sbuf,))
    stationary = x
    if not transpose_x:
        # the inserted transpose is a Tensor Engine transpose through PSUM, then a copy back to SBUF
        flipped = allocate((x.free_size, x.shape[0]), x.dtype, psum, instruction="nl.matmul")
        isa.nc_transpose(dst=flipped, data=x, engine=isa.engine.tensor)
        stationary = allocate((x.free_size, x.shape[0]), x.dtype, sbuf, instruction="nl.matmul")
        isa.tensor_copy(dst=stationary, src=flipped)
        del flipped
    out = allocate((stationary.free_size, y.free_size), float32, psum, instruction="nl.matmul")
    isa.nc_matmul(dst=out, stationary=stationary, moving=y, accumulate=False)
    return out


# ----------------------------------------------------------------------------------------------- control


class _CompilerLoop:
    """A loop the NKI compiler keeps as a loop (its body traced once): each iteration is a ledger scope, so a tile
    allocated in the body is live for its iteration only. Iterates like the ``range`` it wraps."""

    __slots__ = ("values",)

    def __init__(self, values: range) -> None:
        self.values = values

    def __iter__(self) -> Iterator[int]:
        return loop_iterations(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, index: Any) -> Any:
        return self.values[index]

    def __repr__(self) -> str:
        return repr(self.values)


def _range(start: Any, stop: Any, step: Any, instruction: str, positive_step: bool = False) -> range:
    """range(start, stop, step) of integers (registers for dynamic bounds): 2.5 is refused, not truncated; a step of
    0 is refused, and so is a step below 1 where AWS asks for "a compile-time positive integer" (`positive_step`)."""
    first = isa._int_immediate(instruction, "start", start)
    step_size = None if isinstance(step, isa.VirtualRegister) else isa._int_immediate(instruction, "step", step)
    if step_size is None or step_size == 0 or (positive_step and step_size < 0):
        raise NkiValidationError("err-invalid-operand", instruction, f"step {step!r}", operand="step", value=step,
                                 limit="a compile-time positive integer" if positive_step else
                                 "a compile-time non-zero integer", hint="pass a positive Python int as step")
    if stop is None:
        return range(first)
    return range(first, isa._int_immediate(instruction, "stop", stop), step_size)


def affine_range(start: int, stop: int | None = None, step: int = 1) -> _CompilerLoop:
    """Iterations the compiler may overlap (run here in order); body tiles live for one iteration."""
    return _CompilerLoop(_range(start, stop, step, "nl.affine_range"))


def sequential_range(start: int, stop: int | None = None, step: int = 1) -> _CompilerLoop:
    """Iterations with a loop-carried dependency, in order; body tiles live for one iteration."""
    return _CompilerLoop(_range(start, stop, step, "nl.sequential_range"))


def static_range(start: int, stop: int | None = None, step: int = 1) -> range:
    """A loop the tracer unrolls: each iteration's tiles are distinct and live while the kernel references them."""
    return _range(start, stop, step, "nl.static_range")


def dynamic_range(start: Any, stop: Any = None, step: int = 1) -> _CompilerLoop:
    """A loop with run-time bounds (registers or ints); body tiles live for one iteration."""
    return _CompilerLoop(_range(start, stop, step, "nl.dynamic_range", positive_step=True))


def fori_loop(lower: Any, upper: Any, body_fun: Callable[[Any], Any], step: int = 1) -> None:
    """``body_fun(i)`` for i in range(lower, upper, step); AWS: "step: step size, must be a compile-time positive
    integer" (0, -1, 1.5 or a register is refused, not run as zero iterations)."""
    for i in loop_iterations(_range(lower, upper, step, "nl.fori_loop", positive_step=True)):
        body_fun(isa.VirtualRegister(i))


def while_loop(init: Any, body_fun: Callable[[Any], Any]) -> None:
    reg = init
    launch = current_or_none()
    while int(reg) != 0:
        scope = launch.ledger.open_scope() if launch is not None else None
        try:
            reg = body_fun(reg)
        finally:
            if scope is not None:
                launch.ledger.close_scope(scope)  # type: ignore[union-attr]


@contextlib.contextmanager
def no_reorder() -> Iterator[None]:
    """Program order (the interpreter never reorders)."""
    yield


def program_id(axis: int = 0) -> int:
    """This program's index along `axis` of the launch grid (0 without a grid)."""
    launch = current()
    if not launch.grid:
        return 0
    if not 0 <= axis < len(launch.grid):
        raise NkiValidationError("err-invalid-grid-axis", "nl.program_id", f"axis {axis} of a "
                                 f"{len(launch.grid)}-D grid {launch.grid}", operand="axis")
    return launch.program_id[axis]


def num_programs(axes: Any = None) -> int:
    """Programs along `axes` (all of them when None) of the launch grid."""
    launch = current()
    grid = launch.grid or (1,)
    if axes is None:
        return math.prod(grid)
    if isinstance(axes, int):
        return grid[axes] if axes < len(grid) else 1
    return math.prod(grid[a] for a in axes)


def program_ndim() -> int:
    return len(current().grid)


def nc(n: int) -> int:
    """The cores a grid dimension spreads over (``kernel[nl.nc(2) * 2, 2]``): the interpreter runs them in turn."""
    return int(n)


def spmd_dim(*dims: int) -> int:
    return math.prod(int(d) for d in dims)


def par_dim(n: int) -> int:
    """Older dialect's partition-dimension marker: the size itself, accepted first in a shape (anywhere else the
    older dialect meant block dimensions, which NKI 0.6 does not have: the allocation says so)."""
    return ParDim(int(n))


_OLDER_DIALECT = {
    "arange": "index grids (nl.arange, nl.mgrid) belong to the older neuronxcc.nki dialect",
    "mgrid": "index grids (nl.arange, nl.mgrid) belong to the older neuronxcc.nki dialect",
    "loop_reduce": "nl.loop_reduce belongs to the older neuronxcc.nki dialect",
}


def __getattr__(name: str) -> Any:
    reason = _OLDER_DIALECT.get(name)
    if reason is not None:
        raise AttributeError(f"module 'nki.language' has no attribute {name!r}: {reason}, out of support since "
                             "Neuron 2.28 and not emulated; in NKI 0.6 index with slices (t[0:128, 0:512]), nl.ds(), "
                             "or .ap() access patterns")
    reason = _NOT_EMULATED.get(name)
    if reason is not None:
        raise AttributeError(f"module 'nki.language' has no attribute {name!r}: nl.{name} is in AWS's NKI 0.6 "
                             f"reference but not emulated here ({reason}; docs/nki.md, 'Not implemented')")
    raise AttributeError(f"module 'nki.language' has no attribute {name!r}")


_PACKED = "an x4 packed dtype, used only by nc_matmul_mx and quantize_mx, which are not emulated"
_NOT_EMULATED = {
    "float8_e5m2_x4": _PACKED, "float8_e4m3fn_x4": _PACKED, "float4_e2m1fn_x4": _PACKED,
    "dropout": "built on the hardware random generator, whose state-to-number mapping is not documented",
}


register_operations(add=add, subtract=subtract, multiply=multiply, divide=divide, negative=negative)  # a + b on tiles

_ = builtins  # the reductions above shadow sum/max/min/all/abs inside this module on purpose
