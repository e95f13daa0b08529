"""Will it fit? A Hugging Face model whose weights fill 90% of a core loads with device_map="neuron"; at 110%
it fails with the out-of-memory report, as it would on the hardware."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from torch_neuronx.testing import hf as tiny_hf
from torch_neuronx.testing.workers import BASE_ENV

LOAD = r"""
import sys, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], device_map="neuron", dtype=torch.bfloat16)
weights = sum(p.numel() * p.element_size() for p in model.parameters())
print(weights, torch.neuron.memory_allocated(), torch.neuron.memory_reserved(),
      torch.neuron.get_device_properties().total_memory)
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    import torch

    path = tmp_path_factory.mktemp("sized_llama")
    # ~200 MB of bf16 weights: the allocator's segment granularity (2-20 MiB) is small beside it.
    model = tiny_hf.llama(256, hidden=1024, layers=6, vocab=32000, heads=16, kv_heads=4).to(torch.bfloat16)
    model.save_pretrained(path)
    return path, sum(p.numel() * p.element_size() for p in model.parameters())


def _load(path: Path, capacity: int) -> subprocess.CompletedProcess[str]:
    env = {**BASE_ENV, "HF_HUB_OFFLINE": "1", "TORCH_NEURONX_HBM_PER_CORE": str(capacity)}
    return subprocess.run([sys.executable, "-c", LOAD, str(path)], env=env, capture_output=True, text=True,
                          timeout=300)


def test_weights_filling_90_percent_of_the_core_load(model_dir: tuple[Path, int]) -> None:
    path, weights = model_dir
    r = _load(path, int(weights / 0.9))
    assert r.returncode == 0, r.stderr[-3000:]
    loaded, allocated, reserved, total = map(int, r.stdout.split())
    assert loaded == weights and allocated >= weights and reserved <= total == int(weights / 0.9)


def test_weights_at_110_percent_of_the_core_fail_with_the_report(model_dir: tuple[Path, int]) -> None:
    path, weights = model_dir
    r = _load(path, int(weights / 1.1))
    assert r.returncode != 0
    for part in ("OutOfMemoryError", "neuron:0 out of memory", "of HBM", "allocated to tensors",
                 "reserved by the allocator but unallocated", "shard the model over more cores",
                 "TORCH_NEURONX_HBM_PER_CORE"):
        assert part in r.stderr, (part, r.stderr[-3000:])
    assert "Segmentation" not in r.stderr
