"""Training loops shared by the rank-side jobs: single-process references and their distributed twins.

The reference sees the whole global batch (every data-parallel part
concatenated) in one process on CPU; data-parallel ranks each see one part.
With a mean loss and equal parts, the averaged gradients are the same.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from _models import batch, loss_fn, make_model
from torch import nn

LR = 1e-2


def optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)


def global_batch(step: int, parts: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids, targets = zip(*(batch(step, p) for p in range(parts)), strict=True)
    return torch.cat(ids), torch.cat(targets)


def reference_fp32(steps: int, parts: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Losses and final weights of single-process training on the global batch."""
    model = make_model()
    opt = optimizer(model)
    losses = []
    for step in range(steps):
        ids, targets = global_batch(step, parts)
        loss = loss_fn(model(ids), targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def reference_bf16(steps: int, parts: int, device: torch.device) -> tuple[list[float], dict[str, torch.Tensor]]:
    """What FSDP2 with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) computes, in one process.

    fp32 master weights; each part's forward and backward in a bf16 copy; the
    bf16 gradients averaged in fp32; the optimizer steps the master. On
    `device`: in bf16 a device may pick other kernels than CPU (attention).
    """
    master = make_model().to(device)
    opt = optimizer(master)
    losses = []
    for step in range(steps):
        grads = [torch.zeros_like(p) for p in master.parameters()]
        part_losses = []
        for part in range(parts):
            low = copy.deepcopy(master).to(torch.bfloat16)
            ids, targets = batch(step, part)
            loss = loss_fn(low(ids.to(device)), targets.to(device))
            loss.backward()
            part_losses.append(loss.item())
            for g, p in zip(grads, low.parameters(), strict=True):
                g += p.grad.float()
        for p, g in zip(master.parameters(), grads, strict=True):
            p.grad = g / parts
        opt.step()
        opt.zero_grad()
        losses.append(sum(part_losses) / parts)
    return losses, {n: p.detach().cpu() for n, p in master.named_parameters()}


def train(model: nn.Module, steps: int, part: int, device: torch.device,
          average: Callable[[torch.Tensor], torch.Tensor]) -> tuple[list[float], torch.optim.Optimizer]:
    """Train a parallelised model on its data-parallel part; losses averaged over the parts."""
    opt = optimizer(model)
    losses = []
    for step in range(steps):
        ids, targets = batch(step, part)
        loss = loss_fn(model(ids.to(device)), targets.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(average(loss.detach().clone()).item())
    return losses, opt


def full_params(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's parameters gathered whole onto CPU (DTensors or plain tensors)."""
    out = {}
    for n, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[n] = full.detach().cpu()
    return out


def assert_same_training(got: tuple[list[float], dict[str, torch.Tensor]],
                         want: tuple[list[float], dict[str, torch.Tensor]], loss_tol: float, weight_tol: float) -> str:
    """Losses and weights within tolerance; returns the largest differences."""
    (losses, weights), (ref_losses, ref_weights) = got, want
    assert len(losses) == len(ref_losses)
    loss_diff = max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True))
    assert loss_diff <= loss_tol, f"losses {losses} vs reference {ref_losses}"
    assert weights.keys() == ref_weights.keys(), (sorted(weights), sorted(ref_weights))
    worst, where = 0.0, ""
    for n, w in weights.items():
        d = (w.float() - ref_weights[n].float()).abs().max().item()
        if d > worst:
            worst, where = d, n
    assert worst <= weight_tol, f"weights differ by {worst:.3g} at {where} (allowed {weight_tol})"
    assert losses[-1] < losses[0], f"did not learn: {losses}"
    rounded = [round(v, 4) for v in losses]
    return f"max loss diff {loss_diff:.2e}, max weight diff {worst:.2e} ({where}); losses {rounded}"
