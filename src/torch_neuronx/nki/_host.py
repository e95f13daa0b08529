"""Host views of kernel arguments: torch CPU tensors, NumPy arrays and neuron tensors, zero-copy.

The emulated device keeps its memory on the host, so a ``neuron`` tensor's
storage can be read and written by CPU torch ops through an alias of the same
bytes; a kernel launched on neuron tensors therefore writes its outputs in
place, with no copy in or out. The alias holds a reference to the device
tensor, which keeps the memory alive while the kernel runs.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch


def alias_device_tensor(t: torch.Tensor) -> torch.Tensor:
    """A flat CPU tensor over the whole storage of `t` (device memory is host memory)."""
    storage = t.untyped_storage()
    nbytes = storage.nbytes()
    count = nbytes // t.element_size()
    if t.device.type == "cpu":
        return torch.empty(0, dtype=t.dtype).set_(storage, 0, (count,), (1,))
    if count == 0:
        return torch.empty(0, dtype=t.dtype)
    buffer = (ctypes.c_uint8 * nbytes).from_address(storage.data_ptr())
    flat = torch.frombuffer(buffer, dtype=torch.uint8)
    return flat.view(t.dtype)[:count]


def numpy_to_torch(array: Any) -> torch.Tensor:
    """A torch CPU tensor sharing `array`'s memory (bfloat16/float8 from ml_dtypes by their bits)."""
    import numpy as np

    name = array.dtype.name
    special = {"bfloat16": torch.bfloat16, "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
               "float8_e4m3": torch.float8_e4m3fn}
    if name in special:
        bits = array.view(np.uint16 if array.dtype.itemsize == 2 else np.uint8)
        return torch.from_numpy(bits).view(special[name])
    return torch.from_numpy(array)


def torch_to_numpy(t: torch.Tensor) -> Any:
    """The values of a CPU tensor as NumPy (ml_dtypes types for bfloat16/float8 when installed, else float32)."""
    special = {torch.bfloat16: "bfloat16", torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2"}
    if t.dtype in special:
        try:
            import ml_dtypes

            np_type = getattr(ml_dtypes, special[t.dtype])
            bits = t.contiguous().view(torch.uint16 if t.element_size() == 2 else torch.uint8).numpy()
            return bits.view(np_type)
        except ImportError:
            return t.to(torch.float32).numpy()
    if t.dtype in (torch.uint16, torch.uint32):
        return t.to(torch.int64).numpy().astype({torch.uint16: "uint16", torch.uint32: "uint32"}[t.dtype])
    return t.numpy()
