"""More of AWS's NKI 0.6 reference, tested from its text (issue 31, second pass).

The search, statistics, selection and cumulative instructions (``max8``, ``nc_find_index8``, ``nc_match_replace8``,
``nc_n_gather``, ``bn_stats``, ``bn_aggr``, ``tensor_scalar_cumulative``, ``exponential``, ``select_reduce``,
``range_select``), the operand rules of ``dma_copy`` and of the indirect ``dma_transpose``, and the names that are
not emulated. Each test states what aws-neuron/aws-neuron-sdk ``nki/api/nki/isa/__init__.py`` documents and checks
the interpreter against NumPy written from that text (not from AWS's code). Every refusal has a correct twin that
passes.
"""

from __future__ import annotations

import numpy as np
import pytest

import torch_neuronx.nki as nki
from torch_neuronx.testing.nki_checks import expect

nl = nki.language
nisa = nki.isa
P = 128


def one_output(instruction, out_shape, out_dtype, target="trn2"):  # type: ignore[no-untyped-def]
    """A kernel that loads its inputs, runs `instruction(dst, *tiles)` and returns dst."""
    def kernel(*arrays):  # type: ignore[no-untyped-def]
        out = nl.ndarray(out_shape, dtype=out_dtype, buffer=nl.shared_hbm)
        tiles = [nl.load(a) for a in arrays]
        dst = nl.ndarray(out_shape, dtype=out_dtype, buffer=nl.sbuf)
        instruction(dst, *tiles)
        nisa.dma_copy(dst=out, src=dst)
        return out

    return nki.jit(kernel, platform_target=target)


# ------------------------------------------------------------------------------------------------------ max8


def test_max8_gives_the_eight_largest_in_descending_order() -> None:
    """AWS max8: the 8 largest values of each partition, descending, compared in fp32; 8..16,384 elements."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((P, 3, 40)).astype(np.float32)  # up to 3-D sources, 120 elements per partition
    run = one_output(lambda dst, t: nisa.max8(dst=dst, src=t), (P, 8), nl.float32)
    expected = -np.sort(-a.reshape(P, -1), axis=1)[:, :8]
    assert np.array_equal(run(a), expected)
    expect("err-size-of-dimension-exceed-arch-limit", run, a[:, 0, :7], operand="src")  # fewer than 8
    assert np.array_equal(run(a[:, 0, :8]), -np.sort(-a[:, 0, :8], axis=1))


# ------------------------------------------------------------------------------------------ find / replace 8


def test_nc_find_index8_first_occurrences_and_the_all_ones_sentinel() -> None:
    """AWS nc_find_index8: index of the first occurrence of each value per partition; an absent value gives all
    ones (0xFFFFFFFF for uint32, 0xFFFF for uint16); repeated vals take matches in ascending order."""
    data = np.tile(np.array([1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8, 5], np.float32), (P, 1))
    vals = np.tile(np.array([3, 8, 8, 5, 9, 1, 4, 2], np.float32), (P, 1))
    expected = np.array([2, 4, 5, 11, 0xFFFFFFFF, 0, 3, 1], np.uint64)

    def find(dst, d, v):  # type: ignore[no-untyped-def]
        nisa.nc_find_index8(dst=dst, data=d, vals=v)

    out = one_output(find, (P, 8), nl.uint32)(data, vals)
    assert np.array_equal(out.astype(np.uint64), np.tile(expected, (P, 1)))
    out16 = one_output(find, (P, 8), nl.uint16)(data, vals)
    assert int(out16[0, 4]) == 0xFFFF and int(out16[0, 0]) == 2
    expect("err-unsupported-dtype", one_output(find, (P, 8), nl.int32), data, vals, operand="dst")


def test_nc_match_replace8_replaces_and_pairs_duplicates_in_reverse() -> None:
    """AWS nc_match_replace8: the first occurrence of each val is replaced by imm; duplicates are processed from
    vals[7] down to vals[0], so data [1,2,3,4,8,8,8,8,8,8,8] with vals [3,8,8,8,8,8,8,8] gives dst_idx
    [2,10,9,8,7,6,5,4] (the documented example)."""
    data = np.tile(np.array([1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8], np.float32), (P, 1))
    vals = np.tile(np.array([3, 8, 8, 8, 8, 8, 8, 8], np.float32), (P, 1))

    def replace(d, v, with_idx):  # type: ignore[no-untyped-def]
        out = nl.ndarray(d.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        idx_out = nl.ndarray((d.shape[0], 8), dtype=nl.uint32, buffer=nl.shared_hbm)
        td, tv = nl.load(d), nl.load(v)
        dst = nl.ndarray(d.shape, dtype=nl.float32, buffer=nl.sbuf)
        idx = nl.ndarray((d.shape[0], 8), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.nc_match_replace8(dst=dst, data=td, vals=tv, imm=-1.0, dst_idx=idx if with_idx else None)
        nisa.dma_copy(dst=out, src=dst)
        if with_idx:
            nisa.dma_copy(dst=idx_out, src=idx)
        return out, idx_out

    out, idx = nki.jit(replace)(data, vals, True)
    assert np.array_equal(idx[0].astype(np.int64), [2, 10, 9, 8, 7, 6, 5, 4])
    expected = data.copy()
    expected[:, [2, 4, 5, 6, 7, 8, 9, 10]] = -1.0
    assert np.array_equal(out, expected)
    # a value absent from data: dst_idx is undocumented there, so it is refused rather than guessed ...
    absent = vals.copy()
    absent[:, 0] = 42.0
    expect("err-unsupported-feature", nki.jit(replace), data, absent, True, operand="dst_idx")
    # ... and without dst_idx the replacement of the values present is well defined
    out, _ = nki.jit(replace)(data, absent, False)
    expected = data.copy()
    expected[:, 4:11] = -1.0
    assert np.array_equal(out, expected)


# ------------------------------------------------------------------------------------------- bn_stats / aggr


def stats_kernel(a, chunks):  # type: ignore[no-untyped-def]
    out = nl.ndarray((a.shape[0], 2), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.load(a)
    width = a.shape[1] // chunks
    stats = nl.ndarray((a.shape[0], 6 * chunks), dtype=nl.float32, buffer=nl.sbuf)
    for c in nl.static_range(chunks):
        nisa.bn_stats(dst=stats[:, 6 * c:6 * (c + 1)], data=t[:, c * width:(c + 1) * width])
    res = nl.ndarray((a.shape[0], 2), dtype=nl.float32, buffer=nl.sbuf)
    nisa.bn_aggr(dst=res, data=stats)
    nisa.dma_copy(dst=out, src=res)
    return out


def test_bn_stats_gives_even_and_odd_count_mean_and_scaled_variance() -> None:
    """AWS bn_stats: per partition (count, mean, variance * count) of the even elements, then of the odd ones."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((P, 10)).astype(np.float32)
    out = one_output(lambda dst, t: nisa.bn_stats(dst=dst, data=t), (P, 6), nl.float32)(a)
    for half, cols in ((a[:, 0::2], slice(0, 3)), (a[:, 1::2], slice(3, 6))):
        expected = np.stack([np.full(P, 5.0), half.mean(axis=1), half.var(axis=1) * 5], axis=1)
        np.testing.assert_allclose(out[:, cols], expected, rtol=1e-5, atol=1e-5)


def test_bn_aggr_combines_bn_stats_outputs_into_mean_and_variance() -> None:
    """AWS bn_aggr: mean and variance per partition from one or more bn_stats outputs; bn_stats reads at most
    512 elements per partition, so wider rows take one bn_stats per 512-element chunk."""
    rng = np.random.default_rng(2)
    a = (rng.standard_normal((P, 1024)) * 3 + 1).astype(np.float32)
    out = nki.jit(stats_kernel)(a, 2)
    np.testing.assert_allclose(out[:, 0], a.mean(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[:, 1], a.var(axis=1), rtol=1e-4)
    expect("err-size-of-dimension-exceed-arch-limit", nki.jit(stats_kernel), a, 1, operand="data")
    odd = rng.standard_normal((P, 1)).astype(np.float32)  # one element: an empty odd half, count 0
    np.testing.assert_allclose(nki.jit(stats_kernel)(odd, 1), np.concatenate([odd, np.zeros_like(odd)], axis=1))


# ----------------------------------------------------------------------------------- tensor_scalar_cumulative


def cumulative(a, op0, op1, cmd, imm1):  # type: ignore[no-untyped-def]
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.load(a)
    r = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar_cumulative(dst=r, src=t, op0=op0, op1=op1, imm0=2.0, imm1=imm1, reduce_cmd=cmd)
    nisa.dma_copy(dst=out, src=r)
    return out


@pytest.mark.parametrize(("op1", "start"), [("add", 0.0), ("subtract", 0.0), ("multiply", 1.0),
                                            ("maximum", -np.inf), ("minimum", np.inf)])
def test_tensor_scalar_cumulative_follows_the_documented_loop(op1: str, start: float) -> None:
    """AWS pseudo-code: reset_reduce sets reg to 0 (add, subtract), 1 (mult), -inf (max), +inf (min); then for each
    element reg = op1(op0(x[i], imm0), reg) and out[i] = reg; load_reduce starts from imm1."""
    rng = np.random.default_rng(3)
    a = rng.integers(-3, 4, (P, 6)).astype(np.float32)
    fn = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "maximum": np.maximum,
          "minimum": np.minimum}[op1]

    def reference(reg: np.ndarray) -> np.ndarray:
        out = np.empty_like(a)
        for i in range(a.shape[1]):
            reg = fn(a[:, i] * 2.0, reg).astype(np.float32)  # op0 = multiply by imm0 = 2.0
            out[:, i] = reg
        return out

    run = nki.jit(cumulative)
    got = run(a, nl.multiply, getattr(nl, op1), nisa.reduce_cmd.reset_reduce, None)
    assert np.array_equal(got, reference(np.full(P, start, np.float32)))
    got = run(a, nl.multiply, getattr(nl, op1), nisa.reduce_cmd.load_reduce, 5.0)
    assert np.array_equal(got, reference(np.full(P, 5.0, np.float32)))


def test_tensor_scalar_cumulative_refusals() -> None:
    """AWS: op1 is add, subtract, mult, max or min; INT32/UINT32 inputs are not supported."""
    a = np.ones((P, 4), np.float32)
    expect("err-unsupported-operator", nki.jit(cumulative), a, nl.multiply, nl.bitwise_or,
           nisa.reduce_cmd.reset_reduce, None, operand="op1")
    expect("err-invalid-operand", nki.jit(cumulative), a, nl.multiply, nl.add, nisa.reduce_cmd.reset_reduce, 1.0,
           operand="imm1")
    expect("err-unsupported-dtype", nki.jit(cumulative), a.astype(np.int32), nl.multiply, nl.add,
           nisa.reduce_cmd.reset_reduce, None, operand="src")
    assert np.array_equal(nki.jit(cumulative)(a, nl.add, nl.add, nisa.reduce_cmd.reset_reduce, None),
                          np.tile(np.arange(1, 5, dtype=np.float32) * 3, (P, 1)))


# ------------------------------------------------------------------------------------------------ exponential


def exp_kernel(a, chunks, cmd_first):  # type: ignore[no-untyped-def]
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    total = nl.ndarray((a.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.load(a)
    r = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
    s = nl.ndarray((a.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    width = a.shape[1] // chunks
    for c in nl.static_range(chunks):
        cmd = cmd_first if c == 0 else nisa.reduce_cmd.reduce
        last = c == chunks - 1
        nisa.exponential(dst=r[:, c * width:(c + 1) * width], src=t[:, c * width:(c + 1) * width], max_value=1.5,
                         reduce_res=s if last else None, reduce_cmd=cmd)
    nisa.dma_copy(dst=out, src=r)
    nisa.dma_copy(dst=total, src=s)
    return out, total


def test_exponential_subtracts_the_max_and_sums_into_the_accumulators_on_trn3() -> None:
    """AWS exponential (NeuronCore-v4 only): dst = exp(src - max_value); reset_reduce zeroes the accumulators,
    reduce keeps adding, reduce_res reads the running sum out (a softmax denominator over several tiles)."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((P, 64)).astype(np.float32)
    out, total = nki.jit(exp_kernel, platform_target="trn3")(a, 2, nisa.reduce_cmd.reset_reduce)
    e = np.exp(a - 1.5)
    np.testing.assert_allclose(out, e, rtol=1e-6)
    np.testing.assert_allclose(total[:, 0], e.sum(axis=1), rtol=1e-5)
    expect("err-unsupported-feature", nki.jit(exp_kernel, platform_target="trn2"), a, 2,
           nisa.reduce_cmd.reset_reduce)
    # idle leaves the accumulators in an unknown state: reading them out is refused, not invented
    expect("err-invalid-operand", nki.jit(exp_kernel, platform_target="trn3"), a, 1, nisa.reduce_cmd.idle,
           operand="reduce_res")


# ------------------------------------------------------------------------------------------------ nc_n_gather


def test_nc_n_gather_gathers_within_each_partition_over_the_flattened_free_dims() -> None:
    """AWS nc_n_gather: per partition, dst[p, j] = data[p].flatten()[indices[p, j]]; uint32 indices in
    [0, data.size / data.shape[0]); dst has data's dtype."""
    rng = np.random.default_rng(5)
    data = rng.standard_normal((P, 4, 8)).astype(np.float32)
    idx = rng.integers(0, 32, (P, 12)).astype(np.uint32)

    def gather(dst, d, i):  # type: ignore[no-untyped-def]
        nisa.nc_n_gather(dst=dst, data=d, indices=i)

    out = one_output(gather, (P, 12), nl.float32)(data, idx)
    assert np.array_equal(out, np.take_along_axis(data.reshape(P, -1), idx.astype(np.int64), axis=1))
    expect("err-tensor-access-out-of-bound", one_output(gather, (P, 12), nl.float32), data, idx + 32,
           operand="indices")
    expect("err-unsupported-dtype", one_output(gather, (P, 12), nl.float32), data, idx.astype(np.int32),
           operand="indices")


# ---------------------------------------------------------------------------------- select_reduce / range_select


def select_kernel(pred, on_true, on_false, cmd):  # type: ignore[no-untyped-def]
    out = nl.ndarray(on_true.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    best = nl.ndarray((on_true.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
    tp, tt = nl.load(pred), nl.load(on_true)
    r = nl.ndarray(on_true.shape, dtype=nl.float32, buffer=nl.sbuf)
    m = nl.ndarray((on_true.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.select_reduce(dst=r, predicate=tp, on_true=tt, on_false=on_false, reduce_res=m, reduce_cmd=cmd)
    nisa.dma_copy(dst=out, src=r)
    nisa.dma_copy(dst=best, src=m)
    return out, best


def test_select_reduce_selects_and_takes_the_row_maximum() -> None:
    """AWS select_reduce: result = where(predicate, on_true, on_false); with reduction, the row max of result."""
    rng = np.random.default_rng(6)
    pred = rng.integers(0, 2, (P, 16)).astype(np.uint8)
    on_true = rng.standard_normal((P, 16)).astype(np.float32)
    out, best = nki.jit(select_kernel)(pred, on_true, -7.0, nisa.reduce_cmd.reset_reduce)
    expected = np.where(pred != 0, on_true, np.float32(-7.0))
    assert np.array_equal(out, expected)
    assert np.array_equal(best[:, 0], expected.max(axis=1))
    expect("err-unsupported-dtype", nki.jit(select_kernel), pred.astype(np.float32), on_true, -7.0,
           nisa.reduce_cmd.reset_reduce, operand="predicate")
    expect("err-invalid-operand", nki.jit(select_kernel), pred, on_true, -7.0, nisa.reduce_cmd.idle,
           operand="reduce_res")


def causal_kernel(scores, lo, hi, start):  # type: ignore[no-untyped-def]
    out = nl.ndarray(scores.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    best = nl.ndarray((scores.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
    t, b0, b1 = nl.load(scores), nl.load(lo), nl.load(hi)
    r = nl.ndarray(scores.shape, dtype=nl.float32, buffer=nl.sbuf)
    m = nl.ndarray((scores.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.range_select(dst=r, on_true_tile=t, comp_op0=nl.greater_equal, comp_op1=nl.less, bound0=b0, bound1=b1,
                      reduce_res=m, range_start=start, on_false_value=-3.4028235e38)
    nisa.dma_copy(dst=out, src=r)
    nisa.dma_copy(dst=best, src=m)
    return out, best


def test_range_select_keeps_the_index_range_and_fills_fp32_min() -> None:
    """AWS range_select (NeuronCore-v3+), its NumPy equivalent: indices = range_start + arange(free); mask =
    op0(indices, bound0) & op1(indices, bound1); where(mask, on_true, FP32_MIN); reduce = max per row."""
    rng = np.random.default_rng(7)
    scores = rng.standard_normal((P, 32)).astype(np.float32)
    lo = np.zeros((P, 1), np.float32)
    hi = (np.arange(P, dtype=np.float32) % 32 + 1).reshape(P, 1)  # row p keeps columns < p % 32 + 1
    out, best = nki.jit(causal_kernel, platform_target="trn2")(scores, lo, hi, 4)
    index = 4 + np.arange(32, dtype=np.float32)
    mask = (index >= lo) & (index < hi)
    expected = np.where(mask, scores, np.float32(-3.4028235e38))
    assert np.array_equal(out, expected)
    assert np.array_equal(best[:, 0], expected.max(axis=1))
    expect("err-unsupported-feature", nki.jit(causal_kernel, platform_target="trn1"), scores, lo, hi, 0)


# ------------------------------------------------------------------------------------------- what is not here


@pytest.mark.parametrize(("module", "name"), [("isa", "topk"), ("isa", "sequence_bounds"), ("isa", "local_gather"),
                                              ("isa", "rand2"), ("isa", "core_barrier"),
                                              ("language", "float8_e4m3fn_x4"), ("language", "dropout")])
def test_reference_names_not_emulated_say_why_and_are_listed_in_the_docs(module: str, name: str) -> None:
    """A function of AWS's reference that is not emulated raises AttributeError (hasattr stays False) with the
    reason, and docs/nki.md's "Not implemented" table lists it."""
    from pathlib import Path

    with pytest.raises(AttributeError, match="not emulated here") as info:
        getattr(getattr(nki, module), name)
    assert name in str(info.value) and "docs/nki.md" in str(info.value)
    docs = (Path(__file__).resolve().parents[2] / "docs" / "nki.md").read_text()
    table = docs[docs.index("**Not implemented.**"):docs.index("## AWS's published kernels")]
    assert name in table


# ------------------------------------------------------------------------------------------ dma_copy operands


def gather_rows(data, indices, idx_from_hbm, engine, dge):  # type: ignore[no-untyped-def]
    f = data.shape[1]
    idx = nl.ndarray((P, 1), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx, src=indices)
    dst = nl.ndarray((P, f), dtype=data.dtype, buffer=nl.sbuf)
    src = data.ap(pattern=[[f, P], [1, f]], vector_offset=indices if idx_from_hbm else idx, indirect_dim=0)
    nisa.dma_copy(dst=dst, src=src)
    out = nl.ndarray((P, f), dtype=data.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=dst, engine=engine, dge_mode=dge)
    return out


def test_dma_copy_indices_live_in_sbuf_and_engine_goes_with_hardware_dge() -> None:
    """AWS dma_copy: vector_offset is "an SBUF tensor of shape (P, 1)"; engine= is the engine that generates
    hardware-DGE descriptors, nisa.engine.sync or nisa.engine.scalar, "only valid when dge_mode=hwdge"."""
    rng = np.random.default_rng(8)
    data = rng.standard_normal((256, 8)).astype(np.float32)
    idx = rng.integers(0, 256, (P, 1)).astype(np.uint32)
    run = nki.jit(gather_rows, platform_target="trn2")
    unknown, hwdge = nisa.engine.unknown, nisa.dge_mode.hwdge
    assert np.array_equal(run(data, idx, False, unknown, nisa.dge_mode.unknown), data[idx[:, 0]])
    assert np.array_equal(run(data, idx, False, nisa.engine.sync, hwdge), data[idx[:, 0]])
    expect("err-unsupported-memory", run, data, idx, True, unknown, nisa.dge_mode.unknown, operand="vector_offset")
    expect("err-invalid-operand", run, data, idx, False, nisa.engine.scalar, nisa.dge_mode.unknown, operand="engine")
    expect("err-unsupported-engine", run, data, idx, False, nisa.engine.vector, hwdge, operand="engine")


def test_the_new_instructions_trace_shapes_only_on_meta_tensors() -> None:
    """Under torch.compile a kernel sees fake tensors and runs shapes and rules only: each instruction above must
    check its operands and return without computing (and still refuse what breaks a rule)."""
    import torch

    def meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.empty(*shape, dtype=dtype, device="meta")

    assert one_output(lambda dst, t: nisa.max8(dst=dst, src=t), (P, 8), nl.float32)(meta(P, 40)).shape == (P, 8)
    assert nki.jit(stats_kernel)(meta(P, 1024), 2).shape == (P, 2)
    assert nki.jit(cumulative)(meta(P, 6), nl.multiply, nl.add, nisa.reduce_cmd.reset_reduce, None).shape == (P, 6)
    out, total = nki.jit(exp_kernel, platform_target="trn3")(meta(P, 64), 2, nisa.reduce_cmd.reset_reduce)
    assert out.shape == (P, 64) and total.shape == (P, 1)
    out, best = nki.jit(causal_kernel, platform_target="trn2")(meta(P, 32), meta(P, 1), meta(P, 1), 4)
    assert out.shape == (P, 32) and best.shape == (P, 1)
    out, best = nki.jit(select_kernel)(meta(P, 16, dtype=torch.uint8), meta(P, 16), -7.0, nisa.reduce_cmd.reduce)
    assert out.shape == (P, 16)
    expect("err-unsupported-feature", nki.jit(causal_kernel, platform_target="trn1"), meta(P, 32), meta(P, 1),
           meta(P, 1), 0)


def gather_transpose_rows(src_hbm, idx_hbm):  # type: ignore[no-untyped-def]
    rows = idx_hbm.shape[0] * idx_hbm.shape[1]
    cols = src_hbm.shape[1]
    out = nl.ndarray((cols, rows), dtype=src_hbm.dtype, buffer=nl.shared_hbm)
    idx = nl.load(idx_hbm)
    dst = nl.ndarray((cols, rows), dtype=src_hbm.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=dst, src=src_hbm.ap(pattern=[[cols, rows], [1, cols]], vector_offset=idx, indirect_dim=0))
    nisa.dma_copy(dst=out, src=dst)
    return out


@pytest.mark.parametrize(("index_shape", "index_dtype", "code"), [
    ((64, 2), np.uint32, "err-unsupported-feature"),  # more than one column needs exactly 128 rows
    ((8, 1), np.uint32, "err-unsupported-feature"),  # 16 to 128 rows
    ((24, 1), np.uint32, "err-unsupported-feature"),  # a multiple of 16
    ((32, 1), np.int32, "err-unsupported-dtype"),  # "indices.dtype is np.uint32"
])
def test_indirect_dma_transpose_index_rules(index_shape: tuple[int, int], index_dtype: type, code: str) -> None:
    """AWS dma_transpose, "DMA Indirect Transpose Constraints": indices 2-D uint32 with 16..128 rows, a multiple of
    16, exactly 128 rows when there is more than one column; the correct twin gathers src[indices.T.flatten()].T."""
    rng = np.random.default_rng(9)
    src = rng.standard_normal((256, 64)).astype(np.float16)
    run = nki.jit(gather_transpose_rows, platform_target="trn2")
    idx = rng.integers(0, 256, index_shape).astype(index_dtype)
    expect(code, run, src, idx, operand="vector_offset")
    good = rng.integers(0, 256, (32, 1)).astype(np.uint32)
    assert np.array_equal(run(src, good), src[good.T.reshape(-1)].T)


def int_divide(a, b, engine):  # type: ignore[no-untyped-def]
    out = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.shared_hbm)
    ta, tb = nl.load(a), nl.load(b)
    r = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=r, data1=ta, data2=tb, op=nl.divide, engine=engine)
    nisa.dma_copy(dst=out, src=r)
    return out


def test_int32_divide_on_gpsimd_is_exact() -> None:
    """AWS tensor_tensor: all-int32 operands run on GpSimd's native integer arithmetic, "exact results for all
    32-bit integer values" — a quotient past 2^24 keeps its low bits (float32 would round 33554435 to 33554436);
    quotients round toward zero, as the float32 path's cast does. engine=vector stays float32."""
    a = np.array([[33554435, -7, 7, -33554435]] * P, np.int32)
    b = np.array([[1, 2, -2, 1]] * P, np.int32)
    exact = np.array([[33554435, -3, -3, -33554435]] * P, np.int32)
    assert np.array_equal(nki.jit(int_divide)(a, b, nisa.engine.unknown), exact)
    on_vector = (a.astype(np.float32) / b.astype(np.float32)).astype(np.int32)
    assert np.array_equal(nki.jit(int_divide)(a, b, nisa.engine.vector), on_vector)
    assert int(on_vector[0, 0]) == 33554436
    expect("err-invalid-operand", nki.jit(int_divide), a, b * 0, nisa.engine.unknown, operand="data2")


def test_nl_gather_flattened_gathers_from_the_flattened_free_dims() -> None:
    """AWS nl.gather_flattened: for each index, the element of data's (flattened) free dimension it selects, in the
    same partition; the result has the indices' shape and, with dtype=, that dtype. Only axis=0 is documented."""
    def kernel(d, i, axis, dtype):  # type: ignore[no-untyped-def]
        out = nl.ndarray(i.shape, dtype=dtype or d.dtype, buffer=nl.shared_hbm)
        r = nl.gather_flattened(nl.load(d), nl.load(i), axis=axis, dtype=dtype)
        nisa.dma_copy(dst=out, src=r)
        return out

    rng = np.random.default_rng(10)
    data = rng.standard_normal((P, 2, 16)).astype(np.float32)
    idx = rng.integers(0, 32, (P, 8)).astype(np.uint32)
    expected = np.take_along_axis(data.reshape(P, -1), idx.astype(np.int64), axis=1)
    assert np.array_equal(nki.jit(kernel)(data, idx, 0, None), expected)
    halves = nki.simulate(nki.jit(kernel))(data, idx, 0, nl.float16)
    assert np.array_equal(halves, expected.astype(np.float16))
    expect("err-unsupported-feature", nki.jit(kernel), data, idx, 1, None, operand="axis")
