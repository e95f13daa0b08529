"""Behaviour documented in AWS's NKI 0.6 API reference, written as tests of our own (issue 31).

Each test states a documented fact of aws-neuron/aws-neuron-sdk ``nki/api/nki/isa/__init__.py`` or
``nki/api/nki/language/__init__.py`` (commit 81ce03a) and checks the interpreter against NumPy written from that
fact, on each target (trn1 = NeuronCore-v2, trn2 = v3, trn3 = v4) where the documented behaviour differs. Every
refusal has a correct twin that must pass.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch_neuronx.nki as nki
from torch_neuronx.nki import NkiValidationError
from torch_neuronx.testing.nki_checks import expect, on

nl = nki.language
nisa = nki.isa
P = 128


# ------------------------------------------------------------------------------------ 1. dma_transpose gather


def gather_transpose(src_hbm, idx_hbm):  # type: ignore[no-untyped-def]
    n_cols = idx_hbm.shape[1]
    f = P * n_cols
    out = nl.ndarray((P, f), dtype=src_hbm.dtype, buffer=nl.shared_hbm)
    idx = nl.ndarray(idx_hbm.shape, dtype=idx_hbm.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx, src=idx_hbm)
    dst = nl.ndarray((P, f), dtype=src_hbm.dtype, buffer=nl.sbuf)
    nisa.memset(dst=dst, value=0)
    nisa.dma_transpose(dst=dst, src=src_hbm.ap(pattern=[[P, f], [1, P]], vector_offset=idx, indirect_dim=0),
                       axes=(1, 0))
    nisa.dma_copy(dst=out, src=dst)
    return out


@pytest.mark.parametrize("n_cols", [1, 2])
def test_dma_transpose_gather_reads_2d_indices_column_major(n_cols: int) -> None:
    """AWS dma_transpose: flat_indices = indices.T.flatten(); gathered = src[flat_indices, :]; dst = gathered.T."""
    rows = P * n_cols
    src = torch.randn(rows, P).to(torch.bfloat16)
    idx = torch.randperm(rows).reshape(P, n_cols).to(torch.uint32)  # AWS: "indices.dtype is np.uint32"
    out = nki.simulate(nki.jit(gather_transpose, platform_target="trn2"))(src, idx)
    flat = idx.numpy().T.reshape(-1)
    expected = src.float().numpy()[flat, :].T
    assert np.array_equal(out.float().numpy(), expected)


# ------------------------------------------------------------------------------------ 2. abs_max / abs_min


@pytest.mark.parametrize(("fn", "x", "y", "result"), [
    ("abs_max", -5.0, 3.0, -5.0), ("abs_max", 1.0, -1.0, -1.0),  # the signed value; a tie returns y
    ("abs_min", 5.0, -3.0, -3.0), ("abs_min", 1.0, -1.0, -1.0),
])
def test_abs_max_and_abs_min_return_the_signed_input(fn: str, x: float, y: float, result: float) -> None:
    """AWS nl.abs_max/abs_min docstring examples and asserts, on trn3 (NeuronCore-v4)."""
    @on("trn3")
    def kernel(a):  # type: ignore[no-untyped-def]
        out = nl.ndarray((P, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        ta = nl.full((P, 512), x, dtype=nl.float32, buffer=nl.sbuf)
        tb = nl.full((P, 1), y, dtype=nl.float32, buffer=nl.sbuf)
        c = getattr(nl, fn)(ta, tb)
        nisa.dma_copy(dst=out, src=c)
        return out

    assert np.all(kernel(np.zeros((1, 1), np.float32)) == result)


def test_tensor_tensor_abs_max_is_signed_and_v4_only() -> None:
    def kernel(a, b):  # type: ignore[no-untyped-def]
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        ta, tb = nl.load(a), nl.load(b)
        r = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=r, data1=ta, data2=tb, op=nl.abs_max)
        nisa.dma_copy(dst=out, src=r)
        return out

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((P, 64), dtype=np.float32), rng.standard_normal((P, 64), dtype=np.float32)
    out = nki.jit(kernel, platform_target="trn3")(a, b)
    assert np.array_equal(out, np.where(np.abs(a) > np.abs(b), a, b))
    for target in ("trn1", "trn2"):
        err = expect("err-unsupported-operator", nki.jit(kernel, platform_target=target), a, b, operand="op")
        assert "NeuronCore-v4" in str(err)

    @on("trn2")
    def nl_form(a):  # type: ignore[no-untyped-def]
        t = nl.full((P, 4), 1.0, dtype=nl.float32, buffer=nl.sbuf)
        nl.abs_min(t, t)

    expect("err-unsupported-operator", nl_form, a)


# ------------------------------------------------------------------------------------ 3. is_transpose


def matmul_kernel(stationary, moving, is_transpose=False, dst_dtype="float32"):  # type: ignore[no-untyped-def]
    out = nl.ndarray((stationary.shape[1], moving.shape[1]), dtype=dst_dtype, buffer=nl.shared_hbm)
    s, m = nl.load(stationary), nl.load(moving)
    acc = nl.ndarray(out.shape, dtype=dst_dtype, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=s, moving=m, is_transpose=is_transpose)
    r = nl.ndarray(out.shape, dtype=dst_dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=r, src=acc)
    nisa.dma_copy(dst=out, src=r)
    return out


@pytest.mark.parametrize("target", ["trn1", "trn2", "trn3"])
def test_is_transpose_with_a_square_moving_operand_still_multiplies(target: str) -> None:
    """AWS nc_matmul: on v2 is_transpose only labels the instruction; a moving tile that is not the identity
    multiplies as always: dst = stationary.T @ moving."""
    rng = np.random.default_rng(1)
    s = rng.integers(-3, 4, (P, P)).astype(np.float32)
    m = rng.integers(-3, 4, (P, P)).astype(np.float32)
    out = nki.jit(matmul_kernel, platform_target=target)(s, m, True)
    assert np.array_equal(out, s.T @ m)


def test_is_transpose_with_the_identity_is_bit_accurate_from_v3() -> None:
    """AWS: starting NeuronCore-v3, transpose mode transposes NaN/Inf properly (the dst has the input dtype)."""
    s = torch.randn(P, 64).to(torch.bfloat16)
    s[3, 5], s[7, 1] = float("nan"), float("inf")
    eye = torch.eye(P, dtype=torch.bfloat16)
    out = nki.simulate(nki.jit(matmul_kernel, platform_target="trn2"))(s, eye, True, "bfloat16")
    assert torch.equal(out.view(torch.int16), s.T.contiguous().view(torch.int16))


# ------------------------------------------------------------------------------------ 4. engine arithmetic


def test_int32_reductions_run_in_float32_math() -> None:
    """AWS tensor_reduce: arithmetic reductions cast to float32 and reduce in float32 math."""
    @nki.jit
    def total(a):  # type: ignore[no-untyped-def]
        out = nl.ndarray((a.shape[0], 1), dtype=nl.int32, buffer=nl.shared_hbm)
        t = nl.load(a)
        r = nl.ndarray((a.shape[0], 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=r, op=nl.add, data=t, axis=1)
        nisa.dma_copy(dst=out, src=r)
        return out

    a = np.full((P, 4), 16777217, dtype=np.int32)
    expected = a.astype(np.float32).sum(axis=1, dtype=np.float32).astype(np.int32)  # 67108864, not 67108868
    assert np.array_equal(total(a)[:, 0], expected) and int(expected[0]) == 67108864


@pytest.mark.parametrize(("engine", "exact"), [("unknown", True), ("vector", False)])
def test_int32_tensor_tensor_is_exact_on_gpsimd_and_float32_on_vector(engine: str, exact: bool) -> None:
    """AWS tensor_tensor: all-int32 operands default to GpSimd's exact integer arithmetic; engine=vector computes
    in float32."""
    @nki.jit
    def add(a, b):  # type: ignore[no-untyped-def]
        out = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.shared_hbm)
        ta, tb = nl.load(a), nl.load(b)
        r = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=r, data1=ta, data2=tb, op=nl.add, engine=getattr(nisa.engine, engine))
        nisa.dma_copy(dst=out, src=r)
        return out

    a = np.full((P, 2), 16777217, dtype=np.int32)
    b = np.ones((P, 2), dtype=np.int32)
    expected = a + b if exact else (a.astype(np.float32) + b.astype(np.float32)).astype(np.int32)
    assert np.array_equal(add(a, b), expected)


# ------------------------------------------------------------------------------------ 6. trn3 wide moving


def test_trn3_moves_4096_float32_columns_into_eight_psum_banks() -> None:
    """AWS nc_matmul: from v4 the moving free size goes up to 4096 for a float32 dst (8 PSUM banks)."""
    rng = np.random.default_rng(2)
    s = rng.integers(-2, 3, (P, 16)).astype(np.float32)
    m = rng.integers(-2, 3, (P, 4096)).astype(np.float32)
    out = nki.jit(matmul_kernel, platform_target="trn3")(s, m)
    assert np.array_equal(out, s.T @ m)
    assert nki.last_report().psum_peak_banks == 8
    expect("err-psum-tile-exceeds-bank", nki.jit(matmul_kernel, platform_target="trn2"), s, m, operand="shape")


# ------------------------------------------------------------------------------------ 7. double_row


def double_row(stationary, moving, dtype):  # type: ignore[no-untyped-def]
    out = nl.ndarray((stationary.shape[2], moving.shape[2]), dtype=nl.float32, buffer=nl.shared_hbm)
    s = nl.ndarray(stationary.shape, dtype=dtype, buffer=nl.sbuf)
    m = nl.ndarray(moving.shape, dtype=dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=stationary)
    nisa.dma_copy(dst=m, src=moving)
    acc = nl.ndarray(out.shape, dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=s, moving=m, perf_mode=nisa.matmul_perf_mode.double_row)
    r = nl.ndarray(out.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=r, src=acc)
    nisa.dma_copy(dst=out, src=r)
    return out


def test_double_row_is_aws_documented_example_on_fp8() -> None:
    """AWS: [1, 256] @ [256, 3] = [1, 3] as stationary [128, 2, 1] and moving [128, 2, 3], fp8, v3 and v4."""
    rng = np.random.default_rng(3)
    s = rng.integers(-2, 3, (P, 2, 1)).astype(np.float32)
    m = rng.integers(-2, 3, (P, 2, 3)).astype(np.float32)
    expected = s.reshape(2 * P, 1).T @ m.reshape(2 * P, 3)
    for target in ("trn2", "trn3"):
        out = nki.jit(double_row, platform_target=target)(s, m, nl.float8_e4m3)
        assert out.shape == (1, 3) and np.array_equal(out, expected)
    err = expect("err-unsupported-dtype", nki.jit(double_row, platform_target="trn2"), s, m, nl.bfloat16)
    assert "float8" in str(err.limit)
    expect("err-unsupported-feature", nki.jit(double_row, platform_target="trn1"), s, m, nl.float8_e4m3,
           operand="perf_mode")


# ------------------------------------------------------------------------------------ 8. nl.matmul operands


def test_nl_matmul_reads_x_from_sbuf_and_transposes_on_chip() -> None:
    """AWS nl.matmul: x and y are SBUF tiles; transpose_x=False inserts a transpose."""
    def kernel(x, y, from_hbm):  # type: ignore[no-untyped-def]
        out = nl.ndarray((x.shape[0], y.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
        tx, ty = nl.load(x), nl.load(y)
        r = nl.ndarray(out.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=r, src=nl.matmul(x if from_hbm else tx, ty))
        nisa.dma_copy(dst=out, src=r)
        return out

    rng = np.random.default_rng(4)
    x = rng.standard_normal((64, P), dtype=np.float32)
    y = rng.standard_normal((P, 32), dtype=np.float32)
    np.testing.assert_allclose(nki.jit(kernel)(x, y, False), x @ y, rtol=1e-5, atol=1e-4)
    assert nki.last_report().instructions.get("nisa.nc_transpose") == 1
    expect("err-unsupported-memory", nki.jit(kernel), x, y, True, operand="x")


# ------------------------------------------------------------------------------------ rules


def strided_copy(a, step):  # type: ignore[no-untyped-def]
    t = nl.load(a)
    r = nl.ndarray((P // step, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=r, src=t[0:P:step])


def test_partition_striding_is_refused() -> None:
    a = np.zeros((P, 8), np.float32)
    err = expect("err-partition-stride", nki.jit(strided_copy), a, 2, operand="src")
    assert "P dimension striding" in str(err) and err.limit
    nki.jit(strided_copy)(a, 1)


def tiled_matmul(s, m, tile_position, tile_size):  # type: ignore[no-untyped-def]
    out = nl.ndarray((s.shape[1], m.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    ts, tm = nl.load(s), nl.load(m)
    acc = nl.ndarray(out.shape, dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=ts, moving=tm, tile_position=tile_position, tile_size=tile_size)
    r = nl.ndarray(out.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=r, src=acc)
    nisa.dma_copy(dst=out, src=r)
    return out


def test_matmul_tiling_rules_follow_the_generation() -> None:
    """AWS nc_matmul: row tiles of 2 x 64 on v2, 4 x 32 from v3; start_row a multiple of row_size."""
    rng = np.random.default_rng(5)
    s = rng.integers(-2, 3, (32, 32)).astype(np.float32)
    m = rng.integers(-2, 3, (32, 16)).astype(np.float32)
    err = expect("err-unsupported-feature", nki.jit(tiled_matmul, platform_target="trn1"), s, m, (0, 0), (32, 128),
                 operand="tile_size")
    assert "64" in str(err.limit)
    assert np.array_equal(nki.jit(tiled_matmul, platform_target="trn2")(s, m, (32, 0), (32, 128)), s.T @ m)
    expect("err-unsupported-feature", nki.jit(tiled_matmul, platform_target="trn2"), s, m, (32, 0), (64, 128),
           operand="tile_position")
    assert np.array_equal(nki.jit(tiled_matmul, platform_target="trn1")(s, m, (64, 0), (64, 128)), s.T @ m)


def predicated(a, pred_dtype, src_dtype):  # type: ignore[no-untyped-def]
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.load(a)
    pred = nl.ndarray(a.shape, dtype=pred_dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=pred, data=t, op0=nl.greater, operand0=0.0)
    src = nl.ndarray(a.shape, dtype=src_dtype, buffer=nl.sbuf)
    nisa.memset(dst=src, value=7.0)
    dst = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=dst, value=-1.0)
    nisa.tensor_copy_predicated(dst=dst, src=src, predicate=pred)
    nisa.dma_copy(dst=out, src=dst)
    return out


def test_tensor_copy_predicated_dtypes() -> None:
    """AWS: predicate is uint8/uint16/uint32; src and dst share a dtype."""
    a = np.random.default_rng(6).standard_normal((P, 16), dtype=np.float32)
    assert np.array_equal(nki.jit(predicated)(a, nl.uint8, nl.float32), np.where(a > 0, 7.0, -1.0))
    expect("err-unsupported-dtype", nki.jit(predicated), a, nl.float32, nl.float32, operand="predicate")
    expect("err-unsupported-dtype", nki.jit(predicated), a, nl.uint8, nl.bfloat16, operand="src")


def scalar_ops(a, op0, op1, engine):  # type: ignore[no-untyped-def]
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.load(a)
    r = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=r, data=t, op0=op0, operand0=3, op1=op1, operand1=None if op1 is None else 1,
                       engine=engine)
    nisa.dma_copy(dst=out, src=r)
    return out


def test_tensor_scalar_operator_rules() -> None:
    """AWS tensor_scalar: op0 and op1 both bitvec or both arithmetic; trn2's Scalar Engine runs only
    multiply+add, multiply, add."""
    ints = np.arange(P * 4, dtype=np.int32).reshape(P, 4)
    err = expect("err-unsupported-operator", nki.jit(scalar_ops), ints, nl.bitwise_and, nl.add, nisa.engine.vector,
                 operand="op1")
    assert "both bitvec or both arithmetic" in str(err)
    assert np.array_equal(nki.jit(scalar_ops)(ints, nl.bitwise_and, nl.bitwise_or, nisa.engine.vector), (ints & 3) | 1)
    floats = np.random.default_rng(7).standard_normal((P, 4), dtype=np.float32)
    scalar = nisa.engine.scalar
    expect("err-unsupported-operator", nki.jit(scalar_ops, platform_target="trn2"), floats, nl.subtract, None,
           scalar, operand="op0")
    out = nki.jit(scalar_ops, platform_target="trn2")(floats, nl.multiply, nl.add, scalar)
    np.testing.assert_allclose(out, floats * 3 + 1, rtol=1e-6)
    np.testing.assert_allclose(nki.jit(scalar_ops, platform_target="trn3")(floats, nl.subtract, None, scalar),
                               floats - 3, rtol=1e-6)


def hwdge_transpose(a, dtype):  # type: ignore[no-untyped-def]
    t = nl.ndarray(a.shape, dtype=dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    r = nl.ndarray((a.shape[1], a.shape[0]), dtype=dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=r, src=t, dge_mode=nisa.dge_mode.hwdge)


def test_hardware_dge_transpose_takes_2_byte_dtypes() -> None:
    a = np.zeros((16, 64), np.float32)
    err = expect("err-unsupported-dtype", nki.jit(hwdge_transpose, platform_target="trn2"), a, nl.float32,
                 operand="src")
    assert "2-byte" in str(err.limit)
    nki.jit(hwdge_transpose, platform_target="trn2")(a, nl.bfloat16)


# ------------------------------------------------------------------------------------ messages


def test_indirect_and_vector_select_say_they_are_not_emulated() -> None:
    @nki.jit
    def kernel(a):  # type: ignore[no-untyped-def]
        t = nl.load(a)
        idx = nl.ndarray((P, 1), dtype=nl.uint32, buffer=nl.sbuf)
        t.indirect(idx)

    err = expect("err-unsupported-feature", kernel, np.zeros((P, 4), np.float32))
    assert ".indirect()" in str(err)


def test_an_older_dialect_call_without_dst_names_the_rule() -> None:
    @nki.jit
    def old_copy(a):  # type: ignore[no-untyped-def]
        t = nl.load(a)
        return nisa.tensor_copy(src=t)

    @nki.jit
    def old_matmul(a):  # type: ignore[no-untyped-def]
        t = nl.load(a)
        return nisa.nc_matmul(t, t)

    for kernel in (old_copy, old_matmul):
        err = expect("err-missing-dst", kernel, np.zeros((P, 4), np.float32), operand="dst")
        assert "dst=" in str(err)

    @nki.jit
    def misspelt(a):  # type: ignore[no-untyped-def]
        t = nl.load(a)
        nisa.tensor_copy(dst=t, source=t)

    with pytest.raises(TypeError, match="source"):  # a wrong keyword stays Python's own error
        misspelt(np.zeros((P, 4), np.float32))


def test_older_dialect_names_and_par_dim() -> None:
    with pytest.raises(AttributeError, match="older neuronxcc.nki dialect"):
        nl.arange(128)  # noqa: B018

    @nki.jit
    def blocks(a):  # type: ignore[no-untyped-def]
        nl.ndarray((2, nl.par_dim(P), 512), dtype=nl.float32, buffer=nl.sbuf)

    err = expect("err-unsupported-feature", blocks, np.zeros((1, 1), np.float32), operand="shape")
    assert "par_dim" in str(err)

    @nki.jit
    def first(a):  # type: ignore[no-untyped-def]
        t = nl.ndarray((nl.par_dim(P), 512), dtype=nl.float32, buffer=nl.sbuf)
        assert t.shape == (P, 512)

    first(np.zeros((1, 1), np.float32))


# ------------------------------------------------------------------------------------ structure


def test_the_tensor_and_memory_model_sits_below_the_instructions() -> None:
    """_tensor.py (and the modules under it) import neither isa.py nor language.py, not even lazily."""
    import ast
    import pathlib

    package = pathlib.Path(nki.__file__).parent
    upper = {"isa", "language", "_launch"}
    for module in ("_tensor", "_dtypes", "_ops", "_target", "_errors", "_host"):
        tree = ast.parse((package / f"{module}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "torch_neuronx.nki":
                imported = {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch_neuronx.nki."):
                imported = {node.module.rsplit(".", 1)[1]}  # type: ignore[union-attr]
            elif isinstance(node, ast.Import):
                imported = {a.name.rsplit(".", 1)[-1] for a in node.names if a.name.startswith("torch_neuronx.nki")}
            else:
                continue
            assert not imported & upper, (module, imported)


# ------------------------------------------------------------------------------------ coverage


def test_scalar_tensor_tensor_is_two_operations_in_float32() -> None:
    """AWS: (data op0 operand0) op1 operand1, operand0 a scalar or (P, 1) vector, reverse flags swap the sides."""
    @nki.jit
    def kernel(a, b, v):  # type: ignore[no-untyped-def]
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        ta, tb, tv = nl.load(a), nl.load(b), nl.load(v)
        r = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=r, data=ta, op0=nl.subtract, operand0=tv, op1=nl.multiply, operand1=tb,
                                  reverse0=True)
        nisa.dma_copy(dst=out, src=r)
        return out

    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((P, 32), dtype=np.float32), rng.standard_normal((P, 32), dtype=np.float32)
    v = rng.standard_normal((P, 1), dtype=np.float32)
    np.testing.assert_allclose(kernel(a, b, v), (v - a) * b, rtol=1e-6)


def test_tensor_scalar_reduce_accumulates_across_calls() -> None:
    """AWS: reset_reduce starts from the identity, reduce continues, reduce_res_negate negates only the output."""
    @nki.jit
    def kernel(a, b):  # type: ignore[no-untyped-def]
        out = nl.ndarray((a.shape[0], 2), dtype=nl.float32, buffer=nl.shared_hbm)
        ta, tb = nl.load(a), nl.load(b)
        r = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        res = nl.ndarray((a.shape[0], 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(dst=r, data=ta, op0=nl.multiply, operand0=2.0, reduce_op=nl.max,
                                  reduce_res=res[:, 0:1])
        nisa.tensor_scalar_reduce(dst=r, data=tb, op0=nl.add, operand0=1.0, reduce_op=nl.max,
                                  reduce_res=res[:, 1:2], reduce_cmd=nisa.reduce_cmd.reduce, reduce_res_negate=True)
        nisa.dma_copy(dst=out, src=res)
        return out

    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((P, 16), dtype=np.float32), rng.standard_normal((P, 16), dtype=np.float32)
    out = kernel(a, b)
    first = (a * 2).max(axis=1)
    assert np.array_equal(out[:, 0], first)
    assert np.array_equal(out[:, 1], -np.maximum(first, (b + 1).max(axis=1)))


def test_asserting_a_comparison_tile_checks_every_element() -> None:
    """The reference's examples end in ``assert nl.equal(result, expected)``: that must be able to fail."""
    @nki.jit
    def kernel(a):  # type: ignore[no-untyped-def]
        x = nl.full((P, 8), 2.0, dtype=nl.float32, buffer=nl.sbuf)
        y = nl.full((P, 8), a, dtype=nl.float32, buffer=nl.sbuf)
        assert nl.equal(x, y), "tiles differ"

    kernel(2.0)
    with pytest.raises(AssertionError, match="tiles differ"):
        kernel(3.0)


# ------------------------------------------------------------------------------------ more documented facts


def test_moves_between_tiles_of_one_integer_dtype_are_bit_exact() -> None:
    """AWS: tensor_copy_predicated copies src (same dtype as dst); affine_select casts on_true_tile through float32
    only when its dtype differs from dst's. int32 values past 2^24 must survive both."""
    @nki.jit
    def kernel(a, flags):  # type: ignore[no-untyped-def]
        out = nl.ndarray((a.shape[0], 2 * a.shape[1]), dtype=nl.int32, buffer=nl.shared_hbm)
        t = nl.load(a)
        pred = nl.ndarray(flags.shape, dtype=nl.uint8, buffer=nl.sbuf)
        nisa.dma_copy(dst=pred, src=flags)
        both = nl.ndarray((a.shape[0], 2 * a.shape[1]), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=both, value=-7)
        nisa.tensor_copy_predicated(dst=both[:, 0:a.shape[1]], src=t, predicate=pred)
        nisa.affine_select(dst=both[:, a.shape[1]:], pattern=[[-1, a.shape[1]]], channel_multiplier=1,
                           on_true_tile=t, on_false_value=0.0, cmp_op=nl.greater_equal)
        nisa.dma_copy(dst=out, src=both)
        return out

    a = (np.arange(P * 8, dtype=np.int64).reshape(P, 8) + 16777217).astype(np.int32)
    flags = (np.arange(P * 8).reshape(P, 8) % 3 == 0).astype(np.uint8)
    out = kernel(a, flags)
    assert np.array_equal(out[:, :8], np.where(flags != 0, a, -7))
    p, i = np.arange(P)[:, None], np.arange(8)[None, :]
    assert np.array_equal(out[:, 8:], np.where(p - i >= 0, a, 0))


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_tensor_engine_transpose_of_nan_is_bit_accurate_only_from_v3(target: str) -> None:
    """AWS nc_transpose: on NeuronCore-v2 the Tensor Engine transpose (a matmul with the identity) is not
    bit-accurate with NaN/Inf; from v3 it is."""
    @nki.jit(platform_target=target)
    def kernel(a):  # type: ignore[no-untyped-def]
        out = nl.ndarray((a.shape[1], a.shape[0]), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        ps = nl.ndarray((a.shape[1], a.shape[0]), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=ps, data=t, engine=nisa.engine.tensor)
        r = nl.ndarray(ps.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=r, src=ps)
        nisa.dma_copy(dst=out, src=r)
        return out

    a = np.random.default_rng(10).standard_normal((64, 32), dtype=np.float32)
    a[5, 3] = np.nan
    out = kernel(a)
    if target == "trn2":
        assert np.array_equal(out, a.T, equal_nan=True)
    else:
        expected = a.T @ np.eye(64, dtype=np.float32)  # NaN x 0 spreads along output row 3
        assert np.array_equal(out, expected, equal_nan=True) and np.isnan(out[3]).all()


def partition_reduce(a, op):  # type: ignore[no-untyped-def]
    out = nl.ndarray((1, a.shape[1]), dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.load(a)
    r = nl.ndarray((1, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_partition_reduce(dst=r, op=op, data=t)
    nisa.dma_copy(dst=out, src=r)
    return out


def test_tensor_partition_reduce_takes_the_documented_operators() -> None:
    """AWS: add, average, max, bitwise_or, bitwise_and across partitions (GpSimd); bitvec on integer bit patterns."""
    a = np.random.default_rng(11).integers(-4, 5, (P, 6)).astype(np.float32)
    assert np.array_equal(nki.jit(partition_reduce)(a, nl.add), a.sum(axis=0, keepdims=True))
    assert np.array_equal(nki.jit(partition_reduce)(a, nl.max), a.max(axis=0, keepdims=True))
    bits = np.random.default_rng(12).integers(0, 2**31 - 1, (P, 6)).astype(np.int32)
    assert np.array_equal(nki.jit(partition_reduce)(bits, nl.bitwise_or),
                          np.bitwise_or.reduce(bits, axis=0, keepdims=True))
    expect("err-unsupported-operator", nki.jit(partition_reduce), a, nl.multiply, operand="op")


def test_nonzero_with_count_is_aws_documented_example() -> None:
    """AWS: [0, 1, 1, 0, 0, 1, 0, 0] with index_offset 16, padding -1 gives [17, 18, 21, -1, -1, -1, -1, -1, 3],
    on partitions 0, 16, ..., 112 only (the others keep their contents); NeuronCore-v3 and newer."""
    def kernel(a):  # type: ignore[no-untyped-def]
        out = nl.ndarray((a.shape[0], a.shape[1] + 1), dtype=nl.int32, buffer=nl.shared_hbm)
        t = nl.load(a)
        r = nl.ndarray((a.shape[0], a.shape[1] + 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=r, value=7)
        nisa.nonzero_with_count(dst=r, src=t, index_offset=16, padding_val=-1)
        nisa.dma_copy(dst=out, src=r)
        return out

    a = np.zeros((P, 8), np.float32)
    a[:] = [0, 1, 1, 0, 0, 1, 0, 0]
    out = nki.jit(kernel, platform_target="trn2")(a)
    assert np.array_equal(out[0::16], np.tile([17, 18, 21, -1, -1, -1, -1, -1, 3], (8, 1)))
    assert (np.delete(out, np.arange(0, P, 16), axis=0) == 7).all()
    expect("err-unsupported-feature", nki.jit(kernel, platform_target="trn1"), a)


def test_tensor_copy_takes_dtype_only_as_dst_s_own() -> None:
    """AWS's reference signature is tensor_copy(dst, src, engine, name); AWS's NKI 0.6 matmul tutorial
    (aws-neuron/nki-samples) passes dtype= equal to dst's dtype, accepted as the no-op it is. A differing dtype has
    no documented meaning: refused with the reason. An older-dialect call without dst names err-missing-dst."""
    def kernel(a, dtype):  # type: ignore[no-untyped-def]
        out = nl.ndarray(a.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.load(a)
        r = nl.ndarray(a.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_copy(dst=r, src=t, dtype=dtype)
        nisa.dma_copy(dst=out, src=r)
        return out

    a = np.linspace(-3, 3, P * 4, dtype=np.float32).reshape(P, 4)
    out = nki.simulate(nki.jit(kernel))(torch.from_numpy(a), nl.bfloat16)
    assert torch.equal(out, torch.from_numpy(a).to(torch.bfloat16))
    err = expect("err-unsupported-feature", nki.jit(kernel), a, nl.float32, operand="dtype")
    assert "dtype of dst" in str(err)

    @nki.jit
    def older(a):  # type: ignore[no-untyped-def]
        nisa.tensor_copy(nl.load(a), dtype=nl.bfloat16)

    expect("err-missing-dst", older, a, operand="dst")


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_activation_takes_a_scalar_bias_from_v3(target: str) -> None:
    """AWS activation: out = op(data * scale + bias); on NeuronCore-v2 bias is an [N, 1] vector, from v3 also a
    scalar."""
    @nki.jit(platform_target=target)
    def kernel(a):  # type: ignore[no-untyped-def]
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        r = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=r, op=nl.relu, data=t, scale=2.0, bias=-1.0)
        nisa.dma_copy(dst=out, src=r)
        return out

    a = np.random.default_rng(13).standard_normal((P, 16), dtype=np.float32)
    if target == "trn1":
        expect("err-activation-bias-invalid-type", kernel, a, operand="bias")
    else:
        assert np.array_equal(kernel(a), np.maximum(a * np.float32(2) - np.float32(1), 0))


def test_iota_follows_the_documented_pseudo_code() -> None:
    """AWS iota: value = offset + channel_id * channel_multiplier + sum(step_k * i_k), 32-bit integers."""
    @nki.jit
    def kernel(a):  # type: ignore[no-untyped-def]
        out = nl.ndarray((P, 12), dtype=nl.int32, buffer=nl.shared_hbm)
        r = nl.ndarray((P, 12), dtype=nl.int32, buffer=nl.sbuf)
        nisa.iota(dst=r, pattern=[[100, 3], [-2, 4]], offset=5, channel_multiplier=1000)
        nisa.dma_copy(dst=out, src=r)
        return out

    w, x = np.meshgrid(np.arange(3), np.arange(4), indexing="ij")
    expected = 5 + np.arange(P)[:, None] * 1000 + (w * 100 - 2 * x).reshape(1, 12)
    assert np.array_equal(kernel(np.zeros((1, 1), np.float32)), expected)



def iota_into(a, dtype, offset):  # type: ignore[no-untyped-def]
    out = nl.ndarray((2, 4), dtype=dtype, buffer=nl.shared_hbm)
    r = nl.ndarray((2, 4), dtype=dtype, buffer=nl.sbuf)
    nisa.iota(dst=r, pattern=[[1, 4]], offset=offset, channel_multiplier=10)
    nisa.dma_copy(dst=out, src=r)
    return out


def test_iota_wraps_around_as_32_bit_integers_before_the_cast() -> None:
    """AWS iota: "computed in 32-bit integer arithmetic", then cast to dst's dtype; offset is an int32. Past
    2^31 - 1 the value wraps to negative numbers, also in a float32 dst (not a large positive float)."""
    z = np.zeros((1, 1), np.float32)
    exact = 2**31 - 2 + np.arange(4)[None, :] + 10 * np.arange(2)[:, None]
    wrapped = ((exact + 2**31) % 2**32 - 2**31).astype(np.int64)
    assert np.array_equal(nki.jit(iota_into)(z, nl.int32, 2**31 - 2), wrapped)
    assert np.array_equal(nki.jit(iota_into)(z, nl.float32, 2**31 - 2), wrapped.astype(np.float32))
    assert wrapped.min() < 0
    err = expect("err-invalid-operand", nki.jit(iota_into), z, nl.int32, 2**31, operand="offset")
    assert "int32" in str(err)
    assert np.array_equal(nki.jit(iota_into)(z, nl.int32, 2**31 - 20), exact - 18)  # the largest: 2^31 - 7

def test_tensor_reduce_negate_and_tensor_scalar_reverse() -> None:
    """AWS tensor_reduce negate multiplies the result by -1; tensor_scalar reverse0 makes operand0 the lhs."""
    @nki.jit
    def kernel(a):  # type: ignore[no-untyped-def]
        out = nl.ndarray((a.shape[0], a.shape[1] + 1), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        r = nl.ndarray((a.shape[0], a.shape[1] + 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=r[:, 0:1], op=nl.max, data=t, axis=1, negate=True)
        nisa.tensor_scalar(dst=r[:, 1:], data=t, op0=nl.subtract, operand0=10.0, reverse0=True, op1=nl.divide,
                           operand1=4.0, reverse1=False)
        nisa.dma_copy(dst=out, src=r)
        return out

    a = np.random.default_rng(14).standard_normal((P, 8), dtype=np.float32)
    out = kernel(a)
    assert np.array_equal(out[:, 0], -a.max(axis=1))
    np.testing.assert_allclose(out[:, 1:], (10 - a) / 4, rtol=1e-6)


def test_nc_stream_shuffle_moves_partitions_within_each_quadrant() -> None:
    """AWS: output partition i of each 32-partition quadrant copies input partition shuffle_mask[i]; 255 leaves it
    unmodified; the same mask for every quadrant."""
    @nki.jit
    def kernel(a, mask):  # type: ignore[no-untyped-def]
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        r = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.memset(dst=r, value=-1.0)
        nisa.nc_stream_shuffle(dst=r, src=t, shuffle_mask=mask)
        nisa.dma_copy(dst=out, src=r)
        return out

    a = np.arange(P * 4, dtype=np.float32).reshape(P, 4)
    mask = [(i + 1) % 32 for i in range(31)] + [255]
    out = kernel(a, mask)
    expected = np.full_like(a, -1.0)
    for p in range(P):
        q, lane = divmod(p, 32)
        if mask[lane] != 255:
            expected[p] = a[q * 32 + mask[lane]]
    assert np.array_equal(out, expected)
    with pytest.raises(NkiValidationError, match="shuffle_mask"):
        kernel(a, [40] * 32)


def test_activate2_pipeline_and_its_accumulators_on_trn3() -> None:
    """AWS activate2 (NeuronCore-v4): op((data op0 imm0) op1 imm1), reduce_cmd reset_reduce then reduce continue
    the Scalar Engine's accumulators; abs_max keeps the signed value."""
    def kernel(a, b):  # type: ignore[no-untyped-def]
        out = nl.ndarray((a.shape[0], a.shape[1] + 1), dtype=nl.float32, buffer=nl.shared_hbm)
        ta, tb = nl.load(a), nl.load(b)
        r = nl.ndarray((a.shape[0], a.shape[1] + 1), dtype=nl.float32, buffer=nl.sbuf)
        scratch = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.activate2(dst=r[:, 0:a.shape[1]], op=nl.gelu, data=ta, imm0=2.0, imm1=0.5, op0=nl.multiply, op1=nl.add,
                       reduce_op=nl.abs_max, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.activate2(dst=scratch, op=nl.copy, data=tb, imm0=0.0, imm1=0.0, op0=nl.bypass, op1=nl.bypass,
                       reduce_op=nl.abs_max, reduce_cmd=nisa.reduce_cmd.reduce, reduce_res=r[:, a.shape[1]:])
        nisa.dma_copy(dst=out, src=r)
        return out

    rng = np.random.default_rng(15)
    a, b = rng.standard_normal((P, 16), dtype=np.float32), 3 * rng.standard_normal((P, 16), dtype=np.float32)
    out = nki.jit(kernel, platform_target="trn3")(a, b)
    g = torch.nn.functional.gelu(torch.from_numpy(a) * 2 + 0.5).numpy()
    np.testing.assert_allclose(out[:, :16], g, rtol=1e-6, atol=1e-7)
    both = np.concatenate([g, b], axis=1)
    expected = both[np.arange(P), np.abs(both).argmax(axis=1)]
    assert np.array_equal(out[:, 16], expected)
    expect("err-unsupported-feature", nki.jit(kernel, platform_target="trn2"), a, b)


def test_dma_compute_sums_and_scatter_adds() -> None:
    """AWS dma_compute: dst = srcs[0] + srcs[1] in float32 (scales 1.0); with vector_offset on dst and a matching
    source, a scatter read-modify-write dst[indices] += src."""
    @nki.jit
    def kernel(a, b, idx, table):  # type: ignore[no-untyped-def]
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        ta, tb = nl.load(a), nl.load(b)
        r = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_compute(dst=r, srcs=[ta, tb], reduce_op=nl.add)
        nisa.dma_copy(dst=out, src=r)
        ti = nl.ndarray(idx.shape, dtype=nl.uint32, buffer=nl.sbuf)
        nisa.dma_copy(dst=ti, src=idx)
        rows = table.ap(pattern=[[a.shape[1], a.shape[0]], [1, a.shape[1]]], vector_offset=ti, indirect_dim=0)
        nisa.dma_compute(dst=rows, srcs=[rows, ta], reduce_op=nl.add)
        return out

    rng = np.random.default_rng(16)
    a, b = rng.standard_normal((P, 8), dtype=np.float32), rng.standard_normal((P, 8), dtype=np.float32)
    idx = rng.permutation(2 * P)[:P].astype(np.int32).reshape(P, 1)
    table = rng.standard_normal((2 * P, 8), dtype=np.float32)
    expected_table = table.copy()
    expected_table[idx[:, 0]] += a
    assert np.array_equal(kernel(a, b, idx, table), a + b)
    assert np.array_equal(table, expected_table)


def test_scalar_operand_dtypes_and_the_gpsimd_tensor_scalar() -> None:
    """AWS: tensor_scalar's arithmetic operands are float32 and GpSimd runs only rsqrt; activation's scale tile is
    float32 and its bias any dtype but tfloat32."""
    def ts(a, vec_dtype, engine, op):  # type: ignore[no-untyped-def]
        t = nl.load(a)
        v = nl.ndarray((a.shape[0], 1), dtype=vec_dtype, buffer=nl.sbuf)
        nisa.memset(dst=v, value=2.0)
        r = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=r, data=t, op0=op, operand0=v if op is nl.multiply else None, engine=engine)

    a = np.ones((P, 4), np.float32)
    nki.jit(ts)(a, nl.float32, nisa.engine.vector, nl.multiply)
    expect("err-unsupported-dtype", nki.jit(ts), a, nl.bfloat16, nisa.engine.vector, nl.multiply, operand="operand0")
    expect("err-unsupported-engine", nki.jit(ts), a, nl.float32, nisa.engine.gpsimd, nl.multiply, operand="engine")
    nki.jit(ts)(a, nl.float32, nisa.engine.gpsimd, nl.rsqrt)

    def act(a, scale_dtype):  # type: ignore[no-untyped-def]
        t = nl.load(a)
        sc = nl.ndarray((a.shape[0], 1), dtype=scale_dtype, buffer=nl.sbuf)
        nisa.memset(dst=sc, value=2.0)
        r = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=r, op=nl.copy, data=t, scale=sc)

    nki.jit(act)(a, nl.float32)
    expect("err-unsupported-dtype", nki.jit(act), a, nl.bfloat16, operand="scale")
