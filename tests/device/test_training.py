"""Autograd and optimizers on neuron against the identical CPU run."""

from __future__ import annotations

import copy

import pytest
import torch


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                               torch.nn.Linear(32, 4))


def test_autograd_matches_cpu() -> None:
    x = torch.randn(5, 7, requires_grad=True)
    xd = x.detach().to("neuron").requires_grad_()
    def f(t: torch.Tensor) -> torch.Tensor:
        return (t.sin() * t.exp()).softmax(-1).log().sum(0).pow(2).mean()
    f(x).backward()
    f(xd).backward()
    assert xd.grad is not None and xd.grad.device.type == "neuron"
    torch.testing.assert_close(xd.grad.cpu(), x.grad)


@pytest.mark.parametrize(
    "make_opt",
    [
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=False),
        lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True),
        lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True),
        lambda p: torch.optim.Adam(p, lr=1e-2, fused=True),
    ],
    ids=["sgd-momentum", "adamw-loop", "adamw-foreach", "adamw-fused", "adam-fused"],
)
def test_optimizer_steps_match_cpu(make_opt) -> None:  # type: ignore[no-untyped-def]
    ref = make_model()
    model = copy.deepcopy(ref).to("neuron")
    opt, ref_opt = make_opt(model.parameters()), make_opt(ref.parameters())
    data = [(torch.randn(8, 16), torch.randint(0, 4, (8,))) for _ in range(4)]
    for x, y in data:
        for m, o, dev in ((ref, ref_opt, "cpu"), (model, opt, "neuron")):
            o.zero_grad()
            loss = torch.nn.functional.cross_entropy(m(x.to(dev)), y.to(dev))
            loss.backward()
            o.step()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert p.device.type == "neuron"
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)
    state = opt.state_dict()["state"][0]
    assert all(v.device.type == "neuron" for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0)


def test_autocast_casts_like_cuda() -> None:
    a, b = torch.randn(8, 8).neuron(), torch.randn(8, 8).neuron()
    with torch.autocast("neuron", dtype=torch.bfloat16):
        mm = a @ b
        lin = torch.nn.functional.linear(a, b)
        sm = torch.softmax(mm, -1)
        ln = torch.nn.functional.layer_norm(mm, (8,))
        loss = torch.nn.functional.mse_loss(mm, a)
        added = a + b
        assert torch.get_autocast_dtype("neuron") == torch.bfloat16
    assert (mm.dtype, lin.dtype) == (torch.bfloat16, torch.bfloat16)
    assert (sm.dtype, ln.dtype, loss.dtype) == (torch.float32, torch.float32, torch.float32)
    assert added.dtype == torch.float32
    torch.testing.assert_close(mm.float().cpu(), (a.cpu().bfloat16() @ b.cpu().bfloat16()).float())


def test_bf16_training_step_matches_cpu_bf16() -> None:
    ref = make_model().bfloat16()
    model = copy.deepcopy(ref).to("neuron")
    x = torch.randn(4, 16).bfloat16()
    ref(x).float().pow(2).mean().backward()
    model(x.neuron()).float().pow(2).mean().backward()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p.grad.cpu(), q.grad)
