"""Tutorial-style NKI kernels (torch_neuronx.testing.nki_kernels) on neuron tensors, against PyTorch references:
eagerly, compiled through torch_neuronx.nki_op (one custom op, no graph break) and, where they have one, with the
gradient (register_autograd)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_neuronx
import torch_neuronx.nki as nki
from torch_neuronx.testing import nki_kernels as K

DEV = "neuron"


def close(got: torch.Tensor, ref: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-5) -> None:
    assert got.device.type == DEV
    torch.testing.assert_close(got.cpu(), ref.cpu().to(got.dtype), atol=atol, rtol=rtol)


# ---- custom ops around the kernels (the forward launches NKI; backwards are PyTorch)


@torch_neuronx.nki_op("nki_tests::matmul", mutates_args=())
def nki_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return K.matmul_tiled(a.t().contiguous(), b)


def _matmul_setup(ctx, inputs, output):  # type: ignore[no-untyped-def]
    ctx.save_for_backward(*inputs)


def _matmul_backward(ctx, grad):  # type: ignore[no-untyped-def]
    a, b = ctx.saved_tensors
    return grad @ b.t(), a.t() @ grad


nki_matmul.register_autograd(_matmul_backward, setup_context=_matmul_setup)


@torch_neuronx.nki_op("nki_tests::softmax", mutates_args=())
def nki_softmax(x: torch.Tensor) -> torch.Tensor:
    return K.softmax_rows(x)


def _softmax_setup(ctx, inputs, output):  # type: ignore[no-untyped-def]
    ctx.save_for_backward(output)


def _softmax_backward(ctx, grad):  # type: ignore[no-untyped-def]
    (y,) = ctx.saved_tensors
    return y * (grad - (grad * y).sum(-1, keepdim=True))


nki_softmax.register_autograd(_softmax_backward, setup_context=_softmax_setup)


@torch_neuronx.nki_op("nki_tests::rms_norm", mutates_args=())
def nki_rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return K.rms_norm(x, w)


def _rms_setup(ctx, inputs, output):  # type: ignore[no-untyped-def]
    ctx.save_for_backward(*inputs)


def _rms_backward(ctx, grad):  # type: ignore[no-untyped-def]
    x, w = ctx.saved_tensors
    with torch.enable_grad():
        xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
        y = xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6) * wr
        return torch.autograd.grad(y, (xr, wr), grad)


nki_rms_norm.register_autograd(_rms_backward, setup_context=_rms_setup)


@torch_neuronx.nki_op("nki_tests::add", mutates_args=())
def nki_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return K.tiled_add[2](a, b)


nki_add.register_autograd(lambda ctx, g: (g, g))


@torch_neuronx.nki_op("nki_tests::attention", mutates_args=())
def nki_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return K.attention_fwd(q, k, v, True)


def _attention_setup(ctx, inputs, output):  # type: ignore[no-untyped-def]
    ctx.save_for_backward(*inputs)


def _attention_backward(ctx, grad):  # type: ignore[no-untyped-def]  # the forward kernel's gradient, by recompute
    with torch.enable_grad():
        q, k, v = (t.detach().requires_grad_() for t in ctx.saved_tensors)
        out = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]
        return torch.autograd.grad(out, (q, k, v), grad)


nki_attention.register_autograd(_attention_backward, setup_context=_attention_setup)


@torch_neuronx.nki_op("nki_tests::matmul_variant", mutates_args=())
def nki_matmul_variant(lhs_t: torch.Tensor, rhs: torch.Tensor, variant: int) -> torch.Tensor:
    kernel = (K.matmul_basic, K.matmul_tiled, K.matmul_hoisted, K.matmul_blocked)[variant]
    return kernel(lhs_t, rhs)


@torch_neuronx.nki_op("nki_tests::layout", mutates_args=())
def nki_layout(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return K.transpose_2d(x), K.avg_pool(x.reshape(128, 16, -1), 4)


@torch_neuronx.nki_op("nki_tests::scan", mutates_args=())
def nki_scan(decay: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    return K.linear_scan(decay, inputs, 128)


def compiled(fn):  # type: ignore[no-untyped-def]
    torch._dynamo.reset()
    return torch.compile(fn, backend="neuron", fullgraph=True)


# ---- the kernels


def test_tiled_add_over_a_launch_grid_eager_compiled_and_grad() -> None:
    a = torch.randn(256, 1024, device=DEV, requires_grad=True)
    b = torch.randn(256, 1024, device=DEV)
    out = nki_add(a, b)
    close(out, a.detach().cpu() + b.cpu(), 0, 0)  # exact: one fp32 add per element
    out.sum().backward()
    close(a.grad, torch.ones(256, 1024))
    close(compiled(lambda x, y: nki_add(x, y) * 2)(a.detach(), b), 2 * (a.detach().cpu() + b.cpu()), 0, 0)


def test_transpose_2d_is_exact_in_every_dtype() -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.int32):
        x = (torch.randn(256, 384) * 100).to(dtype).to(DEV)
        close(K.transpose_2d(x), x.cpu().T, 0, 0)
    x = torch.randn(128, 256, device=DEV)
    torch._dynamo.reset()  # a bare kernel call in compiled code runs eagerly, between two graphs
    close(torch.compile(lambda t: K.transpose_2d(t * 2) + 1, backend="neuron")(x), x.cpu().T * 2 + 1)


def test_transpose_and_pool_compiled_in_one_graph() -> None:
    x = torch.randn(128, 256, device=DEV)
    t, p = compiled(lambda a: tuple(o * 1 for o in nki_layout(a)))(x)
    close(t, x.cpu().T, 0, 0)
    close(p, F.avg_pool2d(x.cpu().reshape(128, 16, 16), 4))


def test_avg_pool_with_an_access_pattern() -> None:
    x = torch.randn(64, 12, 20, device=DEV)
    for k in (2, 4):
        close(K.avg_pool(x[:, :12 // k * k, :20 // k * k].contiguous(), k),
              F.avg_pool2d(x.cpu()[:, :12 // k * k, :20 // k * k], k))


@pytest.mark.parametrize("kernel", [K.matmul_tiled, K.matmul_hoisted, K.matmul_blocked], ids=lambda k: k.name)
def test_tiled_matmuls_accumulate_in_fp32_psum(kernel: nki.Kernel) -> None:
    lhs_t = torch.randn(384, 256, dtype=torch.bfloat16, device=DEV)
    rhs = torch.randn(384, 1024, dtype=torch.bfloat16, device=DEV)
    out = kernel(lhs_t, rhs)
    assert out.dtype == torch.bfloat16 and out.shape == (256, 1024)
    # fp32 accumulation, one rounding to bf16 at the end: within one bf16 ulp of the fp32 product
    ref = lhs_t.cpu().float().T @ rhs.cpu().float()
    torch.testing.assert_close(out.cpu().float(), ref, atol=1e-4, rtol=2 ** -8)


def test_tiled_matmul_is_one_float32_add_per_instruction_bit_for_bit() -> None:
    # AWS nc_matmul: "the matmul accumulation and results are always in float32", and a contraction over 128 is
    # split into instructions whose output tiles accumulate into one PSUM tile. The interpreter keeps that grouping
    # (issue 31, speed: no fusing of a group's K-tiles into one GEMM): each instruction's float32 product tile is
    # added to PSUM in order, and the tile is rounded to bfloat16 once when copied out.
    lhs_t = torch.randn(384, 256, dtype=torch.bfloat16)
    rhs = torch.randn(384, 1024, dtype=torch.bfloat16)
    out = K.matmul_tiled(lhs_t.to(DEV), rhs.to(DEV)).cpu()
    ref = torch.empty(256, 1024, dtype=torch.bfloat16)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the interpreter runs: the same GEMM kernel, so the same bits
    try:
        for i in range(2):
            for j in range(2):
                psum = torch.zeros(128, 512)
                for kk in range(3):
                    stationary = lhs_t[kk * 128:(kk + 1) * 128, i * 128:(i + 1) * 128].float()
                    moving = rhs[kk * 128:(kk + 1) * 128, j * 512:(j + 1) * 512].float()
                    psum += stationary.T @ moving
                ref[i * 128:(i + 1) * 128, j * 512:(j + 1) * 512] = psum
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(out, ref)  # one GEMM over the whole contraction differs in a few elements of random data


def test_every_matmul_variant_compiled() -> None:
    lhs_t = torch.randn(256, 256, dtype=torch.bfloat16, device=DEV)
    rhs = torch.randn(256, 1024, dtype=torch.bfloat16, device=DEV)
    ref = lhs_t.cpu().float().T @ rhs.cpu().float()
    outs = compiled(lambda a, b: [nki_matmul_variant(a, b, v) for v in (1, 2, 3)])(lhs_t, rhs)
    for out in outs:
        torch.testing.assert_close(out.cpu().float(), ref, atol=1e-4, rtol=2 ** -8)
    a, b = lhs_t[:128, :64].contiguous(), rhs[:128, :512].contiguous()
    small = compiled(lambda x, y: nki_matmul_variant(x, y, 0))(a, b)
    torch.testing.assert_close(small.cpu().float(), a.cpu().float().T @ b.cpu().float(), atol=1e-4, rtol=2 ** -8)


def test_basic_matmul_is_one_tensor_engine_instruction() -> None:
    lhs_t, rhs = torch.randn(128, 64, device=DEV), torch.randn(128, 512, device=DEV)
    close(K.matmul_basic(lhs_t, rhs), lhs_t.cpu().T @ rhs.cpu(), 1e-4, 1e-5)
    assert nki.last_report().instructions["nisa.nc_matmul"] == 1


def test_matmul_op_compiles_and_differentiates() -> None:
    a = torch.randn(128, 256, device=DEV, requires_grad=True)
    b = torch.randn(256, 512, device=DEV, requires_grad=True)
    out = nki_matmul(a, b)
    close(out, a.detach().cpu() @ b.detach().cpu(), 1e-4, 1e-5)
    out.pow(2).sum().backward()
    ar, br = a.detach().cpu().requires_grad_(), b.detach().cpu().requires_grad_()
    (ar @ br).pow(2).sum().backward()
    close(a.grad, ar.grad, 1e-3, 1e-4)
    close(b.grad, br.grad, 1e-3, 1e-4)
    close(compiled(lambda x, y: torch.relu(nki_matmul(x, y)))(a.detach(), b.detach()),
          torch.relu(a.detach().cpu() @ b.detach().cpu()), 1e-4, 1e-5)


def test_softmax_eager_compiled_and_grad() -> None:
    x = torch.randn(256, 300, device=DEV, requires_grad=True)
    y = nki_softmax(x)
    close(y, torch.softmax(x.detach().cpu(), -1), 1e-6, 1e-5)
    g = torch.randn(256, 300)
    y.backward(g.to(DEV))
    xr = x.detach().cpu().requires_grad_()
    torch.softmax(xr, -1).backward(g)
    close(x.grad, xr.grad, 1e-6, 1e-5)
    close(compiled(nki_softmax)(x.detach() * 3), torch.softmax(x.detach().cpu() * 3, -1), 1e-6, 1e-5)


def test_rms_norm_eager_compiled_and_grad() -> None:
    x = torch.randn(256, 96, device=DEV, requires_grad=True)
    w = torch.randn(96, device=DEV, requires_grad=True)

    def ref(xx: torch.Tensor, ww: torch.Tensor) -> torch.Tensor:
        return xx * torch.rsqrt(xx.pow(2).mean(-1, keepdim=True) + 1e-6) * ww

    y = nki_rms_norm(x, w)
    close(y, ref(x.detach().cpu(), w.detach().cpu()))
    y.sum().backward()
    xr, wr = x.detach().cpu().requires_grad_(), w.detach().cpu().requires_grad_()
    ref(xr, wr).sum().backward()
    close(x.grad, xr.grad, 1e-4, 1e-4)
    close(w.grad, wr.grad, 1e-4, 1e-4)
    close(compiled(nki_rms_norm)(x.detach(), w.detach()), ref(x.detach().cpu(), w.detach().cpu()))


@pytest.mark.parametrize("causal", [False, True])
def test_fused_attention_forward_matches_sdpa(causal: bool) -> None:
    q, k, v = (torch.randn(1024, 64, device=DEV) for _ in range(3))
    ref = F.scaled_dot_product_attention(q.cpu()[None], k.cpu()[None], v.cpu()[None], is_causal=causal)[0]
    close(K.attention_fwd(q, k, v, causal), ref, 1e-5, 1e-4)
    report = nki.last_report()
    assert report.psum_peak_banks <= report.psum_banks and not report.over_budget


def test_fused_attention_in_bf16_and_compiled() -> None:
    q, k, v = (torch.randn(512, 128, device=DEV, dtype=torch.bfloat16) for _ in range(3))
    ref = F.scaled_dot_product_attention(*(t.cpu().float()[None] for t in (q, k, v)), is_causal=True)[0]
    close(nki_attention(q, k, v), ref, 2e-2, 2e-2)
    close(compiled(nki_attention)(q, k, v), ref, 2e-2, 2e-2)


def test_fused_attention_gradient() -> None:
    q, k, v = (torch.randn(512, 64, device=DEV, requires_grad=True) for _ in range(3))
    g = torch.randn(512, 64)
    nki_attention(q, k, v).backward(g.to(DEV))
    qr, kr, vr = (t.detach().cpu().requires_grad_() for t in (q, k, v))
    F.scaled_dot_product_attention(qr[None], kr[None], vr[None], is_causal=True)[0].backward(g)
    for got, ref in ((q.grad, qr.grad), (k.grad, kr.grad), (v.grad, vr.grad)):
        close(got, ref, 1e-4, 1e-4)


def test_mamba_style_scan_carries_state_across_chunks() -> None:
    decay = torch.rand(256, 512, device=DEV)
    inputs = torch.randn(256, 512, device=DEV)
    h = torch.zeros(256)
    ys = []
    for t in range(512):  # the recurrence, step by step, in fp32 as the Vector Engine runs it
        h = decay.cpu()[:, t] * h + inputs.cpu()[:, t]
        ys.append(h)
    ref = torch.stack(ys, 1)
    close(nki_scan(decay, inputs), ref, 1e-5, 1e-5)
    close(compiled(nki_scan)(decay, inputs), ref, 1e-5, 1e-5)


def test_compiled_graph_holds_one_custom_op_and_no_break() -> None:
    graphs = []

    def backend(gm, inputs):  # type: ignore[no-untyped-def]
        graphs.append(gm)
        return gm

    torch._dynamo.reset()
    x = torch.randn(128, 512, device=DEV)
    out = torch.compile(lambda t: nki_softmax(t) * 2, backend=backend, fullgraph=True)(x)
    close(out, 2 * torch.softmax(x.cpu(), -1), 1e-6, 1e-5)
    assert len(graphs) == 1
    ops = [n.target for n in graphs[0].graph.nodes if "nki_tests" in str(n.target)]
    assert ops == [torch.ops.nki_tests.softmax.default]
