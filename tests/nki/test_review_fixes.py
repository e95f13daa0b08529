"""The defects an independent review of the NKI interpreter found (issue 31's closing review), as tests of our own.

Each test states a fact of AWS's NKI 0.6 reference (aws-neuron/aws-neuron-sdk 81ce03a:
``nki/api/nki/isa/__init__.py``, ``nki/api/nki/language/__init__.py``, ``nki/api/nki.api.shared.rst``) and checks
the interpreter against NumPy written from that fact; every refusal has a correct twin that must pass.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import torch_neuronx.nki as nki
from torch_neuronx.testing.nki_checks import expect, on

nl = nki.language
nisa = nki.isa
P = 128


RNG = np.random.default_rng(31)
ROWS = RNG.standard_normal((40, 16)).astype(np.float32)


# ------------------------------------------------------------------ 1. runtime offsets are read when the DMA runs


@on("trn2")
def gather_twice(data, idx_a, idx_b):  # type: ignore[no-untyped-def]
    """One gather view, built once; its index tile reloaded between the two DMAs."""
    out = nl.ndarray((2, 8, 16), dtype=nl.float32, buffer=nl.shared_hbm)
    idx = nl.ndarray((8, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx, src=idx_a)
    view = data.ap(pattern=[[16, 8], [1, 16]], vector_offset=idx, indirect_dim=0)
    for i, source in enumerate((None, idx_b)):
        if source is not None:
            nisa.dma_copy(dst=idx, src=source)
        t = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=view)
        nisa.dma_copy(dst=out[i], src=t)
    return out


def test_vector_offset_indices_are_read_when_the_dma_runs() -> None:
    """AWS dma_copy: indirect addressing is "dynamic row selection at runtime"."""
    a = RNG.permutation(40)[:8].astype(np.int32).reshape(8, 1)
    b = RNG.permutation(40)[:8].astype(np.int32).reshape(8, 1)
    out = gather_twice(ROWS, a, b)
    np.testing.assert_array_equal(out, np.stack([ROWS[a[:, 0]], ROWS[b[:, 0]]]))


@on("trn2")
def register_rows(data, first, then):  # type: ignore[no-untyped-def]
    out = nl.ndarray((2, 4, 16), dtype=nl.float32, buffer=nl.shared_hbm)
    reg = nisa.register_alloc(first)
    view = data.ap(pattern=[[16, 4], [1, 16]], scalar_offset=reg, indirect_dim=0)
    for i in nl.sequential_range(2):
        t = nl.ndarray((4, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=view)
        nisa.dma_copy(dst=out[i], src=t)
        nisa.register_move(reg, then)
    return out


def test_scalar_offset_register_is_read_when_the_dma_runs() -> None:
    """AWS dma_copy scalar_offset: a register resolved at runtime; register_move after .ap() counts."""
    out = register_rows(ROWS, 3, 10)
    np.testing.assert_array_equal(out, np.stack([ROWS[3:7], ROWS[10:14]]))


def test_scalar_offset_out_of_bounds_at_runtime_is_refused_when_the_dma_runs() -> None:
    """The planted violation: the register moves past the end after the view was built (37 + 4 rows > 40)."""
    err = expect("err-tensor-access-out-of-bound", register_rows, ROWS, 3, 37)
    assert "runtime offset" in str(err)


def test_fori_loop_register_and_select_resolve_per_iteration() -> None:
    """AWS nl.fori_loop passes the loop register (usable as scalar_offset); NkiTensor.select's index "is resolved
    at runtime"."""
    @on("trn2")
    def kernel(data):  # type: ignore[no-untyped-def]
        out = nl.ndarray((3, 2, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        picked = nl.ndarray((3, 1, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        reg = nisa.register_alloc(0)
        row = data.select(0, reg)

        def body(i):  # type: ignore[no-untyped-def]
            t = nl.ndarray((2, 16), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=data.ap(pattern=[[16, 2], [1, 16]], scalar_offset=i, indirect_dim=0))
            nisa.dma_copy(dst=out[i.value], src=t)
            u = nl.ndarray((1, 16), dtype=nl.float32, buffer=nl.sbuf)
            nisa.register_move(reg, 5 * i.value + 1)
            nisa.dma_copy(dst=u, src=row)
            nisa.dma_copy(dst=picked[i.value], src=u)

        nl.fori_loop(0, 3, body)
        return out, picked

    out, picked = kernel(ROWS)
    np.testing.assert_array_equal(out, np.stack([ROWS[i:i + 2] for i in range(3)]))
    np.testing.assert_array_equal(picked[:, 0], ROWS[[1, 6, 11]])


# ------------------------------------------------------------------ 2. right_shift is a logical shift


def test_right_shift_is_logical_on_signed_integers() -> None:
    """AWS tbl-aluop: nl.right_shift is "Logical Shift Right", an arithmetic right shift is "Not supported"; bitvec
    operators treat elements as bit patterns."""
    @nki.jit
    def kernel(a, s):  # type: ignore[no-untyped-def]
        out = nl.ndarray((2, *a.shape), dtype=nl.int32, buffer=nl.shared_hbm)
        ta, ts = nl.load(a), nl.load(s)
        r = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=r, data1=ta, data2=ts, op=nl.right_shift)
        nisa.dma_copy(dst=out[0], src=r)
        q = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=q, data=ta, op0=nl.right_shift, operand0=1)
        nisa.dma_copy(dst=out[1], src=q)
        return out

    a = np.array([[-8, -1, 7, -2147483648]] * 4, dtype=np.int32)
    s = np.array([[1, 4, 1, 31]] * 4, dtype=np.int32)
    out = kernel(a, s)
    logical = (a.view(np.uint32) >> s.view(np.uint32)).view(np.int32)
    np.testing.assert_array_equal(out[0], logical)
    np.testing.assert_array_equal(out[1], (a.view(np.uint32) >> 1).view(np.int32))
    assert out[0][0, 0] == 2147483644  # -8 >> 1 on the bit pattern 0xFFFFFFF8


def test_nl_bitvec_functions_work_on_bit_patterns() -> None:
    """The nl forms of the bitvec operators on int32 tiles: the same bit-pattern semantics (they used to crash)."""
    @nki.jit
    def kernel(a, b):  # type: ignore[no-untyped-def]
        out = nl.ndarray((4, *a.shape), dtype=nl.int32, buffer=nl.shared_hbm)
        ta, tb = nl.load(a), nl.load(b)
        nl.store(out[0], nl.right_shift(ta, tb))
        nl.store(out[1], nl.bitwise_and(ta, tb))
        nl.store(out[2], nl.invert(ta))
        nl.store(out[3], nl.left_shift(ta, 1))
        return out

    a = np.array([[-8, 16777217, 7, -1]] * 2, dtype=np.int32)
    b = np.array([[1, 1, 1, 3]] * 2, dtype=np.int32)
    out = kernel(a, b)
    u = a.view(np.uint32)
    np.testing.assert_array_equal(out[0], (u >> b.view(np.uint32)).view(np.int32))
    np.testing.assert_array_equal(out[1], a & b)
    np.testing.assert_array_equal(out[2], ~a)
    np.testing.assert_array_equal(out[3], (u << np.uint32(1)).view(np.int32))


# ------------------------------------------------------------------ 3. nl.var keeps its dims


def test_var_always_has_the_keepdims_shape() -> None:
    """AWS nl.var: "keepdims: currently ignored; result always has keepdims=True shape", so x - var(x) broadcasts."""
    @nki.jit
    def kernel(a):  # type: ignore[no-untyped-def]
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        v = nl.var(t, axis=1)
        assert v.shape == (a.shape[0], 1)
        nl.store(out, nl.subtract(t, v))
        return out

    a = RNG.standard_normal((P, 32)).astype(np.float32)
    np.testing.assert_allclose(kernel(a), a - a.var(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ 4. the Scalar Engine's sin


def test_activation_sin_has_no_range_reduction_and_nl_sin_has() -> None:
    """AWS nki.api.shared: the Scalar Engine does no range reduction for sin, "extrapolates a cubic outside
    [-PI, PI] and sin(9.0) returns ~27.65", which nki.simulate reproduces; nl.sin range-reduces first."""
    @nki.jit
    def kernel(a):  # type: ignore[no-untyped-def]
        out = nl.ndarray((2, *a.shape), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        s = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=s, op=nl.sin, data=t)
        nisa.dma_copy(dst=out[0], src=s)
        nl.store(out[1], nl.sin(t))
        return out

    x = np.array([[9.0, -9.0, 3.0, -1.0, 0.5, math.pi]] * 2, dtype=np.float32)
    out = kernel(x)
    assert abs(out[0][0, 0] - 27.65) < 0.01 and abs(out[0][0, 1] + 27.65) < 0.01
    np.testing.assert_allclose(out[0][:, 2:], np.sin(x[:, 2:]), atol=1e-6)  # inside [-PI, PI]
    np.testing.assert_allclose(out[1], np.sin(x), atol=1e-6)


@pytest.mark.parametrize(("op", "outside", "inside"), [
    (nl.log, 0.0, 1.0), (nl.sqrt, 2.0 ** 120, 4.0), (nl.rsqrt, 2.0 ** -90, 4.0),
    (nl.reciprocal, -(2.0 ** -43), -2.0), (nl.arctan, 2.0, -1.5),
])
def test_activation_warns_outside_the_documented_valid_input_range(op, outside, inside) -> None:  # type: ignore[no-untyped-def]
    """AWS tbl-act-func: outside its Valid Input Range "the Scalar Engine will generate invalid output results";
    the interpreter computes the exact function and says so (NkiRangeWarning); the twin inside the range is quiet."""
    @nki.jit
    def kernel(a):  # type: ignore[no-untyped-def]
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        r = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=r, op=op, data=t)
        nisa.dma_copy(dst=out, src=r)
        return out

    with pytest.warns(nki.NkiRangeWarning, match=op.__name__):
        kernel(np.full((4, 2), outside, np.float32))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", nki.NkiRangeWarning)
        kernel(np.full((4, 2), inside, np.float32))


# ------------------------------------------------------------------ 5. reduce_cmd=idle leaves the registers


def test_activation_reduce_cmd_idle_reads_the_registers_unchanged() -> None:
    """AWS activation pseudo-code: idle "Do not modify reduce_regs"; with reduce_res, reduce_res = reduce_regs."""
    @nki.jit
    def kernel(a, b):  # type: ignore[no-untyped-def]
        out = nl.ndarray((a.shape[0], 3), dtype=nl.float32, buffer=nl.shared_hbm)
        ta, tb = nl.load(a), nl.load(b)
        e = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        res = nl.ndarray((a.shape[0], 3), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e, op=nl.copy, data=ta, reduce_op=nl.add, reduce_res=res[:, 0:1],
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.activation(dst=e, op=nl.copy, data=tb, reduce_op=nl.add, reduce_res=res[:, 1:2])  # idle
        nisa.activation(dst=e, op=nl.copy, data=tb, reduce_op=nl.add, reduce_res=res[:, 2:3],
                        reduce_cmd=nisa.reduce_cmd.reduce)
        nisa.dma_copy(dst=out, src=res)
        return out

    a, b = RNG.standard_normal((P, 8)).astype(np.float32), RNG.standard_normal((P, 8)).astype(np.float32)
    out = kernel(a, b)
    np.testing.assert_allclose(out[:, 0], a.sum(axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out[:, 1], out[:, 0])  # idle: the registers as the first call left them
    np.testing.assert_allclose(out[:, 2], a.sum(axis=1) + b.sum(axis=1), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ 6, 9. tensor_reduce operators


def _reduce_kernel(op, negate: bool = False):  # type: ignore[no-untyped-def]
    @nki.jit
    def kernel(a):  # type: ignore[no-untyped-def]
        out = nl.ndarray((a.shape[0], 1), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        r = nl.ndarray((a.shape[0], 1), dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=r, op=op, data=t, axis=1, negate=negate)
        nisa.dma_copy(dst=out, src=r)
        return out

    return kernel


def test_tensor_reduce_negate_only_with_arithmetic_operators() -> None:
    """AWS tensor_reduce: negate "only applicable when op is an arithmetic operator"."""
    a = np.array([[2, 4, 0]] * 4, dtype=np.int32)
    expect("err-unsupported-operator", _reduce_kernel(nl.bitwise_or, negate=True), a, operand="negate")
    np.testing.assert_array_equal(_reduce_kernel(nl.bitwise_or)(a), np.full((4, 1), 6))
    np.testing.assert_array_equal(_reduce_kernel(nl.add, negate=True)(a), np.full((4, 1), -6))  # the twin


@pytest.mark.parametrize(("op", "reference"), [
    (nl.logical_or, lambda x: (x != 0).any(axis=1)),
    (nl.logical_and, lambda x: (x != 0).all(axis=1)),
    (nl.logical_xor, lambda x: (x != 0).sum(axis=1) % 2 == 1),
])
def test_tensor_reduce_takes_the_logical_operators(op, reference) -> None:  # type: ignore[no-untyped-def]
    """AWS tbl-aluop: logical_and / logical_or / logical_xor are legal reduction operators."""
    a = (RNG.random((P, 6)) < 0.3).astype(np.float32)
    a[0] = 0
    a[1] = 1
    out = _reduce_kernel(op)(a)
    np.testing.assert_array_equal(out[:, 0], reference(a).astype(np.float32))


# ------------------------------------------------------------------ 7. gather with oob_mode=skip


def test_gather_with_oob_skip_leaves_the_destination_rows() -> None:
    """AWS oob_mode.skip "silently skips any operations involving out-of-bounds indices" (gathers as scatters)."""
    def make(mode):  # type: ignore[no-untyped-def]
        @nki.jit
        def kernel(data, idx_hbm):  # type: ignore[no-untyped-def]
            out = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.shared_hbm)
            idx = nl.ndarray((8, 1), dtype=nl.int32, buffer=nl.sbuf)
            nisa.dma_copy(dst=idx, src=idx_hbm)
            t = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=t, value=-1.0)
            nisa.dma_copy(dst=t, src=data.ap(pattern=[[16, 8], [1, 16]], vector_offset=idx, indirect_dim=0),
                          oob_mode=mode)
            nisa.dma_copy(dst=out, src=t)
            return out

        return kernel

    idx = np.arange(8, dtype=np.int32).reshape(8, 1) * 3
    idx[5] = 1000
    out = make(nisa.oob_mode.skip)(ROWS, idx)
    expected = ROWS[np.where(idx[:, 0] < len(ROWS), idx[:, 0], 0)].copy()
    expected[5] = -1.0
    np.testing.assert_array_equal(out, expected)
    expect("err-tensor-access-out-of-bound", make(nisa.oob_mode.error), ROWS, idx)  # the default refuses


# ------------------------------------------------------------------ 8, 18. shapes refused before allocation


def _sbuf_tile(shape, dtype=nl.float32, target="trn2"):  # type: ignore[no-untyped-def]
    @on(target)
    def kernel(x):  # type: ignore[no-untyped-def]
        nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf)

    return kernel


def test_one_sbuf_tile_larger_than_a_partition_is_an_error_in_every_mode() -> None:
    """AWS activation/tile size: elements per partition "must not exceed the physical size of each SBUF partition"
    (trn2: 224 KiB = 229376 bytes, nl.tile_size.total_available_sbuf_size)."""
    x = np.zeros(1, np.float32)
    expect("err-size-of-dimension-exceed-arch-limit", _sbuf_tile((P, 60000)), x, operand="shape")  # 240000 B
    _sbuf_tile((P, 229376 // 4))(x)  # exactly one partition: accepted (the twin)
    expect("err-size-of-dimension-exceed-arch-limit", _sbuf_tile((P, 2 ** 40)), x)  # never reaches the allocator


def test_non_integer_shapes_are_refused() -> None:
    x = np.zeros(1, np.float32)
    err = expect("err-invalid-shape", _sbuf_tile((3.5, 4)), x, operand="shape")
    assert "3.5" in str(err)
    _sbuf_tile((np.int64(3), 4))(x)  # integer types other than int are fine


# ------------------------------------------------------------------ 10-12. dma_transpose rules


def _transpose(shape, dtype, target, *, gather: bool = False, hwdge: bool = False,  # type: ignore[no-untyped-def]
               index_dtype=nl.uint32):
    @on(target)
    def kernel(src):  # type: ignore[no-untyped-def]
        out = nl.ndarray(shape[::-1], dtype=dtype, buffer=nl.shared_hbm)
        d = nl.ndarray(shape[::-1], dtype=dtype, buffer=nl.sbuf)
        view = src
        if gather:
            idx = nl.ndarray((shape[0], 1), dtype=index_dtype, buffer=nl.sbuf)
            nisa.iota(dst=idx, pattern=[[0, 1]], offset=0, channel_multiplier=1)
            view = src.ap(pattern=[[shape[1], shape[0]], [1, shape[1]]], vector_offset=idx, indirect_dim=0)
        nisa.dma_transpose(dst=d, src=view, dge_mode=nisa.dge_mode.hwdge if hwdge else nisa.dge_mode.unknown)
        nisa.dma_copy(dst=out, src=d)
        return out

    return kernel


def test_dma_transpose_gather_is_trn2_plus_and_two_byte_only() -> None:
    """AWS dma_transpose, indirect transpose: "TRN2+ only", "src.dtype is 2 bytes"."""
    src16 = RNG.standard_normal((16, 32)).astype(np.float16)
    expect("err-unsupported-feature", _transpose((16, 32), nl.float16, "trn1", gather=True), src16)
    expect("err-unsupported-dtype", _transpose((16, 32), nl.float32, "trn2", gather=True),
           src16.astype(np.float32))
    np.testing.assert_array_equal(_transpose((16, 32), nl.float16, "trn2", gather=True)(src16), src16.T)
    # "indices.dtype is np.uint32": int32 indices are refused (issue 31, second pass)
    expect("err-unsupported-dtype", _transpose((16, 32), nl.float16, "trn2", gather=True, index_dtype=nl.int32),
           src16, operand="vector_offset")


def test_hwdge_transpose_of_a_2d_source_has_16_rows() -> None:
    """AWS dma_transpose, hardware DGE: "For 2-d input tiles, src.shape[0] == 16"."""
    src = RNG.standard_normal((32, 16)).astype(np.float16)
    expect("err-unsupported-feature", _transpose((32, 16), nl.float16, "trn2", hwdge=True), src, operand="src")
    np.testing.assert_array_equal(_transpose((16, 16), nl.float16, "trn2", hwdge=True)(src[:16]), src[:16].T)
    # 3-D: src.shape[0] in {1, 2, 4, 8, 16} and src.shape[0] * src.shape[-2] a multiple of 16
    cube = RNG.standard_normal((3, 16, 8)).astype(np.float16)
    expect("err-unsupported-feature", _transpose((3, 16, 8), nl.float16, "trn2", hwdge=True), cube, operand="src")
    ok = RNG.standard_normal((2, 8, 16)).astype(np.float16)
    np.testing.assert_array_equal(_transpose((2, 8, 16), nl.float16, "trn2", hwdge=True)(ok), ok.transpose(2, 1, 0))


# ------------------------------------------------------------------ 13. fp8 flavours do not mix


def test_matmul_does_not_mix_legacy_and_ocp_e4m3() -> None:
    """AWS nc_matmul: "float8_e4m3 (legacy) and float8_e4m3fn cannot be mixed in the same matmul" (v4)."""
    def make(s_dt, m_dt):  # type: ignore[no-untyped-def]
        @on("trn3")
        def kernel(x):  # type: ignore[no-untyped-def]
            s = nl.ndarray((32, 8), dtype=s_dt, buffer=nl.sbuf)
            m = nl.ndarray((32, 8), dtype=m_dt, buffer=nl.sbuf)
            nisa.memset(dst=s, value=1.0)
            nisa.memset(dst=m, value=2.0)
            d = nl.ndarray((8, 8), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=d, stationary=s, moving=m)
            out = nl.ndarray((8, 8), dtype=nl.float32, buffer=nl.shared_hbm)
            t = nl.ndarray((8, 8), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=t, src=d)
            nisa.dma_copy(dst=out, src=t)
            return out

        return kernel

    x = np.zeros(1, np.float32)
    expect("err-unsupported-dtype", make(nl.float8_e4m3, nl.float8_e4m3fn), x, operand="moving")
    np.testing.assert_array_equal(make(nl.float8_e4m3fn, nl.float8_e5m2)(x), np.full((8, 8), 64.0))


# ------------------------------------------------------------------ 14, 17. activation rules per generation


def test_activation_reciprocal_takes_no_bias_on_trn1() -> None:
    """AWS nki.api.shared: activation(op=nl.reciprocal) "doesn't support setting bias on NeuronCore-v2"."""
    def make(target):  # type: ignore[no-untyped-def]
        @on(target)
        def kernel(a, b):  # type: ignore[no-untyped-def]
            out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
            t, tb = nl.load(a), nl.load(b)
            r = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=r, op=nl.reciprocal, data=t, bias=tb)
            nisa.dma_copy(dst=out, src=r)
            return out

        return kernel

    a = RNG.uniform(1, 2, (P, 8)).astype(np.float32)
    b = RNG.uniform(1, 2, (P, 1)).astype(np.float32)
    expect("err-activation-bias-invalid-type", make("trn1"), a, b, operand="bias")
    np.testing.assert_allclose(make("trn2")(a, b), 1.0 / (a + b), rtol=1e-6)


def test_activation_reduce_takes_max_from_trn2_and_only_add_on_trn1() -> None:
    """AWS activation_reduce (the most specific text for it): "On NeuronCore-v2, the reduce_op must be nl.add"."""
    def make(target):  # type: ignore[no-untyped-def]
        @on(target)
        def kernel(a):  # type: ignore[no-untyped-def]
            out = nl.ndarray((a.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
            t = nl.load(a)
            e = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
            r = nl.ndarray((a.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation_reduce(dst=e, op=nl.exp, data=t, reduce_op=nl.maximum, reduce_res=r)
            nisa.dma_copy(dst=out, src=r)
            return out

        return kernel

    a = RNG.standard_normal((P, 8)).astype(np.float32)
    expect("err-unsupported-operator", make("trn1"), a, operand="reduce_op")
    np.testing.assert_allclose(make("trn2")(a)[:, 0], np.exp(a).max(axis=1), rtol=1e-6)


# ------------------------------------------------------------------ 15, 16. DMA options per generation


def _dma(target, **options):  # type: ignore[no-untyped-def]
    @on(target)
    def kernel(x):  # type: ignore[no-untyped-def]
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x, **options)
        nisa.dma_copy(dst=out, src=t)
        return out

    return kernel


def test_hwdge_from_trn2_and_priority_from_trn3() -> None:
    """AWS dma_copy: "Hardware based DGE is only supported for NeuronCore-v3 or newer"; priority is a QoS level
    0-3 "(NeuronCore-v4+ only)"."""
    x = RNG.standard_normal((8, 16)).astype(np.float32)
    expect("err-unsupported-feature", _dma("trn1", dge_mode=nisa.dge_mode.hwdge), x, operand="dge_mode")
    np.testing.assert_array_equal(_dma("trn2", dge_mode=nisa.dge_mode.hwdge)(x), x)
    expect("err-unsupported-feature", _dma("trn2", priority=1), x, operand="priority")
    expect("err-invalid-operand", _dma("trn3", priority=7), x, operand="priority")
    np.testing.assert_array_equal(_dma("trn3", priority=1)(x), x)


# ------------------------------------------------------------------ 19. instruction counts


def test_report_counts_instructions_and_allocations_apart() -> None:
    """The docs' add kernel: 2 loads, 1 add, 1 store are 4 instructions; its 3 nl.ndarray calls are memory."""
    @nki.jit
    def add_kernel(a, b):  # type: ignore[no-untyped-def]
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        ta = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        tb = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=ta, src=a)
        nisa.dma_copy(dst=tb, src=b)
        nisa.tensor_tensor(dst=ta, data1=ta, data2=tb, op=nl.add)
        nisa.dma_copy(dst=out, src=ta)
        return out

    a = np.ones((P, 4), np.float32)
    np.testing.assert_array_equal(add_kernel(a, a), a + a)
    report = nki.last_report()
    assert report.instructions == {"nisa.dma_copy": 3, "nisa.tensor_tensor": 1}
    assert report.total_instructions == 4 and report.allocations == {"nl.ndarray": 3}


# ------------------------------------------------------------------ 20. what is not implemented says so


def test_unimplemented_names_fail_loudly_and_are_listed_in_the_docs() -> None:
    """nl.dropout and .ap(dtype=) are not emulated: an AttributeError and err-unsupported-feature, both listed in
    docs/nki.md's "Not implemented" table (never a silent approximation)."""
    assert not hasattr(nl, "dropout")

    @nki.jit
    def kernel(x):  # type: ignore[no-untyped-def]
        x.ap(pattern=[[16, 8], [1, 16]], dtype=nl.int32)

    expect("err-unsupported-feature", kernel, ROWS, operand="dtype")
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "nki.md").read_text()
    table = docs[docs.index("**Not implemented.**"):docs.index("## AWS's published kernels")]
    assert "`nl.dropout`" in table and "`.ap(..., dtype=)`" in table
