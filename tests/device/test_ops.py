"""Eager ops on neuron against the same ops on CPU: views, in-place, out=, resize_, mixing devices."""

from __future__ import annotations

import pytest
import torch


def both(shape: tuple[int, ...] = (4, 6)) -> tuple[torch.Tensor, torch.Tensor]:
    cpu = torch.randn(*shape)
    return cpu, cpu.to("neuron")


def test_views_share_device_storage() -> None:
    cpu, dev = both()
    for f in (lambda t: t.t()[1:3], lambda t: t.view(6, 4), lambda t: t.reshape(24)[::2], lambda t: t.unfold(1, 2, 2),
              lambda t: t.transpose(0, 1).contiguous().view(-1), lambda t: t[:, 2], lambda t: t.expand(2, 4, 6),
              lambda t: t.unsqueeze(0).squeeze(0).narrow(1, 1, 3), lambda t: t.diagonal(), lambda t: t.unbind(0)[1]):
        v = f(dev)
        assert v.device.type == "neuron"
        assert torch.equal(v.cpu(), f(cpu))
    v = dev.view(24)
    assert v.untyped_storage().data_ptr() == dev.untyped_storage().data_ptr()
    v.mul_(0)
    assert dev.abs().sum().item() == 0  # writes through a view reach the base


def test_in_place_and_out() -> None:
    cpu, dev = both()
    cpu.add_(1).mul_(2).clamp_(-1, 3)
    dev.add_(1).mul_(2).clamp_(-1, 3)
    assert torch.equal(dev.cpu(), cpu)
    out_cpu, out_dev = torch.empty(4, 6), torch.empty(4, 6, device="neuron")
    r = torch.add(cpu, 1, out=out_cpu), torch.add(dev, 1, out=out_dev)
    assert r[1] is out_dev and torch.equal(out_dev.cpu(), out_cpu)
    # out= with the wrong size is resized, as on CPU.
    small = torch.empty(0, device="neuron")
    torch.mul(dev, 2, out=small)
    assert small.shape == (4, 6) and torch.equal(small.cpu(), cpu * 2)


def test_resize_() -> None:
    dev = torch.arange(6.0, device="neuron")
    dev.resize_(2, 3)
    assert dev.shape == (2, 3) and torch.equal(dev.cpu(), torch.arange(6.0).view(2, 3))
    dev.resize_(4, 4)
    assert dev.shape == (4, 4) and torch.equal(dev.view(-1)[:6].cpu(), torch.arange(6.0))


def test_structures_and_indexing() -> None:
    cpu, dev = both((5, 7))
    idx = torch.tensor([0, 3, 4])
    assert torch.equal(dev[idx].cpu(), cpu[idx])  # CPU index tensors are accepted, as on CUDA
    assert torch.equal(dev[idx.to("neuron")].cpu(), cpu[idx])
    assert torch.equal(dev[dev > 0].cpu(), cpu[cpu > 0])
    dev[dev < 0] = 0
    cpu[cpu < 0] = 0
    assert torch.equal(dev.cpu(), cpu)
    vals, ids = dev.topk(3, dim=1)
    cvals, cids = cpu.topk(3, dim=1)
    assert torch.equal(vals.cpu(), cvals) and torch.equal(ids.cpu(), cids)
    parts = torch.split(dev, 2, dim=1)
    assert all(torch.equal(p.cpu(), q) for p, q in zip(parts, torch.split(cpu, 2, dim=1), strict=True))
    assert torch.equal(torch.cat([dev, dev]).cpu(), torch.cat([cpu, cpu]))
    assert dev.sum().item() == pytest.approx(cpu.sum().item(), rel=1e-6)


def test_compute_bound_ops_match_cpu() -> None:
    a, b = torch.randn(64, 32), torch.randn(32, 16)
    assert torch.allclose((a.neuron() @ b.neuron()).cpu(), a @ b)
    x, w = torch.randn(2, 3, 16, 16), torch.randn(8, 3, 3, 3)
    assert torch.allclose(torch.nn.functional.conv2d(x.neuron(), w.neuron(), padding=1).cpu(),
                          torch.nn.functional.conv2d(x, w, padding=1), atol=1e-5)


def test_conj_and_neg_bits_survive_copies_and_views() -> None:
    z = torch.randn(4, dtype=torch.complex64)
    zd = z.to("neuron")
    assert torch.equal(zd.conj().cpu(), z.conj())
    assert torch.equal(zd.conj().view(2, 2).cpu(), z.conj().view(2, 2))
    assert torch.equal(torch.view_as_real(zd.conj().resolve_conj()).cpu(), torch.view_as_real(z.conj().resolve_conj()))
    dst = torch.empty(4, dtype=torch.complex64, device="neuron")
    dst.copy_(zd.conj())
    assert torch.equal(dst.cpu(), z.conj())
    neg = zd.conj().imag  # a negative view
    assert torch.equal(neg.cpu(), z.conj().imag)


def test_cross_device_mixing_raises_like_cuda() -> None:
    a = torch.ones(3, device="neuron:0")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*neuron:0.*neuron:1"):
        a + torch.ones(3, device="neuron:1")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*cpu"):
        a + torch.ones(3)
    # 0-dim CPU tensors are scalars and mix, as on CUDA.
    assert torch.equal((a + torch.tensor(2.0)).cpu(), torch.full((3,), 3.0))
    # Copies across cores are explicit and work.
    assert torch.equal(a.to("neuron:1").cpu(), a.cpu())


def test_non_blocking_copies_and_pinned_memory() -> None:
    host = torch.randn(100).pin_memory()
    assert host.is_pinned()
    dev = host.to("neuron", non_blocking=True)
    torch.neuron.synchronize()
    assert torch.equal(dev.cpu(), host)
    back = dev.to("cpu", non_blocking=True)
    torch.neuron.synchronize()
    assert torch.equal(back, host)


def test_printing() -> None:
    x = torch.tensor([[1.5, -2.0], [0.25, 3.0]], device="neuron")
    assert repr(x) == "tensor([[ 1.5000, -2.0000],\n        [ 0.2500,  3.0000]], device='neuron:0')"
    assert "dtype=torch.bfloat16" in repr(x.bfloat16())
    assert repr(torch.tensor([1, 2], device="neuron")) == "tensor([1, 2], device='neuron:0')"


def test_item_and_tolist() -> None:
    x = torch.tensor([1.25, 2.5], device="neuron")
    assert x[1].item() == 2.5 and x.tolist() == [1.25, 2.5]
    assert bool(x.sum() > 3)
