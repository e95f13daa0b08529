"""The hardware's dtype policy, as TorchNeuron applies it: float64 and complex tensors live on the device and
their ops run as CPU fallbacks (reported, warned once); quantized and fnuz-float8 tensors are refused; everything
Trainium computes natively works and matches the CPU."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import torch_neuronx

SUPPORTED = [torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.uint8, torch.int32, torch.int64,
             torch.bool, torch.complex64]


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128, torch.complex64])
def test_float64_and_complex_run_as_reported_cpu_fallbacks(dtype: torch.dtype) -> None:
    torch_neuronx.clear_op_tracking()
    cpu = torch.randn(5, 3, dtype=dtype)
    dev = cpu.to("neuron")  # a transfer is no fallback
    assert dev.dtype == dtype and dev.device.type == "neuron"
    assert torch_neuronx.get_fallback_ops() == []
    got = (dev * 2 + 1).sum(0)
    assert got.device.type == "neuron" and torch.equal(got.cpu(), (cpu * 2 + 1).sum(0))
    fallbacks = torch_neuronx.get_fallback_ops()
    assert {"aten::mul.Tensor", "aten::add.Tensor", "aten::sum.dim_IntList"} <= set(fallbacks)
    assert not set(fallbacks) & set(torch_neuronx.get_executed_ops())  # no call of them ran on a core


def test_float32_work_is_no_fallback() -> None:
    torch_neuronx.clear_op_tracking()
    x = torch.randn(4, 4, device="neuron")
    (x @ x).relu().sum()
    assert torch_neuronx.get_fallback_ops() == []
    assert "aten::mm" in torch_neuronx.get_executed_ops()


def test_conversion_to_float64_on_the_device_is_a_fallback() -> None:
    torch_neuronx.clear_op_tracking()
    x = torch.ones(3, device="neuron")
    assert torch.equal(x.double().cpu(), torch.ones(3, dtype=torch.float64))
    assert torch.sum(x, dtype=torch.float64).dtype == torch.float64
    assert "aten::_copy_from" in torch_neuronx.get_fallback_ops()


FALLBACK_ONCE = r"""
import warnings, torch, torch_neuronx
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    x = torch.ones(3, dtype=torch.float64, device="neuron")
    for _ in range(3):
        x = x + 1
    torch.ones(2, device="neuron") + 1
mine = [str(w.message) for w in caught if "falls back to the CPU" in str(w.message)]
print(sum("aten::add.Tensor" in m for m in mine), len(mine))
"""


def test_each_fallback_op_warns_once() -> None:
    out = subprocess.run([sys.executable, "-c", FALLBACK_ONCE], capture_output=True, text=True, check=True)
    adds, total = map(int, out.stdout.split())
    assert adds == 1 and total >= 1


def test_forbidden_fallback_names_the_op_and_the_fix() -> None:
    code = ("import torch, torch_neuronx\n"
            "try:\n    torch.ones(3, dtype=torch.float64, device='neuron')\nexcept RuntimeError as e:\n    print(e)\n")
    env = dict(os.environ, TORCH_NEURONX_FORBID_CPU_FALLBACK="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert "aten::fill_.Scalar would fall back to the CPU" in out.stdout  # torch.ones fills on the device
    assert "float32 or bfloat16" in out.stdout and "TORCH_NEURONX_FORBID_CPU_FALLBACK" in out.stdout


@pytest.mark.parametrize("name", ["linalg.pinv", "linalg.matrix_rank", "pinverse"])
def test_float32_composites_with_float64_temporaries_work(name: str) -> None:
    """PyTorch builds these from float64 (or SVD) temporaries: they must run, match the CPU, and be reported."""
    torch_neuronx.clear_op_tracking()
    fn = {"linalg.pinv": torch.linalg.pinv, "linalg.matrix_rank": torch.linalg.matrix_rank,
          "pinverse": torch.pinverse}[name]
    a = torch.randn(6, 4)
    a[:, 3] = a[:, 0] + a[:, 1]  # rank 3
    got, want = fn(a.to("neuron")), fn(a)
    assert got.device.type == "neuron" and got.dtype == want.dtype
    torch.testing.assert_close(got.cpu(), want)
    assert "aten::_linalg_svd" in torch_neuronx.get_fallback_ops()


@pytest.mark.parametrize("op", ["linalg_qr", "_linalg_eigh", "linalg_inv_ex", "_linalg_det", "linalg_cholesky_ex"])
def test_torchneuron_cpu_fallback_table_ops_are_reported(op: str) -> None:
    torch_neuronx.clear_op_tracking()
    a = torch.randn(4, 4)
    spd = a @ a.T + 4 * torch.eye(4)
    call = {"linalg_qr": lambda t: torch.linalg.qr(t).R, "_linalg_eigh": lambda t: torch.linalg.eigh(t).eigenvalues,
            "linalg_inv_ex": torch.linalg.inv, "_linalg_det": torch.linalg.det,
            "linalg_cholesky_ex": torch.linalg.cholesky}[op]
    torch.testing.assert_close(call(spd.to("neuron")).cpu(), call(spd))
    assert f"aten::{op}" in torch_neuronx.get_fallback_ops()


def test_fp16_training_with_grad_scaler_matches_cpu() -> None:
    """GradScaler computes its inverse scale in float64: a float64 fallback, not a failure."""
    def run(device: str) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        scaler = torch.amp.GradScaler(device, init_scale=1024.0)
        x, y = torch.randn(32, 8).to(device), torch.randn(32, 1).to(device)
        for _ in range(4):
            opt.zero_grad()
            with torch.autocast(device, dtype=torch.bfloat16 if device == "cpu" else torch.float16):
                loss = torch.nn.functional.mse_loss(model(x).float(), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return [p.detach().cpu() for p in model.parameters()] + [torch.tensor(scaler.get_scale())]

    torch_neuronx.clear_op_tracking()
    dev = run("neuron")
    assert "aten::reciprocal" in torch_neuronx.get_fallback_ops()
    torch.manual_seed(0)
    # Reference: the same loop in float32 on the CPU with the same scaler arithmetic (CPU autocast has no fp16
    # GradScaler path worth comparing bit for bit): parameters agree to fp16 training precision.
    ref = run("cpu")
    for got, want in zip(dev, ref, strict=True):
        torch.testing.assert_close(got, want, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fnuz, torch.float8_e5m2fnuz])
def test_fnuz_float8_is_refused_with_the_dtype_to_use(dtype: torch.dtype) -> None:
    with pytest.raises(TypeError, match="NCC_EVRF005.*float8_e4m3fn"):
        torch.empty(3, dtype=dtype, device="neuron")
    with pytest.raises(TypeError, match="NCC_EVRF005"):
        torch.ones(3, device="neuron").to(dtype)


def test_quantized_is_refused_with_advice() -> None:
    q = torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8)
    with pytest.raises(NotImplementedError, match="quantized"):
        q.to("neuron")


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
    torch_neuronx.clear_op_tracking()
    dst = torch.empty(3, device="neuron")
    dst.copy_(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    assert torch.equal(dst.cpu(), torch.tensor([1.0, 2.0, 3.0]))
    assert torch_neuronx.get_fallback_ops() == []  # narrowed on the host side of the transfer


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
        widened += any(r.widened for r in ops)
        if not name.startswith("linalg."):  # linalg decompositions are in TorchNeuron's CPU-fallback table
            assert not any(r.fallback for r in ops)  # Trainium computes the rest on a core: no fallback
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
