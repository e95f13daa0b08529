"""Where an accelerator covers more than the CPU kernels: the device's own kernels, against CUDA's documented
behaviour or the CPU run of the same code."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode


def _histc_reference(values: list[int], bins: int, lo: int, hi: int) -> list[int]:
    """CUDA's integer histc: (v - min) * bins // (max - min), max in the last bin, outside values dropped."""
    counts = [0] * bins
    for v in values:
        if lo <= v <= hi:
            counts[min((v - lo) * bins // (hi - lo), bins - 1)] += 1
    return counts


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
def test_histc_counts_integers_like_cuda(dtype: torch.dtype) -> None:
    values = [0, 1, 1, 3, 7, 7, 7, 2, 5, 9, 100]
    x = torch.tensor(values, dtype=dtype, device="neuron")
    for bins, lo, hi in [(4, 0, 3), (3, 0, 9), (8, 1, 7), (5, 0, 10)]:
        got = torch.histc(x, bins=bins, min=lo, max=hi)
        assert got.dtype == dtype and got.device.type == "neuron"  # CUDA keeps the input's dtype
        assert got.cpu().tolist() == _histc_reference(values, bins, lo, hi), (bins, lo, hi)
    # min == max: the data's own range, as on CUDA.
    assert torch.histc(x, bins=4).cpu().tolist() == _histc_reference(values, 4, 0, 100)


def test_histc_integer_edge_cases() -> None:
    same = torch.full((5,), 3, dtype=torch.int32, device="neuron")
    # A constant input widens to [v - 1, v + 1].
    assert torch.histc(same, bins=2).cpu().tolist() == _histc_reference([3] * 5, 2, 2, 4)
    assert torch.histc(torch.empty(0, dtype=torch.int32, device="neuron"), bins=3).cpu().tolist() == [0, 0, 0]
    ids = torch.arange(12, dtype=torch.int32, device="neuron").view(3, 4).t()  # non-contiguous
    assert torch.histc(ids, bins=3, min=0, max=11).cpu().tolist() == [4, 4, 4]
    out = torch.empty(0, dtype=torch.int32, device="neuron")
    assert torch.histc(ids, bins=3, min=0, max=11, out=out) is out and out.cpu().tolist() == [4, 4, 4]
    with pytest.raises(RuntimeError, match="max must be larger than min"):
        torch.histc(same, bins=2, min=5, max=1)
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.histc(ids, bins=3, out=torch.empty(0, device="neuron"))


@pytest.mark.parametrize(("values", "bins"), [
    ([0, 2**59, 2**60], 16),           # (v - min) * bins overflowed int64: wrong counts, writes before the buffer
    ([0, 2**43, 2**44], 2**20),        # ... or a bin index far outside it: a segfault
    ([-(2**62), 0, 2**62 - 1], 7),
    ([-(2**63), 2**63 - 1, 0, 5], 3),  # the whole int64 range
])
def test_histc_int64_wide_ranges_stay_exact(values: list[int], bins: int) -> None:
    x = torch.tensor(values, dtype=torch.int64, device="neuron")
    got = torch.histc(x, bins=bins)
    assert got.cpu().tolist() == _histc_reference(values, bins, min(values), max(values))


def test_histc_floats_match_cpu() -> None:
    x = torch.randn(1000)
    for args in [(10, 0.0, 0.0), (7, -1.0, 1.0)]:
        assert torch.equal(torch.histc(x.to("neuron"), *args).cpu(), torch.histc(x, *args))


def test_module_to_keeps_parameter_objects() -> None:
    """As with CUDA: the Parameter objects survive the move, so an optimizer made earlier still owns them."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    ref = torch.nn.Linear(4, 3)
    ref.load_state_dict(model.state_dict())
    params = list(model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.to("neuron")
    assert [p is q for p, q in zip(model.parameters(), params, strict=True)] == [True, True]
    assert all(p.device.type == "neuron" for p in params)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    x = torch.randn(8, 4)
    for m, o, inp in ((model, opt, x.to("neuron")), (ref, ref_opt, x)):
        m(inp).square().sum().backward()
        o.step()
    assert torch.equal(model.weight.detach().cpu(), ref.weight.detach())
    assert torch._has_compatible_shallow_copy_type(torch.zeros(1), torch.zeros(1, device="neuron"))
    assert not torch._has_compatible_shallow_copy_type(torch.zeros(2).to_sparse(), torch.zeros(2, device="neuron"))
    p = torch.nn.Parameter(torch.zeros(3))
    p.data = torch.ones(3, device="neuron")  # set_data across the boundary, as CUDA allows
    assert p.device.type == "neuron" and isinstance(p, torch.nn.Parameter)


SDPA_CASES = ["causal", "mask", "plain", "float_mask", "gqa", "odd_length", "strided", "mask_grad", "empty"]


def _sdpa_inputs(case: str, dtype: torch.dtype) -> tuple[list[torch.Tensor], dict[str, object]]:
    length = 37 if case == "odd_length" else 64  # 37: the log-sum-exp is padded to 64 internally
    batch = 0 if case == "empty" else 2
    q, k, v = (torch.randn(batch, 4, length, 16, dtype=dtype) for _ in range(3))
    kwargs: dict[str, object] = {"is_causal": True} if case in ("causal", "odd_length", "empty") else {}
    if case == "mask":
        kwargs["attn_mask"] = torch.rand(length, length) > 0.3
    if case in ("float_mask", "mask_grad"):
        kwargs["attn_mask"] = torch.randn(2, 1, length, length, dtype=dtype)
    if case == "gqa":
        k, v = k[:, :2], v[:, :2]
        kwargs["enable_gqa"] = True
    if case == "strided":  # (B, L, H, D) memory seen as (B, H, L, D), as attention layers produce
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    return [q, k, v], kwargs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", SDPA_CASES)
def test_sdpa_takes_cpu_fused_kernel_and_matches_cpu(dtype: torch.dtype, case: str) -> None:
    """SDPA on neuron runs CPU's flash kernel (named as efficient attention, the op DTensor and context
    parallelism know) on the same bits: output and gradients equal CPU's exactly."""
    tensors, kwargs = _sdpa_inputs(case, dtype)
    cpu_in = [t.clone().requires_grad_() for t in tensors]
    dev_in = [t.to("neuron").requires_grad_() for t in tensors]
    mask = kwargs.get("attn_mask")
    dev_kwargs = dict(kwargs)
    if isinstance(mask, torch.Tensor):
        dev_kwargs["attn_mask"] = mask.to("neuron")
        if case == "mask_grad":
            kwargs["attn_mask"] = mask.clone().requires_grad_()
            dev_kwargs["attn_mask"] = mask.to("neuron").requires_grad_()
    want = F.scaled_dot_product_attention(*cpu_in, **kwargs)
    with torch.profiler.profile() as prof:
        got = F.scaled_dot_product_attention(*dev_in, **dev_kwargs)
    names = {e.name for e in prof.events()}
    cpu_choice = torch._fused_sdp_choice(*cpu_in, **kwargs)
    if case == "empty":  # SDPA answers zero-size inputs without a kernel, on CPU as on neuron
        assert not any("flash" in n or "efficient" in n for n in names), names
    elif cpu_choice == 1:  # CPU takes its flash kernel: so does neuron
        assert "aten::_scaled_dot_product_flash_attention_for_cpu" in names, names
        renamed = case not in ("gqa", "mask_grad")
        assert ("aten::_scaled_dot_product_efficient_attention" in names) == renamed, names
        assert torch._fused_sdp_choice(*dev_in, **dev_kwargs) == (2 if renamed else 1)
    else:
        assert "aten::_scaled_dot_product_attention_math" in names, names
    # The same kernel on the same bits: equal, not merely close, in every dtype; the layout is the one
    # compiled graphs assume (a FakeTensor run of the same call), which for efficient attention is CUDA's.
    assert torch.equal(got.cpu(), want)
    with FakeTensorMode() as mode:
        fake_in = [mode.from_tensor(t) for t in dev_in]
        fake_kwargs = {n: mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for n, a in dev_kwargs.items()}
        fake = F.scaled_dot_product_attention(*fake_in, **fake_kwargs)
    assert got.stride() == fake.stride(), (got.stride(), fake.stride())
    grad = torch.randn_like(want)
    want.backward(grad)
    got.backward(grad.to("neuron"))
    for c, d in zip(cpu_in, dev_in, strict=True):
        assert torch.equal(d.grad.cpu(), c.grad)
    if case == "mask_grad":
        assert torch.equal(dev_kwargs["attn_mask"].grad.cpu(), kwargs["attn_mask"].grad)  # type: ignore[union-attr]


@pytest.mark.parametrize("case", ["plain", "bool_mask", "causal"])
def test_sdpa_float64_backward_equals_cpu_and_passes_gradcheck(case: str) -> None:
    """float64 attention (what gradcheck needs) runs CPU's flash op, whose log-sum-exp is float64: gradients equal
    CPU's exactly, and gradcheck holds on the device (issue 34: the float32 log-sum-exp broke the backward)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, 3, 4, dtype=torch.float64) for _ in range(3))
    mask = torch.tensor([[True, False, True], [True, True, False], [False, True, True]])
    kwargs: dict[str, object] = {"is_causal": True} if case == "causal" else {}
    dev_kwargs = dict(kwargs)
    if case == "bool_mask":
        kwargs["attn_mask"], dev_kwargs["attn_mask"] = mask, mask.to("neuron")
    cpu_in = [t.clone().requires_grad_() for t in (q, k, v)]
    dev_in = [t.to("neuron").requires_grad_() for t in (q, k, v)]
    want = F.scaled_dot_product_attention(*cpu_in, **kwargs)
    got = F.scaled_dot_product_attention(*dev_in, **dev_kwargs)
    assert got.dtype == torch.float64 and torch.equal(got.cpu(), want)
    want.sum().backward()
    got.sum().backward()
    for c, d in zip(cpu_in, dev_in, strict=True):
        assert torch.equal(d.grad.cpu(), c.grad)
    assert torch.autograd.gradcheck(lambda *t: F.scaled_dot_product_attention(*t, **dev_kwargs),
                                    [t.detach().requires_grad_() for t in dev_in])


def test_efficient_attention_backward_takes_float64_inputs() -> None:
    # Called directly (as DTensor's rules may), efficient attention keeps its float32 log-sum-exp (CUDA's contract)
    # and its backward hands CPU's kernel the float64 one it needs: gradients as CPU's flash op gives, to rounding.
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, 3, 4, dtype=torch.float64, device="neuron") for _ in range(3))
    out, lse, seed, offset = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True)
    assert lse.dtype == torch.float32
    grad = torch.ones_like(out)
    got = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
        grad, q, k, v, None, out, lse, seed, offset, 0.0, [True, True, True, False])[:3]
    cq, ck, cv = (t.cpu() for t in (q, k, v))
    cpu_out, cpu_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(cq, ck, cv)
    want = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad.cpu(), cq, ck, cv, cpu_out, cpu_lse, 0.0, False)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.cpu(), w, rtol=1e-6, atol=1e-6)


def test_efficient_attention_op_refuses_what_it_cannot_do() -> None:
    q = torch.randn(1, 2, 32, 8, device="neuron")
    with pytest.raises(RuntimeError, match="without dropout"):
        torch.ops.aten._scaled_dot_product_efficient_attention(q, q, q, None, True, 0.5)
    out, lse, seed, offset = torch.ops.aten._scaled_dot_product_efficient_attention(q, q, q, None, True)
    assert lse.shape == (1, 2, 32) and out.device.type == "neuron"
    with pytest.raises(RuntimeError, match="compute_log_sumexp=True"):
        torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            out, q, q, q, None, out, lse[..., :0], seed, offset, 0.0, [True, True, True, False])


def test_sdpa_with_dropout_follows_cpu_to_math_and_its_numbers() -> None:
    """CPU takes the math path for attention dropout; so does neuron, drawing the same numbers for the same seed."""
    q = torch.randn(2, 2, 8, 4)
    torch.manual_seed(0)
    want = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    qd = q.to("neuron")
    torch.manual_seed(0)
    with torch.profiler.profile() as prof:
        got = F.scaled_dot_product_attention(qd, qd, qd, dropout_p=0.5)
    assert "aten::_scaled_dot_product_attention_math" in {e.name for e in prof.events()}
    assert torch.equal(got.cpu(), want)


def test_conv_output_layout_agrees_with_fake_tensor() -> None:
    """The compiled graph's stride checks come from FakeTensor; the real kernel must lay out results the same way."""
    x = torch.randn(2, 3, 16, 16).to(memory_format=torch.channels_last)
    w = torch.randn(8, 3, 3, 3, requires_grad=True)
    xd, wd = x.to("neuron").requires_grad_(), w.detach().to("neuron").requires_grad_()
    real = F.conv2d(xd, wd, padding=1)
    mode = FakeTensorMode()
    with mode:
        fake = F.conv2d(mode.from_tensor(xd), mode.from_tensor(wd), padding=1)
    assert real.stride() == fake.stride()
    want = F.conv2d(x.requires_grad_(), w, padding=1)
    torch.testing.assert_close(real.cpu(), want)
    grad = torch.randn_like(want)
    want.backward(grad)
    real.backward(grad.to("neuron"))
    torch.testing.assert_close(xd.grad.cpu(), x.grad)
    torch.testing.assert_close(wd.grad.cpu(), w.grad)
