"""Compiled models on neuron match eager neuron and CPU: forward, backward, optimizer steps."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from compile_models import MLP, Block, ConvNet, tiny_llama

from torch_neuronx.compile import metrics

Optimizer = Callable[[Any], torch.optim.Optimizer]


def sgd(params: Any) -> torch.optim.Optimizer:
    # Not Adam for models with BatchNorm: a bias before BatchNorm gets a gradient of ~0 whose
    # sign is rounding noise, and Adam turns that noise into a full-size step.
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def adamw(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-2)


def _train(model: torch.nn.Module, inputs: dict[str, Any], loss_of: Callable[[Any], torch.Tensor],
           make_opt: Optimizer, backend: str | None, steps: int = 3
           ) -> tuple[list[torch.Tensor], dict[str, torch.Tensor], dict[str, Any]]:
    """Losses of `steps` optimizer steps, the first step's gradients, and the final state."""
    opt = make_opt(model.parameters())
    run = torch.compile(model, backend=backend) if backend else model
    losses, first_grads = [], {}
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_of(run(**inputs))
        loss.backward()
        if step == 0:
            first_grads = {n: p.grad.detach().cpu() for n, p in model.named_parameters()}
        opt.step()
        losses.append(loss.detach().cpu())
    return losses, first_grads, {k: v.detach().cpu() for k, v in model.state_dict().items()}


def _check_training(make_model: Callable[[], torch.nn.Module], inputs: dict[str, Any],
                    loss_of: Callable[[Any], torch.Tensor], tol: float, make_opt: Optimizer = sgd,
                    same_code_reference: bool = False) -> None:
    """Compiled neuron training against eager neuron (`tol`) and eager CPU (10 x `tol`).

    `same_code_reference` also compiles the model for the CPU (Inductor's C++ backend, the one neuron uses),
    which must give the same bits: the check for models whose compiled-vs-eager rounding an optimizer
    amplifies beyond `tol` on any device (Adam where a gradient is near zero).
    """
    cpu = make_model()
    cpu_init = copy.deepcopy(cpu)
    eager = copy.deepcopy(cpu).to("neuron")
    compiled = copy.deepcopy(cpu).to("neuron")
    on_device = {k: v.to("neuron") if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    ref = _train(cpu, inputs, loss_of, make_opt, backend=None)
    base = _train(eager, on_device, loss_of, make_opt, backend=None)
    got = _train(compiled, on_device, loss_of, make_opt, backend="neuron")
    m = metrics.snapshot()
    references = [(base, tol, tol), (ref, 10 * tol, 10 * tol)]
    if same_code_reference:
        same_code = _train(copy.deepcopy(cpu_init), inputs, loss_of, make_opt, backend="inductor")
        # Parameters after Adam steps get the wider tolerance against eager; the same code must match exactly.
        references = [(same_code, 1e-6, 1e-6), (base, tol, 10 * tol), (ref, 10 * tol, 100 * tol)]
    for expected, rtol, ptol in references:
        torch.testing.assert_close(got[0], expected[0], rtol=rtol, atol=rtol)  # losses
        torch.testing.assert_close(got[1], expected[1], rtol=rtol, atol=rtol)  # gradients
        torch.testing.assert_close(got[2], expected[2], rtol=ptol, atol=ptol)  # parameters and buffers
    assert m["graphs_compiled"] >= 1
    assert m["recompilations"] == 0, m["recompile_reasons"]  # optimizer steps must not recompile


def test_mlp() -> None:
    _check_training(MLP, {"input": torch.randn(8, 16)}, lambda out: out.square().mean(), 1e-5)


def test_conv_net() -> None:
    _check_training(ConvNet, {"x": torch.randn(4, 3, 12, 12)}, lambda out: out.square().mean(), 1e-5)


def test_transformer_block() -> None:
    _check_training(Block, {"x": torch.randn(2, 16, 32)}, lambda out: out.square().mean(), 1e-5)


def test_tiny_llama() -> None:
    ids = torch.randint(0, 256, (2, 16))
    _check_training(tiny_llama, {"input_ids": ids, "labels": ids}, lambda out: out.loss, 2e-5, adamw,
                    same_code_reference=True)


def test_plain_inductor_backend_on_neuron(dev: torch.device) -> None:
    model = MLP().to(dev)
    x = torch.randn(8, 16, device=dev, requires_grad=True)
    out = torch.compile(model)(x)  # the default "inductor" backend
    assert out.device == dev
    torch.testing.assert_close(out, model(x))
    out.sum().backward()
    grad = x.grad.clone()
    x.grad = None
    model(x).sum().backward()
    torch.testing.assert_close(grad, x.grad)


@pytest.mark.skipif(torch.neuron.device_count() < 2, reason="needs two NeuronCores")
def test_graph_on_second_core_allocates_there() -> None:
    x = torch.randn(4, 8, device="neuron:1")
    out = torch.compile(lambda t: (t.sin() + 1).relu() * 2, backend="neuron")(x)
    assert out.device == torch.device("neuron:1")
    torch.testing.assert_close(out, (x.sin() + 1).relu() * 2)
