"""The hardware's dtype policy: no FP64; everything Trainium supports works and matches CPU."""

from __future__ import annotations

import pytest
import torch

SUPPORTED = [torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.uint8, torch.int32, torch.int64,
             torch.bool, torch.complex64]


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_fp64_is_refused_with_advice(dtype: torch.dtype) -> None:
    with pytest.raises(TypeError, match="no FP64.*Use torch"):
        torch.zeros(3, dtype=dtype, device="neuron")
    with pytest.raises(TypeError, match="no FP64"):
        torch.zeros(3, dtype=dtype).to("neuron")
    x = torch.ones(3, device="neuron")
    with pytest.raises(TypeError, match="no FP64"):
        x.double()
    with pytest.raises(TypeError, match="no FP64"):
        torch.sum(x, dtype=torch.float64)


@pytest.mark.parametrize("dtype", SUPPORTED)
def test_supported_dtypes_round_trip_and_compute(dtype: torch.dtype) -> None:
    cpu = (torch.arange(12) % 5).to(dtype).reshape(3, 4)
    dev = cpu.to("neuron")
    assert dev.dtype == dtype and torch.equal(dev.cpu(), cpu)
    if dtype == torch.bool:
        assert torch.equal((dev & dev).cpu(), cpu & cpu)
    else:
        assert torch.equal((dev + dev).cpu(), cpu + cpu)
        assert torch.equal((dev * 3).cpu(), cpu * 3)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_storage_and_conversion(dtype: torch.dtype) -> None:
    cpu = torch.tensor([0.5, -1.0, 2.0, 448.0 if dtype == torch.float8_e4m3fn else 57344.0])
    dev = cpu.to("neuron").to(dtype)
    assert dev.dtype == dtype
    assert torch.equal(dev.float().cpu(), cpu.to(dtype).float())


def test_fp64_cpu_tensor_can_be_narrowed_on_copy() -> None:
    dst = torch.empty(3, device="neuron")
    dst.copy_(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    assert torch.equal(dst.cpu(), torch.tensor([1.0, 2.0, 3.0]))
