"""FlexAttention on neuron, eager and compiled, forward and backward, against CPU's SDPA on the same inputs.

The reference for every mask and score modification is SDPA on CPU with the equivalent dense mask or bias
(made by torch's own ``create_mask``), in float32; gradients are compared too. Compiled training goes
through compile/flex.py's dense rewrite, compiled inference through CPU's C++ flash template."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, create_mask, flex_attention

B, H, L, D = 2, 4, 128, 16
WINDOW = 24
DOCS = torch.tensor([0] * 40 + [1] * 56 + [2] * 32)


def causal(b: Any, h: Any, q: Any, kv: Any) -> Any:
    return q >= kv


def document(b: Any, h: Any, q: Any, kv: Any) -> Any:
    docs = DOCS.to(q.device)
    return (docs[q] == docs[kv]) & (q >= kv)


def sliding_window(b: Any, h: Any, q: Any, kv: Any) -> Any:
    return (q >= kv) & (q - kv <= WINDOW)


def alibi(score: Any, b: Any, h: Any, q: Any, kv: Any) -> Any:
    return score - (h + 1) * 0.125 * (q - kv).abs()


CASES: dict[str, tuple[Callable[..., Any] | None, Callable[..., Any] | None]] = {
    "causal": (causal, None),
    "document": (document, None),
    "sliding_window": (sliding_window, None),
    "alibi": (None, alibi),
}


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, case: str) -> torch.Tensor:
    """CPU SDPA with the dense equivalent of the case's mask_mod / score_mod."""
    mask_mod, score_mod = CASES[case]
    if mask_mod is not None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=create_mask(mask_mod, None, None, L, L, "cpu"))
    heads = torch.arange(H).view(H, 1, 1)
    pos = torch.arange(L)
    bias = -(heads + 1) * 0.125 * (pos.view(L, 1) - pos.view(1, L)).abs()
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.float())


def inputs(dtype: torch.dtype, kv_heads: int = H, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, L, D, generator=g).to(dtype), torch.randn(B, kv_heads, L, D, generator=g).to(dtype),
            torch.randn(B, kv_heads, L, D, generator=g).to(dtype), torch.randn(B, H, L, D, generator=g))


def run(fn: Callable[..., Any], case: str, tensors: tuple[torch.Tensor, ...], device: str, **kw: Any) -> Any:
    q, k, v, grad = (t.to(device) for t in tensors)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    mask_mod, score_mod = CASES[case]
    block_mask = create_block_mask(mask_mod, None, None, L, L, device=device) if mask_mod else None
    out = fn(q, k, v, score_mod=score_mod, block_mask=block_mask, **kw)
    main = out[0] if isinstance(out, tuple) else out
    main.backward(grad.to(main.dtype))
    return out, (q.grad, k.grad, v.grad)


def expected(case: str, tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    q, k, v, grad = (t.float().detach().requires_grad_() for t in tensors)
    if k.shape[1] != q.shape[1]:
        k_, v_ = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    else:
        k_, v_ = k, v
    out = reference(q, k_, v_, case)
    out.backward(grad.detach())
    return out, (q.grad, k.grad, v.grad)


TOL = {torch.float32: {"atol": 2e-5, "rtol": 1e-4}, torch.bfloat16: {"atol": 3e-2, "rtol": 3e-2}}


def check(got: Any, grads: tuple[torch.Tensor, ...], case: str, tensors: tuple[torch.Tensor, ...],
          dtype: torch.dtype) -> None:
    want, want_grads = expected(case, tensors)
    out = got[0] if isinstance(got, tuple) else got
    assert out.device.type == "neuron" and out.dtype == dtype
    torch.testing.assert_close(out.cpu().float(), want, **TOL[dtype])
    for g, w in zip(grads, want_grads, strict=True):
        assert g.device.type == "neuron"
        torch.testing.assert_close(g.cpu().float(), w, **TOL[dtype])


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_eager_flex_matches_cpu_sdpa(case: str, dtype: torch.dtype) -> None:
    tensors = inputs(dtype)
    out, grads = run(flex_attention, case, tensors, "neuron")
    check(out, grads, case, tensors, dtype)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_eager_flex_gqa_and_lse() -> None:
    tensors = inputs(torch.float32, kv_heads=2)
    (out, aux), grads = run(flex_attention, "causal", tensors, "neuron", enable_gqa=True,
                            return_aux=AuxRequest(lse=True))
    check(out, grads, "causal", tensors, torch.float32)
    q, k, _, _ = tensors
    scores = (q @ k.repeat_interleave(2, dim=1).transpose(-1, -2)) / D**0.5
    scores = scores.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(aux.lse.cpu(), torch.logsumexp(scores, dim=-1), atol=1e-5, rtol=1e-5)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_eager_flex_under_neuron_autocast() -> None:
    q, k, v, _ = (t.to("neuron") for t in inputs(torch.float32))
    with torch.autocast("neuron", dtype=torch.bfloat16):
        out = flex_attention(q, k, v)
    assert out.dtype == torch.bfloat16
    want = F.scaled_dot_product_attention(*(t.cpu().bfloat16().float() for t in (q, k, v)))
    torch.testing.assert_close(out.cpu().float(), want, atol=3e-2, rtol=3e-2)


def test_block_mask_built_on_device_eager_and_compiled() -> None:
    eager = create_block_mask(document, None, None, L, L, device="neuron", BLOCK_SIZE=32)
    compiled = torch.compile(create_block_mask)(document, None, None, L, L, device="neuron", BLOCK_SIZE=32)
    on_cpu = create_block_mask(document, None, None, L, L, device="cpu", BLOCK_SIZE=32)
    for got in (eager, compiled):
        assert got.kv_num_blocks.device.type == "neuron"
        for a, b in zip(got.as_tuple()[2:6], on_cpu.as_tuple()[2:6], strict=True):
            if isinstance(b, torch.Tensor):
                assert torch.equal(a.cpu(), b)


@pytest.mark.parametrize("case,dtype", [("causal", torch.float32), ("document", torch.float32),
                                        ("alibi", torch.float32), ("sliding_window", torch.bfloat16)], ids=str)
def test_compiled_flex_training_matches_cpu_sdpa(case: str, dtype: torch.dtype) -> None:
    torch._dynamo.reset()
    tensors = inputs(dtype, seed=1)
    compiled = torch.compile(flex_attention)
    (out, aux), grads = run(compiled, case, tensors, "neuron", return_aux=AuxRequest(lse=True))
    check(out, grads, case, tensors, dtype)
    assert aux.lse.shape == (B, H, L) and aux.lse.device.type == "neuron"
    eager_out, _ = run(flex_attention, case, tensors, "neuron", return_aux=AuxRequest(lse=True))
    torch.testing.assert_close(aux.lse, eager_out[1].lse, **TOL[torch.float32])


@pytest.mark.parametrize("case,template", [("sliding_window", True), ("document", False)])
def test_compiled_flex_inference(case: str, template: bool) -> None:
    """No LSE, no grad: CPU's C++ flash template, unless a mod reads tensors of its own (then the dense path)."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    q, k, v, _ = (t.to("neuron") for t in inputs(torch.float32, seed=2))
    block_mask = create_block_mask(CASES[case][0], None, None, L, L, device="neuron")
    compiled = torch.compile(flex_attention)
    with torch.no_grad():
        out, code = run_and_get_code(compiled, q, k, v, block_mask=block_mask)
    want = reference(q.cpu(), k.cpu(), v.cpu(), case)
    torch.testing.assert_close(out.cpu(), want, atol=2e-5, rtol=1e-4)
    # The template's kernel streams over key blocks (kvBlockSize); the dense path has no such loop.
    assert any("kvBlockSize" in c for c in code) == template


def test_compiled_flex_keeps_the_users_pre_grad_pass() -> None:
    import torch._inductor.config as inductor_config
    from torch._inductor.custom_graph_pass import CustomGraphPass

    from torch_neuronx.compile import flex

    seen: list[int] = []

    class Counting(CustomGraphPass):
        def __call__(self, graph: torch.fx.Graph) -> None:
            seen.append(len(graph.nodes))

        def uuid(self) -> str:
            return f"counting-{id(seen)}"  # fresh each run: a cache hit would skip pre-grad passes

    torch._dynamo.reset()
    with inductor_config.patch(pre_grad_custom_pass=Counting()):
        flex.install()
        assert flex.installed()
        q, k, v, _ = (t.to("neuron").requires_grad_() for t in inputs(torch.float32, seed=3))
        out = torch.compile(flex_attention)(q, k, v)
        out.sum().backward()
    assert seen, "the user's pass did not run"
    assert q.grad is not None


def test_lowering_without_the_pass_says_what_to_do() -> None:
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class Nothing(CustomGraphPass):
        def __call__(self, graph: torch.fx.Graph) -> None: ...

        def uuid(self) -> str:
            return "nothing"

    torch._dynamo.reset()
    q, k, v, _ = (t.to("neuron").requires_grad_() for t in inputs(torch.float32, seed=4))
    # Options apply around Inductor's compile, after Dynamo traced (and installed the pass): they replace it.
    compiled = torch.compile(flex_attention, options={"pre_grad_custom_pass": Nothing()})
    with pytest.raises(Exception, match="keep the neuron pass in it"):
        compiled(q, k, v)
