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


# Ops whose CPU kernel lacks float16/bfloat16 (found by running op_db's samples in both dtypes on neuron and
# keeping those the op tracker reports as CPU fallbacks): they run in float32 and are cast back.
WIDENED = ["special.ndtri", "special.erfcx", "special.log_ndtr", "special.zeta", "special.bessel_j0",
           "special.modified_bessel_k1", "special.chebyshev_polynomial_t", "special.hermite_polynomial_h",
           "nn.functional.avg_pool3d", "nn.functional.multi_margin_loss", "nn.functional.pdist", "cdist",
           "linalg.cholesky", "linalg.svdvals", "linalg.solve_triangular", "histogram", "_upsample_bilinear2d_aa"]


def _tree(x, f):  # type: ignore[no-untyped-def]
    if isinstance(x, torch.Tensor):
        return f(x)
    if isinstance(x, list | tuple) and not hasattr(x, "_fields"):
        return type(x)(_tree(i, f) for i in x)
    if isinstance(x, dict):
        return {k: _tree(v, f) for k, v in x.items()}
    return x


def _flat(x) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, list | tuple):
        return [t for i in x for t in _flat(i)]
    return []


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", WIDENED)
def test_widened_ops_return_the_dtype_promotion_gives(name: str, dtype: torch.dtype) -> None:
    """The float32 detour is invisible: result dtypes are what the op's meta kernel (PyTorch's rules) says."""
    from torch.testing._internal.common_methods_invocations import op_db

    from torch_neuronx.tools import op_tracker

    op = next(o for o in op_db if o.name == name)
    widened = 0
    for sample in list(op.sample_inputs("cpu", dtype, requires_grad=False))[:4]:
        args = [_tree(a, lambda t: t.to("neuron")) for a in (sample.input, sample.args, sample.kwargs)]
        with op_tracker.track() as ops:
            got = op(args[0], *args[1], **args[2])
        try:
            meta = [_tree(a, lambda t: t.to("meta")) for a in (sample.input, sample.args, sample.kwargs)]
            want = [t.dtype for t in _flat(op(meta[0], *meta[1], **meta[2]))]
        except NotImplementedError:  # no meta kernel (histogram): the float32 run narrowed back
            wide = [_tree(a, lambda t: t.float() if t.dtype == dtype else t)
                    for a in (sample.input, sample.args, sample.kwargs)]
            want = [dtype if t.dtype == torch.float32 else t.dtype for t in _flat(op(wide[0], *wide[1], **wide[2]))]
        assert [t.dtype for t in _flat(got)] == want
        widened += any(r.fallback for r in ops)
    assert widened, "no sample took the widened path any more: drop the op from WIDENED"


def test_widened_complex_result_is_complex32_for_half() -> None:
    """pow(half, 1j): promotion gives complex32 (what CUDA returns); the CPU has no ComplexHalf kernel."""
    x = torch.tensor([0.5, 2.0], dtype=torch.half)
    got = torch.pow(x.to("neuron"), 1.0j)
    assert got.dtype == torch.result_type(x, 1.0j) == torch.complex32
    want = torch.pow(x.float(), 1.0j)
    assert torch.allclose(got.cpu().to(torch.complex64), want, atol=1e-3)
    bf = torch.tensor([0.5, 2.0], dtype=torch.bfloat16)
    assert torch.pow(bf.to("neuron"), 1.0j).dtype == torch.result_type(bf, 1.0j)


def test_an_op_no_dtype_takes_raises_the_original_error() -> None:
    """bitwise_and on float16 is invalid on every device: the float32 detour must not change the error
    (found by the differential fuzzer)."""
    x = torch.ones(3, dtype=torch.half)
    with pytest.raises(RuntimeError) as cpu_error:
        torch.bitwise_and(x, x)
    with pytest.raises(RuntimeError) as neuron_error:
        torch.bitwise_and(x.to("neuron"), x.to("neuron"))
    assert str(neuron_error.value).split("\n")[0] == str(cpu_error.value).split("\n")[0]
    assert "'Half'" in str(neuron_error.value)
