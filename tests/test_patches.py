"""Each patch of a PyTorch internal (torch_neuronx.patches): that it works, and a check that fails once torch
gains the hook that makes the patch unnecessary (then delete the patch and its check)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import torch

from torch_neuronx import patches


def test_patches_target_this_torch() -> None:
    assert torch.__version__.startswith(patches.TARGET_TORCH), (
        f"torch {torch.__version__}: re-check every patch in torch_neuronx/patches.py, then update TARGET_TORCH")


def test_tensor_printing_of_neuron_tensors() -> None:
    x = torch.tensor([1.5, -2.25, 3.0], device="neuron")
    assert str(x) == "tensor([ 1.5000, -2.2500,  3.0000], device='neuron:0')"
    assert "bfloat16" in repr(x.bfloat16())


def test_tensor_printing_still_has_no_device_hook() -> None:
    source = inspect.getsource(patches.ORIGINALS["tensor_totype"])
    # torch still decides by a fixed list of device types, and asks no device module.
    assert "mps" in source and "privateuse1" not in source.lower() and "get_device_module" not in source


def test_inductor_reindexing_still_skips_only_cpu() -> None:
    from torch_neuronx.compile import inductor

    inductor.register()  # applies the patch, with Inductor

    source = inspect.getsource(patches.ORIGINALS["_try_reindex_pointwise_for_reduction"])
    assert "is_cpu()" in source and "_, groups = reduction_node.group" in source


UNDEFINED = r"""
import os, tempfile, torch, torch_neuronx
import torch.distributed as dist
from torch_neuronx import patches
store = os.path.join(tempfile.mkdtemp(), "store")
patches.ORIGINALS["init_process_group"](init_method="file://" + store, rank=0, world_size=1)
print(dist.get_backend())
"""


def test_init_process_group_still_leaves_backend_undefined() -> None:
    """Unpatched, a group made without a backend while neuron is the accelerator has no named backend."""
    out = subprocess.run([sys.executable, "-c", UNDEFINED], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TORCH_NEURONX_LOG_LEVEL": "ERROR"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "undefined"


PATCHED = UNDEFINED.replace('patches.ORIGINALS["init_process_group"]', "dist.init_process_group") + r"""
t = torch.ones(2)
dist.all_reduce(t)  # a CPU tensor on the default group
print(t.tolist())
"""


def test_init_process_group_without_backend_serves_cpu_and_neuron() -> None:
    out = subprocess.run([sys.executable, "-c", PATCHED], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-2:] == ["neuron", "[1.0, 1.0]"]
