"""The engines' arithmetic: ALU operators, activation functions and reductions, each one torch op on a tile.

Kernels name an operator by passing a ``nki.language`` function (``op=nl.add``,
``op=nl.exp``), a NumPy ufunc (``np.add``, as older kernels do) or its name.
:func:`op_name` maps all three to one name; the tables map names to torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F


def _cmp(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable[..., torch.Tensor]:
    def run(a: torch.Tensor, b: Any) -> torch.Tensor:
        out = fn(a, b)
        return out.to(a.dtype if torch.is_tensor(a) and a.dtype.is_floating_point else torch.float32)

    return run


def _abs_max(a: Any, b: Any) -> torch.Tensor:
    """The signed input of larger magnitude; on a tie, `b` (AWS's nl.abs_max: "x if |x| > |y| else y")."""
    a, b = _pair(a, b)
    return torch.where(torch.abs(a) > torch.abs(b), a, b)


def _abs_min(a: Any, b: Any) -> torch.Tensor:
    """The signed input of smaller magnitude; on a tie, `b` (AWS's nl.abs_min: "x if |x| < |y| else y")."""
    a, b = _pair(a, b)
    return torch.where(torch.abs(a) < torch.abs(b), a, b)


def _pair(a: Any, b: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if not torch.is_tensor(a):
        a = torch.as_tensor(a, dtype=b.dtype if torch.is_tensor(b) else torch.float32)
    if not torch.is_tensor(b):
        b = torch.as_tensor(b, dtype=a.dtype)
    return torch.broadcast_tensors(a, b)  # type: ignore[return-value]


# operators only NeuronCore-v4 (trn3) has (AWS: nl.abs_max / nl.abs_min "Available only on NeuronCore-v4")
V4_ONLY = {"abs_max", "abs_min"}


def _as_tensor(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def run(a: Any, b: Any) -> torch.Tensor:
        if not torch.is_tensor(a):
            a = torch.as_tensor(a, dtype=b.dtype)
        if not torch.is_tensor(b):
            b = torch.as_tensor(b, dtype=a.dtype)
        return fn(a, b)

    return run


BINARY: dict[str, Callable[..., torch.Tensor]] = {
    "add": torch.add,
    "subtract": torch.sub,
    "multiply": torch.mul,
    "divide": torch.div,
    "maximum": _as_tensor(torch.maximum),
    "minimum": _as_tensor(torch.minimum),
    "power": _as_tensor(torch.pow),
    "fmod": _as_tensor(torch.fmod),
    "mod": _as_tensor(torch.remainder),
    "abs_max": _abs_max,
    "abs_min": _abs_min,
    "equal": _cmp(torch.eq),
    "not_equal": _cmp(torch.ne),
    "less": _cmp(torch.lt),
    "less_equal": _cmp(torch.le),
    "greater": _cmp(torch.gt),
    "greater_equal": _cmp(torch.ge),
    "logical_and": _cmp(_as_tensor(torch.logical_and)),
    "logical_or": _cmp(_as_tensor(torch.logical_or)),
    "logical_xor": _cmp(_as_tensor(torch.logical_xor)),
    "bitwise_and": _as_tensor(torch.bitwise_and),
    "bitwise_or": _as_tensor(torch.bitwise_or),
    "bitwise_xor": _as_tensor(torch.bitwise_xor),
    "left_shift": _as_tensor(torch.bitwise_left_shift),
    "right_shift": _as_tensor(torch.bitwise_right_shift),
}
BITVEC = {"bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift", "invert"}


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def _gelu_sigmoid(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


def _gelu_dx(x: torch.Tensor) -> torch.Tensor:
    cdf = 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))
    return cdf + x * torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def _gelu_sigmoid_dx(x: torch.Tensor) -> torch.Tensor:
    """d/dx of x * sigmoid(1.702 x), the derivative of nl.gelu_apprx_sigmoid."""
    s = torch.sigmoid(1.702 * x)
    return s + 1.702 * x * s * (1 - s)


def _silu_dx(x: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(x)
    return s * (1 + x * (1 - s))


UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "copy": lambda x: x,
    "bypass": lambda x: x,
    "identity": lambda x: x,
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "relu": torch.relu,
    "gelu": F.gelu,
    "gelu_apprx_tanh": _gelu_tanh,
    "gelu_apprx_sigmoid": _gelu_sigmoid,
    "gelu_dx": _gelu_dx,
    "gelu_apprx_sigmoid_dx": _gelu_sigmoid_dx,
    "silu": F.silu,
    "silu_dx": _silu_dx,
    "softplus": F.softplus,
    "mish": F.mish,
    "erf": torch.erf,
    "erf_dx": lambda x: 2.0 / math.sqrt(math.pi) * torch.exp(-x * x),
    "reciprocal": torch.reciprocal,
    "square": torch.square,
    "abs": torch.abs,
    "negative": torch.neg,
    "sign": torch.sign,
    "sin": torch.sin,
    "cos": torch.cos,
    "tan": torch.tan,
    "arctan": torch.atan,
    "ceil": torch.ceil,
    "floor": torch.floor,
    "trunc": torch.trunc,
    "logical_not": lambda x: torch.logical_not(x).to(x.dtype if x.dtype.is_floating_point else torch.float32),
    "invert": torch.bitwise_not,
}

# reductions over the last dimension (callers flatten the reduced free dims into it)
REDUCE: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "add": lambda x: torch.sum(x, dim=-1),
    "maximum": lambda x: torch.amax(x, dim=-1),
    "minimum": lambda x: torch.amin(x, dim=-1),
    "multiply": lambda x: torch.prod(x, dim=-1),
    "average": lambda x: torch.mean(x.to(torch.float32), dim=-1),
    "mean": lambda x: torch.mean(x.to(torch.float32), dim=-1),
    "bitwise_and": lambda x: _fold(torch.bitwise_and, x),
    "bitwise_or": lambda x: _fold(torch.bitwise_or, x),
    "bitwise_xor": lambda x: _fold(torch.bitwise_xor, x),
    # AWS tbl-aluop marks subtract and the logical operators as legal reduction operators too: subtract folds
    # left to right (x0 - x1 - ...), the logical ones give 1.0 / 0.0 as their element-wise forms do
    "subtract": lambda x: _fold(torch.sub, x),
    "logical_and": lambda x: (x != 0).all(dim=-1).to(torch.float32),
    "logical_or": lambda x: (x != 0).any(dim=-1).to(torch.float32),
    "logical_xor": lambda x: ((x != 0).sum(dim=-1) % 2).to(torch.float32),
}


def _fold(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    out = x[..., 0]
    for i in range(1, x.shape[-1]):
        out = fn(out, x[..., i])
    return out


# numpy / nl synonyms -> canonical names
_SYNONYMS = {"sum": "add", "max": "maximum", "amax": "maximum", "min": "minimum", "amin": "minimum",
             "true_divide": "divide", "subtract": "subtract", "prod": "multiply", "negative": "negative",
             "absolute": "abs", "arctan": "arctan", "remainder": "mod", "bitwise_not": "invert",
             "bitwise_left_shift": "left_shift", "bitwise_right_shift": "right_shift", "not_equal": "not_equal"}


def op_name(op: Any) -> str:
    """The canonical name of an operator given as an nl function, a NumPy ufunc or a string."""
    if op is None:
        return "bypass"
    name = getattr(op, "_nki_op", None)
    if name is None:
        name = op if isinstance(op, str) else getattr(op, "__name__", None)
    if name is None:
        raise ValueError(f"{op!r} is not an NKI operator: pass an nki.language function such as nl.add")
    return _SYNONYMS.get(name, name)
