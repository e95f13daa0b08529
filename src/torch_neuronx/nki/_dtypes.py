"""NKI dtypes: their names, the torch dtype that stores them, and the device's rounding on a write.

A dtype is named by a string (``nl.float32 == "float32"``), as in the NKI API
reference. Kernels may also pass NumPy dtypes, torch dtypes or ``ml_dtypes``
types; :func:`canonical` maps them all to the name. Values are computed in
float32 (the engines' arithmetic) and rounded to the destination dtype on
every write, round-to-nearest-even as the hardware casts: bfloat16, float16
and float8 by torch's casts, tfloat32 by dropping 13 mantissa bits with
rounding, and the legacy IEEE-style ``float8_e4m3`` (largest finite value 240,
with infinities) by overflowing to infinity past its range.
"""

from __future__ import annotations

from typing import Any

import torch

# name -> (storage dtype, bytes per element)
_TABLE: dict[str, tuple[torch.dtype, int]] = {
    "bool": (torch.bool, 1),
    "int8": (torch.int8, 1),
    "int16": (torch.int16, 2),
    "int32": (torch.int32, 4),
    "uint8": (torch.uint8, 1),
    "uint16": (torch.uint16, 2),
    "uint32": (torch.uint32, 4),
    "float16": (torch.float16, 2),
    "float32": (torch.float32, 4),
    "bfloat16": (torch.bfloat16, 2),
    "tfloat32": (torch.float32, 4),
    "float8_e4m3": (torch.float8_e4m3fn, 1),
    "float8_e4m3fn": (torch.float8_e4m3fn, 1),
    "float8_e5m2": (torch.float8_e5m2, 1),
    "float8_e8m0fnu": (torch.float8_e8m0fnu, 1),
}
_SYNONYMS = {"bool_": "bool", "float": "float32", "half": "float16", "int": "int32", "fp32": "float32",
             "bf16": "bfloat16", "fp16": "float16", "tf32": "tfloat32", "float8_e4m3fnuz": "float8_e4m3fn",
             "float8_e5m2fnuz": "float8_e5m2"}
FLOATS = {"float16", "float32", "bfloat16", "tfloat32", "float8_e4m3", "float8_e4m3fn", "float8_e5m2",
          "float8_e8m0fnu"}
INTS = {"int8", "int16", "int32", "uint8", "uint16", "uint32", "bool"}
FP8 = {"float8_e4m3", "float8_e4m3fn", "float8_e5m2"}
# largest finite value of each float dtype, for memset checks
FINITE_MAX = {"float16": 65504.0, "float32": 3.4028234663852886e38, "bfloat16": 3.3895313892515355e38,
              "tfloat32": 3.4028234663852886e38, "float8_e4m3": 240.0, "float8_e4m3fn": 448.0,
              "float8_e5m2": 57344.0}
HAS_INF = {"float16", "float32", "bfloat16", "tfloat32", "float8_e4m3", "float8_e5m2"}


class DTypeError(TypeError):
    """A value that is not an NKI dtype was given where one is needed."""


def canonical(dtype: Any) -> str:
    """The NKI name of `dtype` (str, numpy dtype/type, torch dtype, ml_dtypes type)."""
    if isinstance(dtype, str):
        name = dtype
    elif isinstance(dtype, torch.dtype):
        name = str(dtype).removeprefix("torch.")
    else:
        try:
            import numpy as np

            name = np.dtype(dtype).name
        except Exception:  # noqa: BLE001 - anything numpy cannot read is not a dtype
            name = getattr(dtype, "__name__", repr(dtype))
    name = _SYNONYMS.get(name, name)
    if name not in _TABLE:
        raise DTypeError(f"{dtype!r} is not an NKI dtype: use one of {', '.join(sorted(_TABLE))} "
                         "(Trainium has no float64 or int64 tiles; cast the tensor before the launch)")
    return name


def torch_dtype(name: str) -> torch.dtype:
    return _TABLE[name][0]


def itemsize(name: str) -> int:
    return _TABLE[name][1]


def is_float(name: str) -> bool:
    return name in FLOATS


def is_int(name: str) -> bool:
    return name in INTS


def sentinel(name: str) -> float | int | bool:
    """What a new allocation holds until written (AWS's simulator: NaN for floats, 4 for integers)."""
    if name == "bool":
        return True
    return float("nan") if name in FLOATS else 4


def round_to(values: torch.Tensor, name: str) -> torch.Tensor:
    """`values` (any dtype) converted to the storage dtype of `name`, rounded as the device rounds."""
    target = torch_dtype(name)
    if name == "tfloat32":
        v = values.to(torch.float32).contiguous()
        bits = v.view(torch.int32)
        # round to nearest even on the 13 dropped mantissa bits; leave inf/nan alone
        lsb = (bits >> 13) & 1
        rounded = ((bits + 0x0FFF + lsb) & ~0x1FFF).view(torch.float32)
        return torch.where(torch.isfinite(v), rounded, v)
    if name == "float8_e4m3":
        v = values.to(torch.float32)
        out = v.to(target)
        overflow = v.abs() >= 248.0  # past 240 + half an ulp: IEEE-style e4m3 rounds to infinity
        if bool(overflow.any()):
            # float8_e4m3fn has no infinity: keep NaN there, which shows the overflow
            out = torch.where(overflow, torch.full_like(out, float("nan")), out)
        return out
    if values.dtype == target:
        return values
    if name == "bfloat16" and values.dtype == torch.float32:
        out = values.to(target)
        nan = torch.isnan(values)
        if bool(nan.any()):  # torch's cast can turn a NaN's bits into another NaN; the hardware keeps the top half
            top = (values.contiguous().view(torch.int32) >> 16).to(torch.int16).view(torch.bfloat16)
            out = torch.where(nan, top, out)
        return out
    if name in INTS and values.is_floating_point():
        values = torch.nan_to_num(values, nan=0.0).trunc()
        if name.startswith("uint"):
            return values.to(torch.int64).to(target)
    return values.to(target)


def compute_dtype(*names: str) -> torch.dtype:
    """The engines compute integers exactly when every operand is an integer, otherwise in float32."""
    if names and all(n in INTS and n != "bool" for n in names):
        return torch.int64
    return torch.float32


def promote(*names: str) -> str:
    """Result dtype of an nl.* operation on tiles of these dtypes (no dtype= given): the widest float."""
    order = ["float32", "tfloat32", "bfloat16", "float16", "float8_e5m2", "float8_e4m3fn", "float8_e4m3"]
    floats = [n for n in names if n in FLOATS]
    if floats:
        return min(floats, key=lambda n: order.index(n) if n in order else len(order))
    return names[0] if names else "float32"
