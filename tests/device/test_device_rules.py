"""CUDA's device rules, operand by operand, and indices checked before they are used.

CPU tensors may sit beside neuron tensors only as 0-dim scalars that are read,
or where CUDA takes them too (advanced-indexing index lists, ...). A CPU tensor
the op would write is refused: it must never be adopted or emptied.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

MISMATCH = "Expected all tensors to be on the same device"


def test_cpu_0dim_out_is_refused_and_left_intact() -> None:
    x = torch.arange(3.0, device="neuron")
    out = torch.full([], 7.0)
    with pytest.raises(RuntimeError, match=MISMATCH):
        torch.add(x.sum(), x.sum(), out=out)
    assert out.data_ptr() != 0 and out.item() == 7.0


def test_cpu_0dim_in_place_target_is_refused_and_left_intact() -> None:
    target = torch.full([], 5.0)
    with pytest.raises(RuntimeError, match=MISMATCH):
        target.add_(torch.ones((), device="neuron"))
    assert target.data_ptr() != 0 and target.item() == 5.0
    for op in (lambda t: t.mul_(torch.ones((), device="neuron")),
               lambda t: torch.clamp_(t, torch.zeros((), device="neuron"))):
        t = torch.full([], 3.0)
        with pytest.raises(RuntimeError, match=MISMATCH):
            op(t)
        assert t.item() == 3.0


def test_nonzero_out_on_cpu_is_refused() -> None:
    """PyTorch's device-generic test_nonzero: a CPU out= for a device input raises."""
    x = torch.tensor([0.0, 1.0, 2.0], device="neuron")
    for out in (torch.empty((), dtype=torch.long), torch.empty(0, dtype=torch.long)):
        with pytest.raises(RuntimeError, match=MISMATCH):
            torch.nonzero(x, out=out)
        assert out.data_ptr() != 0 or out.numel() == 0
    assert torch.equal(torch.nonzero(x).cpu(), torch.nonzero(x.cpu()))


def test_cpu_scalars_are_still_read() -> None:
    x = torch.arange(4.0, device="neuron")
    two = torch.tensor(2.0)
    assert torch.equal((x * two).cpu(), torch.arange(4.0) * 2)
    assert torch.equal(torch.where(x > 1, x, two).cpu(), torch.where(torch.arange(4.0) > 1, torch.arange(4.0), two))
    assert two.item() == 2.0


def test_index_put_with_cpu_values_is_refused_like_cuda() -> None:
    """PyTorch's test_invalid_device (test_indexing.py): CPU indices are fine, CPU values are not."""
    b = torch.zeros(5, device="neuron")
    idx = torch.tensor([0, 1])
    c = torch.tensor([1.0, 2.0])
    for accumulate in (True, False):
        with pytest.raises(RuntimeError, match=MISMATCH):
            torch.index_put_(b, (idx,), c, accumulate=accumulate)
    assert torch.equal(b.cpu(), torch.zeros(5))
    b.index_put_((idx,), c.to("neuron"))  # CPU indices with device values: allowed, as on CUDA
    assert b.cpu().tolist() == [1.0, 2.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("op", [
    lambda x, i: torch.index_select(x, 0, i),
    lambda x, i: x.index_add(0, i, torch.ones(2, device="neuron")),
    lambda x, i: x.index_fill(0, i, 1.0),
    lambda x, i: torch.gather(x, 0, i),
])
def test_index_ops_need_device_index_tensors(op) -> None:  # type: ignore[no-untyped-def]
    """Only advanced-indexing index lists may be CPU tensors; these take the index on the device (as CUDA does)."""
    x = torch.arange(5.0, device="neuron")
    with pytest.raises(RuntimeError, match=MISMATCH):
        op(x, torch.tensor([0, 2]))
    op(x, torch.tensor([0, 2], device="neuron"))


def test_quantized_tensors_are_refused_clearly() -> None:
    x = torch.ones(3, device="neuron")
    with pytest.raises(NotImplementedError, match="quantized"):
        torch.quantize_per_tensor(x, 0.1, 0, torch.qint8)
    q = torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8)
    with pytest.raises(NotImplementedError, match="quantized"):
        q.to("neuron")
    with pytest.raises(NotImplementedError, match="quantized"):
        torch.empty(2, dtype=torch.qint8, device="neuron")


def test_mode_with_out_matches_cpu() -> None:
    cpu = torch.tensor([[1.0, 2.0, 2.0, 3.0], [4.0, 4.0, 1.0, 1.0]])
    dev = cpu.to("neuron")
    values, indices = torch.empty(0, device="neuron"), torch.empty(0, dtype=torch.long, device="neuron")
    got = torch.mode(dev, 1, out=(values, indices))
    want = torch.mode(cpu, 1)
    assert got[0] is values and got[1] is indices
    assert torch.equal(values.cpu(), want.values) and torch.equal(indices.cpu(), want.indices)


# ---------------------------------------------------------------- indices


@pytest.mark.parametrize("index", [-100, -2, 64, 100, 127, 128, 256, 300, 2**31])
def test_bad_device_indices_raise(index: int) -> None:
    with pytest.raises((IndexError, RuntimeError, ValueError)):
        torch.neuron.set_device(index)
    assert torch.neuron.current_device() == 0  # never wrapped onto another core
    with pytest.raises((IndexError, RuntimeError, ValueError)):
        torch.neuron.current_stream(index)
    if -128 <= index < 128:  # torch.Stream's device index is an int8
        with pytest.raises((IndexError, RuntimeError)):
            torch._C._accelerator_getStream(index)


def test_streams_of_valid_cores_work() -> None:
    assert torch.neuron.current_stream(3).device_index == 3
    assert torch._C._accelerator_getStream(-1).device_index == torch.neuron.current_device()


FACTORIES = ["torch.empty(3, device=d)", "torch.zeros(3, device=d)", "torch.ones(3, device=d)",
             "torch.randn(3, device=d)", "torch.arange(3, device=d)", "torch.tensor([1.0], device=d)",
             "torch.full((2,), 1.0, device=d)", "torch.ones(2).to(d)", "torch.eye(2, device=d)",
             "torch.randperm(3, device=d)", "torch.normal(0.0, 1.0, (3,), device=d)",
             "torch.empty_strided((2,), (1,), device=d)", "torch.linspace(0, 1, 3, device=d)"]


def test_factories_on_an_invisible_core_are_refused() -> None:
    """With one visible core, neuron:60 does not exist: nothing is allocated or charged anywhere."""
    code = (
        "import torch, torch_neuronx\n"
        f"cases = {FACTORIES!r}\n"
        "d = 'neuron:60'\n"
        "for c in cases:\n"
        "    try:\n"
        "        eval(c)\n"
        "    except IndexError as e:\n"
        "        assert 'neuron:60' in str(e), e\n"
        "    else:\n"
        "        raise SystemExit('accepted: ' + c)\n"
        "assert torch.neuron.device_count() == 1 and torch.neuron.memory_allocated(0) == 0\n"
        "print('ok')\n"
    )
    env = {**__import__("os").environ, "NEURON_RT_VISIBLE_CORES": "0"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_storage_resize_to_a_negative_size_is_refused() -> None:
    s = torch.empty(4, device="neuron").untyped_storage()
    freed = torch.neuron.memory_stats()["allocated_bytes.all.freed"]
    with pytest.raises((ValueError, RuntimeError)):
        s.resize_(-1)
    assert s.nbytes() == 16
    assert torch.neuron.memory_stats()["allocated_bytes.all.freed"] == freed
    s.resize_(32)
    assert s.nbytes() == 32
