"""One test per Trainium rule the interpreter enforces, each showing the error (code, instruction, operand, limit
and the kernel line), plus adversarial input: zero sizes, float64, bad grids, hostile environment variables."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

import torch_neuronx.nki as nki
from torch_neuronx.nki import NkiValidationError

nl = nki.language
nisa = nki.isa


def run_expecting(code: str, kernel: nki.Kernel, *args: object, needle: str) -> NkiValidationError:
    """Launch `kernel`, expect rule `code`, and check the error points at the line containing `needle`."""
    with pytest.raises(NkiValidationError) as info:
        kernel(*args)
    err = info.value
    assert err.code == code, str(err)
    assert err.kernel == kernel.name
    assert err.filename == __file__
    source = inspect.getsource(kernel.fn).splitlines()
    start = kernel.fn.__code__.co_firstlineno
    assert needle in source[err.lineno - start], (err.lineno, str(err))
    assert f"{__file__}:{err.lineno}" in str(err) and err.instruction in str(err)
    return err


X = np.zeros((128, 512), dtype=np.float32)


def test_partition_dimension_is_shape0_and_at_most_128() -> None:
    @nki.jit
    def too_tall(a):  # type: ignore[no-untyped-def]
        t = nl.ndarray((256, 64), dtype=nl.float32, buffer=nl.sbuf)
        return t

    err = run_expecting("err-size-of-dimension-exceed-arch-limit", too_tall, X, needle="(256, 64)")
    assert err.operand == "shape[0]" and err.value == 256 and "128" in str(err.limit)

    @nki.jit
    def tall_view(a):  # type: ignore[no-untyped-def]
        t = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=0.0)
        out = nl.ndarray((64, 1024), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=out, src=t.ap([[512, 64], [1, 1024]]))  # a pattern reading 1024 per partition

    with pytest.raises(NkiValidationError, match="err-tensor-access-out-of-bound"):
        tall_view(X)


def test_psum_tile_holds_at_most_2kib_per_partition() -> None:
    @nki.jit
    def wide_psum(a):  # type: ignore[no-untyped-def]
        acc = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.psum)
        return acc

    err = run_expecting("err-psum-tile-exceeds-bank", wide_psum, X, needle="nl.psum")
    assert err.value == 4096 and "2048 bytes" in err.limit


def _matmul(stationary_shape, moving_shape, dst_shape, *, s_buf=None, m_buf=None, d_buf=None,  # type: ignore[no-untyped-def]
            dst_dtype="float32", s_dtype="bfloat16", **target):
    @nki.jit(**target)
    def mm(a):  # type: ignore[no-untyped-def]
        s = nl.ndarray(stationary_shape, dtype=s_dtype, buffer=s_buf or nl.sbuf)
        m = nl.ndarray(moving_shape, dtype=nl.bfloat16, buffer=m_buf or nl.sbuf)
        d = nl.ndarray(dst_shape, dtype=dst_dtype, buffer=d_buf or nl.psum)
        nisa.nc_matmul(dst=d, stationary=s, moving=m)

    return mm


def test_matmul_stationary_free_size_at_most_128() -> None:
    err = run_expecting("err-matmul-stationary-fmax", _matmul((128, 256), (128, 256), (128, 256)), X,
                        needle="nc_matmul")
    assert err.operand == "stationary" and err.value == 256


def test_matmul_moving_free_size_at_most_512() -> None:
    mm = _matmul((128, 128), (128, 3, 256), (128, 768), d_buf=nl.psum, dst_dtype="bfloat16", platform_target="trn3")
    assert mm(X) is None  # NeuronCore-v4 streams a moving tile wider than one bank (up to 8192 into bf16)
    err = run_expecting("err-matmul-moving-fmax", _matmul((128, 128), (128, 2, 512), (128, 2, 256)), X,
                        needle="nc_matmul")
    assert err.operand == "moving" and err.value == 1024 and "512" in err.limit


def test_matmul_reads_sbuf_and_writes_psum() -> None:
    err = run_expecting("err-unsupported-memory", _matmul((128, 128), (128, 512), (128, 512), s_buf=nl.psum), X,
                        needle="nc_matmul")
    assert err.operand == "stationary"
    err = run_expecting("err-unsupported-memory", _matmul((128, 128), (128, 512), (128, 512), d_buf=nl.sbuf), X,
                        needle="nc_matmul")
    assert err.operand == "dst" and err.limit == "psum"
    err = run_expecting("err-unsupported-memory", _matmul((128, 128), (128, 512), (128, 512),
                                                          m_buf=nl.shared_hbm), X, needle="nc_matmul")
    assert err.operand == "moving"


def test_matmul_dst_is_fp32_on_trn1_and_trn2_bf16_allowed_on_trn3() -> None:
    for target in ("trn1", "trn2"):
        err = run_expecting("err-matmul-dst-dtype", _matmul((128, 128), (128, 512), (128, 512),
                                                            dst_dtype="bfloat16", platform_target=target), X,
                            needle="nc_matmul")
        assert err.value == "bfloat16" and err.limit == "float32"
    assert _matmul((128, 128), (128, 512), (128, 512), dst_dtype="bfloat16", platform_target="trn3")(X) is None


def test_matmul_operands_share_the_partition_size_and_dtype_family() -> None:
    err = run_expecting("err-matmul-partition-mismatch", _matmul((128, 128), (64, 512), (128, 512)), X,
                        needle="nc_matmul")
    assert err.value == 64 and err.limit == 128
    err = run_expecting("err-unsupported-dtype", _matmul((128, 128), (128, 512), (128, 512), s_dtype="float32"), X,
                        needle="nc_matmul")
    assert "float32" in str(err)
    err = run_expecting("err-unsupported-dtype", _matmul((128, 128), (128, 512), (128, 512), s_dtype="int8"), X,
                        needle="nc_matmul")


def test_transpose_limits_per_engine() -> None:
    @nki.jit
    def wide(a):  # type: ignore[no-untyped-def]
        t = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.sbuf)
        d = nl.ndarray((256, 128), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=d, data=t)

    with pytest.raises(NkiValidationError, match="err-size-of-dimension-exceed-arch-limit"):
        wide(X)  # the (256, 128) PSUM tile is already over the partition limit

    @nki.jit
    def wide_free(a):  # type: ignore[no-untyped-def]
        t = nl.ndarray((64, 256), dtype=nl.float32, buffer=nl.sbuf)
        d = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=d, data=t)

    err = run_expecting("err-transpose-size", wide_free, X, needle="nc_transpose")
    assert err.value == (64, 256) and "128 x 128" in err.limit

    @nki.jit
    def vector_too_big(a):  # type: ignore[no-untyped-def]
        t = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.sbuf)
        d = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.nc_transpose(dst=d, data=t, engine=nisa.engine.vector)

    err = run_expecting("err-transpose-size", vector_too_big, X, needle="engine.vector")
    assert "32 x 32" in err.limit

    @nki.jit
    def wrong_dtype(a):  # type: ignore[no-untyped-def]
        t = nl.ndarray((32, 32), dtype=nl.bfloat16, buffer=nl.sbuf)
        d = nl.ndarray((32, 32), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=d, data=t)

    run_expecting("err-unsupported-dtype", wrong_dtype, X, needle="nc_transpose")


def test_kernel_outputs_live_in_shared_hbm() -> None:
    @nki.jit
    def returns_sbuf(a):  # type: ignore[no-untyped-def]
        return nl.load(a)

    with pytest.raises(NkiValidationError, match="err-output-not-in-shared-hbm") as info:
        returns_sbuf(X)
    assert info.value.value == "sbuf" and info.value.limit == "shared_hbm"

    @nki.jit
    def returns_private(a):  # type: ignore[no-untyped-def]
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.hbm)
        nl.store(out, nl.load(a))
        return out

    with pytest.raises(NkiValidationError, match="private_hbm"):
        returns_private(X)


def test_no_dma_from_or_to_psum() -> None:
    @nki.jit
    def dma_psum(a):  # type: ignore[no-untyped-def]
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum)
        nisa.dma_copy(dst=out, src=acc)
        return out

    err = run_expecting("err-dma-psum", dma_psum, X, needle="dma_copy")
    assert err.operand == "src" and "tensor_copy" in err.hint


def test_no_compute_on_hbm_operands() -> None:
    @nki.jit
    def add_in_hbm(a, b):  # type: ignore[no-untyped-def]
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.tensor_tensor(dst=out, data1=a, data2=b, op=nl.add)
        return out

    err = run_expecting("err-unsupported-memory", add_in_hbm, X, X, needle="tensor_tensor")
    assert err.operand == "data1" and "shared_hbm" in str(err)

    @nki.jit
    def nl_add_in_hbm(a):  # type: ignore[no-untyped-def]
        return nl.add(a, 1.0)

    run_expecting("err-unsupported-memory", nl_add_in_hbm, X, needle="nl.add")


def test_out_of_bounds_accesses_are_errors() -> None:
    @nki.jit
    def slice_past_end(a):  # type: ignore[no-untyped-def]
        t = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[0:128, 256:768])

    err = run_expecting("err-tensor-access-out-of-bound", slice_past_end, X, needle="256:768")
    assert "256:768" in str(err)

    @nki.jit
    def index_past_end(a):  # type: ignore[no-untyped-def]
        return a[128, 0]

    run_expecting("err-tensor-access-out-of-bound", index_past_end, X, needle="a[128, 0]")

    @nki.jit
    def pattern_past_end(a):  # type: ignore[no-untyped-def]
        t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        v = t.ap([[64, 128], [2, 64]])  # stride 2 walks past the 64 elements of a partition
        return v

    err = run_expecting("err-tensor-access-out-of-bound", pattern_past_end, X, needle=".ap(")
    assert "free offsets 0..126" in str(err)

    @nki.jit
    def pattern_wrong_partition(a):  # type: ignore[no-untyped-def]
        t = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.sbuf)
        return t.ap([[64, 128], [1, 64]])

    run_expecting("err-tensor-access-out-of-bound", pattern_wrong_partition, X, needle=".ap(")


def test_memset_values_match_the_destination_dtype() -> None:
    def memset_kernel(dtype, value):  # type: ignore[no-untyped-def]
        @nki.jit
        def fill(a):  # type: ignore[no-untyped-def]
            t = nl.ndarray((128, 8), dtype=dtype, buffer=nl.sbuf)
            nisa.memset(dst=t, value=value)

        return fill

    for dtype, value in (("int32", 0.5), ("uint8", -1), ("int8", 300), ("float16", 1e6), ("float8_e4m3", 500.0),
                         ("float8_e4m3fn", float("inf")), ("int32", float("nan")), ("bool", 2), ("float32", "1")):
        err = run_expecting("err-memset-value", memset_kernel(dtype, value), X, needle="memset")
        assert err.operand == "value"
    for dtype, value in (("int32", 7), ("float32", float("-inf")), ("bfloat16", -3.0e38), ("float8_e4m3", 240.0)):
        memset_kernel(dtype, value)(X)


def test_error_message_reads_like_the_compiler() -> None:
    with pytest.raises(NkiValidationError) as info:
        _matmul((128, 128), (128, 1024), (128, 1024))(X)
    text = str(info.value)
    assert text.startswith("[err-psum-tile-exceeds-bank] nl.ndarray: operand 'shape'")
    assert "in kernel mm" in text and "fix:" in text


# ---- adversarial input


def test_zero_size_and_negative_shapes_are_refused() -> None:
    @nki.jit
    def empty_tile(a):  # type: ignore[no-untyped-def]
        return nl.ndarray((0, 4), dtype=nl.float32, buffer=nl.shared_hbm)

    with pytest.raises(NkiValidationError, match="err-invalid-shape.*positive"):
        empty_tile(X)

    @nki.jit
    def copy_all(a):  # type: ignore[no-untyped-def]
        out = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a)
        return out

    with pytest.raises(NkiValidationError, match="err-shape-mismatch|out-of-bound"):
        copy_all(np.zeros((0, 4), dtype=np.float32))


def test_float64_and_int64_arguments_name_the_fix() -> None:
    @nki.jit
    def ident(a):  # type: ignore[no-untyped-def]
        return a

    with pytest.raises(NkiValidationError, match=r"(?s)argument 'a' is torch.float64.*\.float\(\)"):
        ident(torch.zeros(4, 4, dtype=torch.float64))
    with pytest.raises(NkiValidationError, match="int64"):
        ident(np.zeros((4, 4), dtype=np.int64))


def test_bad_grids_and_arguments() -> None:
    @nki.jit
    def ident(a):  # type: ignore[no-untyped-def]
        return a

    for grid in ((0,), (2, -1), ("a",), (True,)):
        with pytest.raises(ValueError, match="positive ints"):
            ident[grid]
    with pytest.raises(TypeError, match="ident"):
        ident(X, X)
    with pytest.raises(ValueError, match="different devices"):
        nki.jit(lambda a, b: a)(torch.zeros(2, 2), torch.zeros(2, 2, device="neuron"))
    with pytest.raises(RuntimeError, match="inside a kernel launch"):
        nl.ndarray((2, 2), dtype=nl.float32)


def test_hostile_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    @nki.jit
    def ident(a):  # type: ignore[no-untyped-def]
        return a

    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn9; rm -rf /")
    with pytest.raises(ValueError, match="unknown NKI target"):
        ident(X)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", " GEN2 ")
    ident(X)
    assert nki.last_report().target == "trn1"
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE")
    monkeypatch.setenv("TORCH_NEURONX_INSTANCE_TYPE", "inf2.xlarge")
    ident(X)
    assert nki.last_report().target == "trn1"
    monkeypatch.setenv("TORCH_NEURONX_INSTANCE_TYPE", "no-such-instance")
    ident(X)
    assert nki.last_report().target == "trn2"  # the default instance; the device layer reports the bad name
    monkeypatch.setenv("TORCH_NEURONX_NKI_CAPACITY", "lenient")
    with pytest.raises(ValueError, match="TORCH_NEURONX_NKI_CAPACITY='lenient'"):
        ident(X)


def test_operators_must_exist() -> None:
    @nki.jit
    def bad_op(a):  # type: ignore[no-untyped-def]
        t = nl.load(a)
        nisa.tensor_tensor(dst=t, data1=t, data2=t, op="frobnicate")

    with pytest.raises(NkiValidationError, match="err-unsupported-operator"):
        bad_op(X)

    @nki.jit
    def reduce_partitions(a):  # type: ignore[no-untyped-def]
        t = nl.load(a)
        return nl.sum(t, axis=0)

    with pytest.raises(NkiValidationError, match="err-unsupported-reduce-axis"):
        reduce_partitions(X)
