"""Interpreter semantics: nki.simulate with NumPy, numerics as on the hardware (PSUM accumulation, bf16/fp8/tf32
rounding, NaN sentinels), views and access patterns, SPMD grids, output aliasing and the launch report."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch_neuronx.nki as nki
from torch_neuronx.nki import NkiValidationError

nl = nki.language
nisa = nki.isa


@nki.jit
def double(a):  # type: ignore[no-untyped-def]
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.multiply(nl.load(a), 2.0))
    return out


def test_simulate_takes_and_returns_numpy() -> None:
    a = np.arange(128 * 16, dtype=np.float32).reshape(128, 16)
    out = nki.simulate(double)(a)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    np.testing.assert_array_equal(out, 2 * a)
    plain = nki.simulate(double.fn)  # a plain function is wrapped
    np.testing.assert_array_equal(plain(a), 2 * a)
    np.testing.assert_array_equal(nki.simulate_kernel(double, a), 2 * a)


def test_kernels_that_write_their_arguments_update_them_in_place() -> None:
    @nki.jit
    def scale_into(a, out):  # type: ignore[no-untyped-def]
        nl.store(out, nl.multiply(nl.load(a), 3.0))
        return out

    a = np.ones((4, 8), dtype=np.float32)
    out = np.zeros((4, 8), dtype=np.float32)
    assert nki.simulate(scale_into)(a, out) is out  # the argument itself comes back
    np.testing.assert_array_equal(out, 3 * a)
    t_out = torch.zeros(4, 8, device="neuron")
    assert scale_into(torch.ones(4, 8, device="neuron"), t_out) is t_out
    assert t_out.cpu().eq(3).all()
    strided = np.zeros((8, 8), dtype=np.float32)[::-1]  # negative strides: worked on a copy, written back
    nki.simulate(scale_into)(a.repeat(2, 0), strided)
    np.testing.assert_array_equal(strided, 3 * np.ones((8, 8)))


def test_uninitialised_memory_reads_as_nan() -> None:
    @nki.jit
    def forgets_half(a):  # type: ignore[no-untyped-def]
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out[:, 0:8], nl.load(a[:, 0:8]))
        return out

    out = forgets_half(np.ones((128, 16), dtype=np.float32))
    assert np.isnan(out[:, 8:]).all() and (out[:, :8] == 1).all()

    @nki.jit
    def int_sentinel(a):  # type: ignore[no-untyped-def]
        out = nl.ndarray((2, 2), dtype=nl.int32, buffer=nl.shared_hbm)
        return out

    assert (int_sentinel(np.zeros(1, np.float32)) == 4).all()


def _psum_kernel(accumulate_second):  # type: ignore[no-untyped-def]
    @nki.jit
    def k(a, b):  # type: ignore[no-untyped-def]
        out = nl.ndarray((64, 32), dtype=nl.float32, buffer=nl.shared_hbm)
        sa, sb = nl.load(a), nl.load(b)
        acc = nl.ndarray((64, 32), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=sa, moving=sb)
        nisa.nc_matmul(dst=acc, stationary=sa, moving=sb, accumulate=accumulate_second)
        res = nl.ndarray((64, 32), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        nl.store(out, res)
        return out

    return k


def test_psum_first_write_overwrites_later_ones_accumulate() -> None:
    a = np.random.rand(128, 64).astype(np.float32)
    b = np.random.rand(128, 32).astype(np.float32)
    np.testing.assert_allclose(_psum_kernel(None)(a, b), 2 * a.T @ b, rtol=1e-5)  # inferred: accumulate
    np.testing.assert_allclose(_psum_kernel(True)(a, b), 2 * a.T @ b, rtol=1e-5)
    np.testing.assert_allclose(_psum_kernel(False)(a, b), a.T @ b, rtol=1e-5)  # overwrite

    @nki.jit
    def accumulate_fresh(a, b):  # type: ignore[no-untyped-def]
        acc = nl.ndarray((64, 32), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=nl.load(a), moving=nl.load(b), accumulate=True)

    with pytest.raises(NkiValidationError, match="err-psum-accumulate-uninitialized"):
        accumulate_fresh(a, b)


def test_bf16_operands_accumulate_in_fp32() -> None:
    # 128 products of 1 + 2^-8: in bf16 each sum would stall at 128 + ...; fp32 keeps every bit
    a = torch.full((128, 1), 1.0, dtype=torch.bfloat16)
    b = torch.full((128, 1), 1.0 + 2 ** -7, dtype=torch.bfloat16)

    @nki.jit
    def dot(x, y):  # type: ignore[no-untyped-def]
        out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=nl.load(x), moving=nl.load(y))
        res = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        nl.store(out, res)
        return out

    assert dot(a, b).item() == 128 * (1 + 2 ** -7)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float8_e5m2", "float8_e4m3fn", "tfloat32"])
def test_writes_round_to_nearest_even_like_the_device(dtype: str) -> None:
    values = torch.randn(128, 64) * 10

    @nki.jit
    def cast(x):  # type: ignore[no-untyped-def]
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        low = nl.ndarray(x.shape, dtype=dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=low, src=nl.load(x))
        back = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=back, src=low)
        nl.store(out, back)
        return out

    got = cast(values)
    if dtype == "tfloat32":  # 10 mantissa bits, round to nearest even
        bits = values.view(torch.int32)
        ref = ((bits + 0x0FFF + ((bits >> 13) & 1)) & ~0x1FFF).view(torch.float32)
    else:
        ref = values.to(getattr(torch, dtype)).float()
    assert torch.equal(got, ref)


def test_legacy_fp8_e4m3_overflows_past_240() -> None:
    @nki.jit
    def to_fp8(x):  # type: ignore[no-untyped-def]
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        low = nl.ndarray(x.shape, dtype=nl.float8_e4m3, buffer=nl.sbuf)
        nisa.tensor_copy(dst=low, src=nl.load(x))
        nl.store(out, low)
        return out

    out = to_fp8(torch.tensor([[240.0, 247.0, 248.0, -300.0]]))
    assert out[0, :2].tolist() == [240.0, 240.0] and out[0, 2:].isnan().all()


def test_spmd_grid_programs_share_their_outputs() -> None:
    @nki.jit
    def per_block(a):  # type: ignore[no-untyped-def]
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        i, j = nl.program_id(0), nl.program_id(1)
        assert nl.num_programs() == 8 and nl.num_programs(1) == 2 and nl.program_ndim() == 2
        t = nl.load(a[i, j])
        nl.store(out[i, j], nl.add(t, float(10 * i + j)))
        return out

    a = np.zeros((4, 2, 1, 3), dtype=np.float32)
    out = per_block[4, 2](a)
    assert out.shape == a.shape
    np.testing.assert_array_equal(out[:, :, 0, 0], np.array([[10 * i + j for j in range(2)] for i in range(4)]))
    assert nki.last_report().grid == (4, 2)
    out = per_block[nl.nc(2) * 2, nl.spmd_dim(2)](a)
    assert not np.isnan(out).any()


def test_views_reshape_permute_broadcast_and_patterns() -> None:
    @nki.jit
    def views(a):  # type: ignore[no-untyped-def]
        out = nl.ndarray((4, 6, 2), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)  # (4, 12)
        r = t.reshape((4, 2, 6)).permute((0, 2, 1))  # (4, 6, 2)
        c = nl.ndarray((4, 6, 2), dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=c, src=r)
        nl.store(out, c)
        assert t.get_pattern() == [[12, 4], [1, 12]] and t.is_contiguous() and not r.is_contiguous()
        assert t[nl.ds(1, 2), 3].shape == (2, 1) and a[1].shape == (12,)
        return out

    a = np.arange(48, dtype=np.float32).reshape(4, 12)
    np.testing.assert_array_equal(views(a), a.reshape(4, 2, 6).transpose(0, 2, 1))

    @nki.jit
    def reshape_partition(a):  # type: ignore[no-untyped-def]
        return nl.load(a).reshape((2, 24))

    with pytest.raises(NkiValidationError, match="partition dimension 4 of an on-chip tensor"):
        reshape_partition(a)


def test_indirect_dma_gathers_rows() -> None:
    @nki.jit
    def gather(data, idx):  # type: ignore[no-untyped-def]
        rows, cols = idx.shape[0], data.shape[1]
        out = nl.ndarray((rows, cols), dtype=data.dtype, buffer=nl.shared_hbm)
        ids = nl.ndarray((rows, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=ids, src=idx)
        tile = nl.ndarray((rows, cols), dtype=data.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=data.ap([[cols, rows], [1, cols]], vector_offset=ids, indirect_dim=0))
        nisa.dma_copy(dst=out, src=tile)
        return out

    data = np.arange(40, dtype=np.float32).reshape(10, 4)
    idx = np.array([[7], [0], [3]], dtype=np.int32)
    np.testing.assert_array_equal(gather(data, idx), data[[7, 0, 3]])
    with pytest.raises(NkiValidationError, match="out-of-bound"):
        gather(data, np.array([[10]], dtype=np.int32))


def test_iota_affine_select_and_register_loops() -> None:
    @nki.jit
    def masks(a):  # type: ignore[no-untyped-def]
        out = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        ramp = nl.ndarray((4, 4), dtype=nl.int32, buffer=nl.sbuf)
        nisa.iota(dst=ramp, pattern=[[1, 4]], offset=0, channel_multiplier=10)
        vals = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=vals, src=ramp)
        lower = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.affine_select(dst=lower, pattern=[[-1, 4]], channel_multiplier=1, on_true_tile=vals,
                           on_false_value=-1.0, cmp_op=nl.greater_equal)
        count = nl.zeros((4, 1), dtype=nl.float32)
        nl.fori_loop(0, nisa.register_alloc(3), lambda i: nisa.tensor_scalar(
            dst=count, data=count, op0=nl.add, operand0=1.0))
        nisa.tensor_scalar(dst=lower, data=lower, op0=nl.add, operand0=count)
        nl.store(out, lower)
        return out

    out = masks(np.zeros(1, np.float32))
    ramp = np.arange(4)[None, :] + 10 * np.arange(4)[:, None]
    np.testing.assert_array_equal(out, np.where(np.tril(np.ones((4, 4))) > 0, ramp, -1) + 3)


def test_launch_report_counts_instructions() -> None:
    double(np.zeros((128, 16), dtype=np.float32))
    report = nki.last_report()
    assert report.kernel == "double" and report.device == "numpy"
    assert report.instructions == {"nisa.dma_copy": 2, "nl.multiply": 1}  # instructions only
    assert report.allocations == {"nl.ndarray": 1} and report.total_instructions == 3
    assert report.sbuf_peak_bytes == 2 * 16 * 4 and report.psum_peak_banks == 0
    assert "double on" in str(report)


def test_neuron_tensors_in_neuron_tensors_out_without_copies() -> None:
    a = torch.randn(128, 16, device="neuron")
    out = double(a)
    assert out.device.type == "neuron" and torch.equal(out.cpu(), 2 * a.cpu())
    assert nki.last_report().device == "neuron"
    view = torch.randn(256, 16, device="neuron")[::2]  # a strided view: read in place
    assert torch.equal(double(view).cpu(), 2 * view.cpu())


OPS = {"add": torch.add, "subtract": torch.sub, "multiply": torch.mul, "maximum": torch.maximum,
       "minimum": torch.minimum, "divide": torch.div}
ACTS = {"exp": torch.exp, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu,
        "silu": torch.nn.functional.silu, "square": torch.square}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_alu_and_activation_agree_with_fp32_torch_then_rounding(dtype: str) -> None:
    """Differential: every operator on random tiles, against torch in float32 rounded once to the dst dtype."""
    g = torch.Generator().manual_seed(7)
    tdt = getattr(torch, dtype)
    a = (torch.randn(96, 40, generator=g) * 3).to(tdt)
    b = (torch.rand(96, 40, generator=g) + 0.5).to(tdt)
    col = torch.randn(96, 1, generator=g)

    @nki.jit
    def run(x, y, v, op, act, scale):  # type: ignore[no-untyped-def]
        out = nl.ndarray((3,) + tuple(x.shape), dtype=x.dtype, buffer=nl.shared_hbm)
        tx, ty, tv = nl.load(x), nl.load(y), nl.load(v)
        r = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=r, data1=tx, data2=ty, op=op)
        nl.store(out[0], r)
        nisa.tensor_scalar(dst=r, data=tx, op0=op, operand0=tv, reverse0=True, op1=nl.multiply, operand1=scale)
        nl.store(out[1], r)
        nisa.activation(dst=r, op=act, data=tx, bias=tv, scale=scale)
        nl.store(out[2], r)
        return out

    fa, fb = a.float(), b.float()
    for (name, fn), (act_name, act) in zip(OPS.items(), ACTS.items(), strict=True):
        out = run(a, b, col, getattr(nl, name), getattr(nl, act_name), 0.75)
        assert torch.equal(out[0], fn(fa, fb).to(tdt)), (name, dtype)
        assert torch.equal(out[1], (fn(col, fa) * 0.75).to(tdt)), (name, dtype)
        torch.testing.assert_close(out[2].float(), act(fa * 0.75 + col).to(tdt).float(), atol=1e-6, rtol=1e-6)
