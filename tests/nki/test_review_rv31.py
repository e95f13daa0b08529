"""The five defects review rv31 found in the NKI interpreter (issue 31), as tests of our own.

Each test states a fact of AWS's NKI 0.6 reference (aws-neuron/aws-neuron-sdk 81ce03a:
``nki/api/nki/isa/__init__.py`` for ``nisa.*``, ``nki/api/nki/language/__init__.py`` for ``nl.*``; rendered at
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/) and checks the interpreter against NumPy written
from that fact. Every refusal has a correct twin that must pass.
"""

from __future__ import annotations

import numpy as np
import pytest

import torch_neuronx.nki as nki
from torch_neuronx.testing.nki_checks import expect, on

nl = nki.language
nisa = nki.isa

RNG = np.random.default_rng(3131)


# ------------------------------------------------- 1. trn3 accumulates onto PSUM that a non-matmul instruction wrote


def _matmul_operands(stationary, moving):  # type: ignore[no-untyped-def]
    """The kernels' output in HBM and both operands loaded into SBUF (float32)."""
    k, m = stationary.shape
    n = moving.shape[1]
    out = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.shared_hbm)
    ts = nl.ndarray((k, m), dtype=nl.float32, buffer=nl.sbuf)
    tm = nl.ndarray((k, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ts, src=stationary)
    nisa.dma_copy(dst=tm, src=moving)
    return out, ts, tm


def _accumulate_onto(stationary, moving, init):  # type: ignore[no-untyped-def]
    """``init`` ("memset", "copy", "half", "none") fills the PSUM tile, then one matmul with accumulate=True."""
    out, ts, tm = _matmul_operands(stationary, moving)
    m, n = out.shape
    ps = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.psum)
    if init == "memset":
        nisa.memset(dst=ps, value=5.0)
    elif init == "copy":
        five = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=five, value=5.0)
        nisa.tensor_copy(dst=ps, src=five)
    elif init == "half":
        nisa.memset(dst=ps[:, 0:n // 2], value=5.0)
    nisa.nc_matmul(dst=ps, stationary=ts, moving=tm, accumulate=True)
    res = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=ps)
    nisa.dma_copy(dst=out, src=res)
    return out


S32 = RNG.standard_normal((32, 16)).astype(np.float32)
M32 = RNG.standard_normal((32, 8)).astype(np.float32)


@pytest.mark.parametrize("init", ["memset", "copy"])
def test_trn3_accumulates_onto_psum_a_non_matmul_instruction_initialised(init: str) -> None:
    """AWS nc_matmul: "On NeuronCore-v2 and NeuronCore-v3, matmul accumulating into a PSUM location that was
    value-initialized by a non-matmul instruction (e.g., memset, tensor_copy) is not supported": v4 (trn3) adds."""
    got = nki.jit(_accumulate_onto, platform_target="trn3")(S32, M32, init)
    np.testing.assert_allclose(got, 5.0 + S32.T @ M32, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_trn1_trn2_refuse_accumulating_onto_a_memset(target: str) -> None:
    """The same note: not supported on NeuronCore-v2 (trn1) and v3 (trn2)."""
    err = expect("err-psum-accumulate-uninitialized", nki.jit(_accumulate_onto, platform_target=target), S32, M32,
                 "memset", operand="accumulate")
    assert err.limit is not None


@pytest.mark.parametrize("init", ["none", "half"])
def test_trn3_refuses_accumulating_onto_psum_nothing_wrote(init: str) -> None:
    """AWS nc_matmul: "Using accumulate=True on an uninitialized PSUM location is undefined behavior on all
    targets" (here: half the tile memset, the other half never written)."""
    expect("err-psum-accumulate-uninitialized", nki.jit(_accumulate_onto, platform_target="trn3"), S32, M32, init,
           operand="accumulate")


# ------------------------------------------------- 2. gather-transpose reads the first src.shape[0] of more indices


ROWS_FP16 = RNG.standard_normal((256, 32)).astype(np.float16)
IDX_128x2 = RNG.permutation(256).astype(np.uint32).reshape(128, 2)


@on("trn2")
def gather_transpose(src, idx, rows):  # type: ignore[no-untyped-def]
    """A ``rows``-row gather view of ``src`` through index tile ``idx``, DMA-transposed into SBUF."""
    cols = src.shape[1]
    out = nl.ndarray((cols, rows), dtype=src.dtype, buffer=nl.shared_hbm)
    idx_sb = nl.ndarray(idx.shape, dtype=idx.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx_sb, src=idx)
    t = nl.ndarray((cols, rows), dtype=src.dtype, buffer=nl.sbuf)
    view = src.ap(pattern=[[cols, rows], [1, cols]], vector_offset=idx_sb, indirect_dim=0)
    nisa.dma_transpose(dst=t, src=view, axes=(1, 0))
    nisa.dma_copy(dst=out, src=t)
    return out


@pytest.mark.parametrize("rows", [144, 256])
def test_gather_transpose_reads_the_first_rows_of_more_indices(rows: int) -> None:
    """AWS dma_transpose: "indices.shape[0] * indices.shape[1] must be >= src.shape[0]" and
    "flat_indices = indices.T.flatten()[:src.shape[0]]" (256 indices for 144 gathered rows, and for 256)."""
    got = gather_transpose(ROWS_FP16, IDX_128x2, rows)
    np.testing.assert_array_equal(got, ROWS_FP16[IDX_128x2.T.flatten()[:rows]].T)


def test_gather_transpose_refuses_fewer_indices_than_rows() -> None:
    """The same sentence's other side: 128 indices cannot gather 144 rows."""
    expect("err-invalid-access-pattern", gather_transpose, ROWS_FP16, IDX_128x2[:, :1].copy(), 144,
           operand="vector_offset")


@on("trn2")
def gather_copy(src, idx, rows):  # type: ignore[no-untyped-def]
    out = nl.ndarray((rows, src.shape[1]), dtype=src.dtype, buffer=nl.shared_hbm)
    idx_sb = nl.ndarray(idx.shape, dtype=idx.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx_sb, src=idx)
    t = nl.ndarray((rows, src.shape[1]), dtype=src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=src.ap(pattern=[[src.shape[1], rows], [1, src.shape[1]]], vector_offset=idx_sb,
                                    indirect_dim=0))
    nisa.dma_copy(dst=out, src=t)
    return out


def test_dma_copy_gather_takes_one_index_per_row() -> None:
    """AWS dma_copy: the vector_offset indices are one per row ("an SBUF tensor of shape (P, 1)"); only
    dma_transpose documents reading a prefix of more. 16 indices for 8 rows is refused, 8 for 8 gathers."""
    idx = RNG.permutation(256)[:16].astype(np.int32).reshape(16, 1)
    expect("err-invalid-access-pattern", gather_copy, ROWS_FP16, idx, 8, operand="src")
    np.testing.assert_array_equal(gather_copy(ROWS_FP16, idx[:8].copy(), 8), ROWS_FP16[idx[:8, 0]])


# ------------------------------------------------- 3. non-integer immediates are refused, not truncated


@on("trn2")
def iota_kernel(pattern, offset, channel_multiplier):  # type: ignore[no-untyped-def]
    out = nl.ndarray((4, 8), dtype=nl.int32, buffer=nl.shared_hbm)
    t = nl.ndarray((4, 8), dtype=nl.int32, buffer=nl.sbuf)
    nisa.iota(dst=t, pattern=pattern, offset=offset, channel_multiplier=channel_multiplier)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_iota_integer_immediates() -> None:
    """AWS iota: "an int32 offset, a tensor access pattern ... and an int32 channel_multiplier";
    value = offset + channel_id * channel_multiplier + step * i."""
    got = iota_kernel([[2, 8]], 3, 5)
    np.testing.assert_array_equal(got, 3 + 5 * np.arange(4)[:, None] + 2 * np.arange(8)[None, :])


@pytest.mark.parametrize(("pattern", "offset", "multiplier", "operand"), [
    ([[0.5, 8]], 0, 1, "pattern"), ([[1, 8.0]], 0, 1, "pattern"), ([[1, 8]], 0.25, 1, "offset"),
    ([[1, 8]], 0, 1.5, "channel_multiplier"), ([[1, 8]], "3", 1, "offset")])
def test_iota_refuses_non_integer_immediates(pattern: list, offset: object, multiplier: object,
                                             operand: str) -> None:
    """The same int32 operands: 0.5 or "3" is refused (docs/nki.md: refused, not truncated)."""
    expect("err-invalid-operand", iota_kernel, pattern, offset, multiplier, operand=operand)


@on("trn2")
def affine_kernel(pattern, offset, on_false):  # type: ignore[no-untyped-def]
    out = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    ones = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    t = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.affine_select(dst=t, pattern=pattern, channel_multiplier=1, on_true_tile=ones, on_false_value=on_false,
                       cmp_op=nl.greater_equal, offset=offset)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_affine_select_integer_immediates() -> None:
    """AWS affine_select: affine_value = offset + channel_id * channel_multiplier + step * i; on_true_tile where
    cmp_op(affine_value, 0) holds, else the float32 on_false_value."""
    got = affine_kernel([[-1, 8]], 1, -2.0)
    value = 1 + np.arange(4)[:, None] - np.arange(8)[None, :]
    np.testing.assert_array_equal(got, np.where(value >= 0, 1.0, -2.0).astype(np.float32))


@pytest.mark.parametrize(("pattern", "offset", "on_false", "operand"), [
    ([[-0.5, 8]], 0, 0.0, "pattern"), ([[-1, 8]], 0.9, 0.0, "offset"), ([[-1, 8]], 0, "x", "on_false_value"),
    ([[-1, 8]], 0, None, "on_false_value")])
def test_affine_select_refuses_non_numeric_immediates(pattern: list, offset: object, on_false: object,
                                                      operand: str) -> None:
    """Integer pattern and offset (as iota); AWS: "The on_false_value must be float32" (a string is no number)."""
    expect("err-invalid-operand", affine_kernel, pattern, offset, on_false, operand=operand)


@on("trn2")
def tiled_matmul(stationary, moving, tile_size):  # type: ignore[no-untyped-def]
    out, ts, tm = _matmul_operands(stationary, moving)
    m, n = out.shape
    ps = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=ts, moving=tm, tile_position=(0, 0), tile_size=tile_size)
    res = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=ps)
    nisa.dma_copy(dst=out, src=res)
    return out


def test_matmul_tile_size_is_an_integer_pair() -> None:
    """AWS nc_matmul tiling: row_size 32 from NeuronCore-v3; ("32", 128) and (32.0, 128) are refused, (32, 128)
    multiplies."""
    s = RNG.standard_normal((32, 128)).astype(np.float32)
    m = RNG.standard_normal((32, 64)).astype(np.float32)
    np.testing.assert_allclose(tiled_matmul(s, m, (32, 128)), s.T @ m, rtol=1e-5, atol=1e-4)
    for bad in (("32", 128), (32.0, 128)):
        expect("err-invalid-operand", tiled_matmul, s, m, bad, operand="tile_size")


@on("trn2")
def reduce_kernel(data, axis):  # type: ignore[no-untyped-def]
    out = nl.ndarray((data.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray(data.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=data)
    r = nl.ndarray((data.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=r, op=nl.add, data=t, axis=axis)
    nisa.dma_copy(dst=out, src=r)
    return out


def test_tensor_reduce_axis_is_an_integer() -> None:
    """AWS tensor_reduce: "axis: int or tuple/list of ints"; "1" and 1.0 are refused, 1 sums the free axis."""
    data = np.arange(32, dtype=np.float32).reshape(4, 8)
    np.testing.assert_array_equal(reduce_kernel(data, 1), data.sum(axis=1, keepdims=True))
    for bad in ("1", 1.0, [1.0]):
        expect("err-invalid-operand", reduce_kernel, data, bad, operand="axis")


@on("trn2")
def ap_kernel(data, step):  # type: ignore[no-untyped-def]
    out = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=data.ap(pattern=[[step, 8], [1, 16]]))
    nisa.dma_copy(dst=out, src=t)
    return out


def test_access_pattern_steps_are_integers() -> None:
    """AWS .ap(): a pattern of [step, num] integer pairs; a step of 32 reads every other row, 32.5 is refused."""
    data = RNG.standard_normal((16, 16)).astype(np.float32)
    np.testing.assert_array_equal(ap_kernel(data, 32), data[::2])
    expect("err-invalid-access-pattern", ap_kernel, data, 32.5, operand="pattern")


# ------------------------------------------------- 4. nl.fori_loop's step is a compile-time positive integer


def _fori(step: object) -> list[int]:
    seen: list[int] = []

    def kernel(x):  # type: ignore[no-untyped-def]
        nl.fori_loop(0, 5, lambda i: seen.append(int(i)), step=step)
        return x

    nki.jit(kernel, platform_target="trn2")(np.zeros((1, 1), np.float32))
    return seen


def test_fori_loop_runs_range_lower_upper_step() -> None:
    """AWS fori_loop: "roughly equivalent to for i in range(lower, upper, step): body_fun(i)"."""
    assert _fori(2) == list(range(0, 5, 2))
    assert _fori(np.int64(1)) == list(range(5))


@pytest.mark.parametrize("step", [0, -1, 1.5, "1", True])
def test_fori_loop_refuses_a_step_that_is_not_a_positive_integer(step: object) -> None:
    """AWS fori_loop: "step: step size, must be a compile-time positive integer"."""
    with pytest.raises(nki.NkiValidationError) as info:
        _fori(step)
    assert info.value.code == "err-invalid-operand" and info.value.operand == "step", str(info.value)


def _loop(make: str, *bounds: object) -> list[int]:
    seen: list[int] = []

    def kernel(x):  # type: ignore[no-untyped-def]
        for i in getattr(nl, make)(*bounds):
            seen.append(int(i))
        return x

    nki.jit(kernel, platform_target="trn2")(np.zeros((1, 1), np.float32))
    return seen


@pytest.mark.parametrize("make", ["affine_range", "sequential_range", "static_range", "dynamic_range"])
def test_range_loops_take_integer_bounds(make: str) -> None:
    """AWS affine_range/sequential_range/static_range/dynamic_range(start, stop=None, step=1): Python's range;
    dynamic_range's "step size, must be a compile-time positive integer (not VirtualRegister)". A step of 0 or a
    bound of 2.5 is refused, not truncated."""
    assert _loop(make, 1, 7, 2) == list(range(1, 7, 2)) and _loop(make, 3) == [0, 1, 2]
    for bad in ((0, 4, 0), (2.5,), (0, 4.0), (0, 4, 1.0)):
        with pytest.raises(nki.NkiValidationError) as info:
            _loop(make, *bad)
        assert info.value.code == "err-invalid-operand", str(info.value)
    if make == "dynamic_range":
        with pytest.raises(nki.NkiValidationError):
            _loop(make, 4, 0, -1)
    else:
        assert _loop(make, 4, 0, -1) == [4, 3, 2, 1]


# ------------------------------------------------- 5. every refusal names its limit


def _sb(shape, dtype=nl.float32):  # type: ignore[no-untyped-def]
    return nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf)


def _filled(shape, buffer, dtype=nl.float32):  # type: ignore[no-untyped-def]
    t = nl.ndarray(shape, dtype=dtype, buffer=buffer)
    nisa.memset(dst=t, value=1.0)
    return t


def mixed_matmul(moving_dtype):  # type: ignore[no-untyped-def]
    """AWS nc_matmul: float32 (and tfloat32) operands pair only with float32 (tfloat32)."""
    out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=out, stationary=_filled((128, 128), nl.sbuf), moving=_filled((128, 64), nl.sbuf, moving_dtype))


def two_psum_inputs(second):  # type: ignore[no-untyped-def]
    """AWS tensor_tensor: at most one of data1 and data2 in PSUM."""
    nisa.tensor_tensor(dst=_sb((128, 8)), data1=_filled((128, 8), nl.psum), data2=_filled((128, 8), second),
                       op=nl.add)


def power_operands(first):  # type: ignore[no-untyped-def]
    """AWS tensor_tensor: nl.power runs on GpSimd, which has no PSUM access."""
    nisa.tensor_tensor(dst=_sb((128, 8)), data1=_filled((128, 8), first), data2=_filled((128, 8), nl.sbuf),
                       op=nl.power)


def scalar_copy(_unused):  # type: ignore[no-untyped-def]
    """AWS tensor_copy: the Scalar Engine copies from NeuronCore-v3."""
    nisa.tensor_copy(dst=_sb((128, 8)), src=_filled((128, 8), nl.sbuf), engine=nisa.engine.scalar)


@pytest.mark.parametrize(("kernel", "target", "bad", "good", "code", "operand"), [
    (mixed_matmul, "trn2", nl.bfloat16, nl.float32, "err-unsupported-dtype", "moving"),
    (two_psum_inputs, "trn2", nl.psum, nl.sbuf, "err-unsupported-memory", "data2"),
    (power_operands, "trn2", nl.psum, nl.sbuf, "err-unsupported-memory", "op"),
    (scalar_copy, "trn1", None, None, "err-unsupported-engine", "engine")])
def test_refusals_name_their_limit(kernel, target, bad, good, code, operand) -> None:  # type: ignore[no-untyped-def]
    """Each rule's refusal carries the limit it enforces, in ``limit`` and in the message; its twin passes."""
    err = expect(code, nki.jit(kernel, platform_target=target), bad, operand=operand)
    assert err.limit is not None and f"(limit: {err.limit})" in str(err)
    twin = ("trn2", None) if kernel is scalar_copy else (target, good)
    nki.jit(kernel, platform_target=twin[0])(twin[1])


# ------------------------------------------------- views: offsets, slices and sizes are integers, never truncated


@on("trn2")
def view_kernel(a, how, value):  # type: ignore[no-untyped-def]
    """Copy one (4, 8) window of the (8, 16) HBM input ``a``, addressed as ``how`` says, with ``value`` in it."""
    out = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf)
    src = {
        "ap_offset": lambda: a.ap([[16, 4], [1, 8]], offset=value),
        "ap_scalar_offset": lambda: a.ap([[16, 4], [1, 8]], scalar_offset=value),
        "ds": lambda: a[nl.ds(value, 4), 0:8],
        "slice_start": lambda: a[value:5, 0:8],
        "select": lambda: a.reshape((2, 4, 16)).select(0, value)[:, 0:8],
    }[how]()
    nisa.dma_copy(dst=t, src=src)
    nisa.dma_copy(dst=out, src=t)
    return out


A816 = np.arange(128, dtype=np.float32).reshape(8, 16)
VIEWS = {"ap_offset": lambda v: A816.reshape(-1)[v:v + 64].reshape(4, 16)[:, :8],
         "ap_scalar_offset": lambda v: A816[v:v + 4, :8], "ds": lambda v: A816[v:v + 4, :8],
         "slice_start": lambda v: A816[v:5, :8], "select": lambda v: A816.reshape(2, 4, 16)[v][:, :8]}


@pytest.mark.parametrize("how", sorted(VIEWS))
def test_view_offsets_are_exact_integers(how: str) -> None:
    """An integer offset addresses exactly the elements NumPy's slicing does (the correct twin)."""
    np.testing.assert_array_equal(view_kernel(A816, how, 1), VIEWS[how](1))


@pytest.mark.parametrize("how", sorted(VIEWS))
@pytest.mark.parametrize("value", [0.5, 1.0, "1"])
def test_view_offsets_refuse_non_integers(how: str, value: object) -> None:
    """0.5, 1.0 or "1" as an offset, slice bound or index is refused with the operand named, not truncated to 0
    or 1 (Python's own slicing refuses floats too)."""
    expect("err-invalid-operand", view_kernel, A816, how, value)
