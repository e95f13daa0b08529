"""Allocator statistics, HBM capacity and out-of-memory, against exact byte counts."""

from __future__ import annotations

import pytest
import torch

from torch_neuronx import runtime


def test_stats_count_exact_bytes() -> None:
    base = torch.neuron.memory_allocated()
    torch.neuron.reset_peak_memory_stats()
    a = torch.empty(1000, dtype=torch.float32, device="neuron")
    assert torch.neuron.memory_allocated() - base == 4000
    b = a * 2  # a fresh result adopted from the CPU kernel is charged too
    assert torch.neuron.memory_allocated() - base == 8000
    del a
    assert torch.neuron.memory_allocated() - base == 4000
    assert torch.neuron.max_memory_allocated() - base == 8000
    stats = torch.neuron.memory_stats()
    for key in ("active_bytes.all.peak", "reserved_bytes.all.peak", "num_alloc_retries", "num_ooms"):
        assert key in stats
    assert torch.neuron.memory_reserved() == torch.neuron.memory_allocated()
    free, total = torch.neuron.mem_get_info()
    assert total == 24 << 30 and free == total - torch.neuron.memory_allocated()
    assert torch.accelerator.memory_allocated() == torch.neuron.memory_allocated()
    del b
    assert torch.neuron.memory_allocated() == base


def test_stats_are_per_device() -> None:
    before = torch.neuron.memory_allocated(1)
    x = torch.ones(256, device="neuron:1")
    assert torch.neuron.memory_allocated(1) - before == 1024
    assert x.sum().item() == 256
    del x
    assert torch.neuron.memory_allocated(1) == before


def test_out_of_memory_names_device_and_sizes() -> None:
    with runtime.override_hbm_capacity(1 << 20, device=0):
        keep = torch.empty(200_000, device="neuron")  # 800 KB of 1 MiB
        ooms = torch.neuron.memory_stats()["num_ooms"]
        with pytest.raises(torch.OutOfMemoryError) as info:
            torch.empty(100_000, device="neuron")
        msg = str(info.value)
        assert "neuron:0" in msg and "400000 bytes" in msg and "1.00 MiB" in msg
        assert str(torch.neuron.memory_allocated()) in msg or "in use" in msg
        assert torch.neuron.memory_stats()["num_ooms"] == ooms + 1
        # An op whose result would not fit fails the same way, and nothing leaks.
        used = torch.neuron.memory_allocated()
        with pytest.raises(torch.OutOfMemoryError):
            keep * 2
        assert torch.neuron.memory_allocated() == used
        # The allocator keeps working after the error.
        small = torch.ones(10, device="neuron")
        assert small.sum().item() == 10
        del keep, small


def test_real_model_that_does_not_fit_fails_like_hardware() -> None:
    # 24 GiB per core: a 7B-parameter model in fp32 (28 GB) cannot be placed on one core.
    with pytest.raises(torch.OutOfMemoryError, match="HBM capacity"):
        torch.empty(7_000_000_000, dtype=torch.float32, device="neuron")
    assert torch.neuron.memory_stats()["num_ooms"] >= 1


def test_untyped_storage_resize_charges_memory() -> None:
    t = torch.zeros(100, device="neuron")
    base = torch.neuron.memory_allocated()
    t.untyped_storage().resize_(0)  # FSDP2 frees unsharded parameters this way
    assert torch.neuron.memory_allocated() == base - 400
    t.untyped_storage().resize_(400)
    assert torch.neuron.memory_allocated() == base


def test_memory_summary_is_readable() -> None:
    x = torch.ones(10, device="neuron")
    text = torch.neuron.memory_summary()
    assert "Allocated memory" in text and "HBM capacity 24.00 GiB" in text
    del x
