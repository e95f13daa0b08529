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
    import torch_neuronx

    torch_neuronx.clear_op_tracking()
    x = torch.tensor([1.5, -2.25, 3.0], device="neuron")
    assert str(x) == "tensor([ 1.5000, -2.2500,  3.0000], device='neuron:0')"
    assert "bfloat16" in repr(x.bfloat16())
    big = torch.arange(5000, dtype=torch.float32).reshape(50, 100)
    assert repr(big.to("neuron")) == repr(big)[:-1] + ", device='neuron:0')"
    wide = torch.tensor([1 / 3, 1e-20], dtype=torch.float64)
    assert repr(wide.to("neuron")) == "tensor([3.3333e-01, 1.0000e-20], device='neuron:0', dtype=torch.float64)"
    # Printing is not the user's work: no float64 op runs on the device, so nothing counts as a fallback.
    assert torch_neuronx.get_fallback_ops() == []


def test_tensor_printing_still_has_no_device_hook() -> None:
    import torch._tensor_str as tensor_str

    source = inspect.getsource(tensor_str.tensor_totype)
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
dist.destroy_process_group()  # as PyTorch asks: without it, Gloo's exit can abort (docs/distributed.md, limits)
"""


def test_init_process_group_without_backend_serves_cpu_and_neuron() -> None:
    out = subprocess.run([sys.executable, "-c", PATCHED], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-2:] == ["neuron", "[1.0, 1.0]"]


def test_flex_attention_still_refuses_unknown_devices() -> None:
    torch.empty(1, device="neuron")  # the device initialises: the flex patch is applied then
    import torch.nn.attention.flex_attention as flex_module

    assert getattr(flex_module._validate_device, "_neuron_aware", False)
    source = inspect.getsource(patches.ORIGINALS["flex_validate_device"])
    # torch still checks a fixed set of device types, with no registration to extend it.
    assert "supported_devices" in source and "privateuse1" not in source.lower()
    meta = torch.empty(1, 2, 4, 8, device="meta")
    try:
        patches.ORIGINALS["flex_validate_device"](meta, meta, meta)
    except ValueError as exc:
        assert "only supported on" in str(exc)
    else:
        raise AssertionError("torch's flex_attention now accepts other devices: drop patch_flex_attention")


def test_flex_marking_is_dynamos_assume_constant_result() -> None:
    # compile.flex_support is marked as torch._dynamo.assume_constant_result would, without importing Dynamo.
    import torch._dynamo

    def probe() -> None: ...

    marked = torch._dynamo.assume_constant_result(probe)
    assert vars(marked) == {"_dynamo_marked_constant": True}


def test_flex_lowering_still_sends_other_devices_to_triton() -> None:
    from torch_neuronx.compile import flex

    flex.install()
    source = inspect.getsource(patches.ORIGINALS["flex_attention_lowering"])
    assert 'get_device().type == "cpu"' in source and "lower_cpu" in source
    assert "cuda path if device is not cpu or mps" in source


def test_check_hooks_still_missing_from_torch() -> None:
    """`torch-neuronx check` wraps torch.autograd.backward, torch.save and DeviceMesh.__init__ (patch_for_check)
    because torch has no hook for a backward call's root, for serialization, or for mesh creation."""
    import torch.autograd.graph
    import torch.serialization
    from torch.distributed import device_mesh

    hooks = [n for n in dir(torch.autograd.graph) if "register" in n and not n.startswith("_")]
    assert hooks == ["register_multi_grad_hook"], hooks  # per-tensor hooks only, none per backward call
    assert not [n for n in dir(torch.autograd) if "hook" in n.lower() and "saved_tensors" not in n]  # nor per grad call
    assert not [n for n in dir(torch.serialization) if "hook" in n.lower()]
    import safetensors.torch

    assert not [n for n in dir(safetensors.torch) if "hook" in n.lower() or "register" in n.lower()]
    public = [n for n in dir(device_mesh) if not n.startswith("_")]
    assert not [n for n in public if "register" in n.lower() or "hook" in n.lower()], public


def test_check_patches_pass_calls_through_and_report() -> None:
    """In a child process with the probe's patches: results unchanged, and each observer sees its call."""
    code = r"""
import os, tempfile, torch
from torch_neuronx import patches
seen = []
patches.patch_for_check(lambda t, g, src: seen.append(src), lambda obj, f, kind: seen.append((kind, f)),
                        lambda mesh: seen.append("mesh"))
patches.patch_for_check(None, None, None)  # idempotent: the second call changes nothing
x = torch.ones(3, requires_grad=True)
(x * 2).sum().backward()
(g,) = torch.autograd.grad((x * 3).sum(), x)
path = os.path.join(tempfile.mkdtemp(), "t.pt")
torch.save({"x": x.detach()}, path)
from safetensors.torch import load_file, save_file
save_file({"x": x.detach()}, path + ".safetensors")
assert torch.equal(torch.load(path)["x"], torch.ones(3)) and torch.equal(x.grad, torch.full((3,), 2.0))
assert torch.equal(g, torch.full((3,), 3.0)) and torch.equal(load_file(path + ".safetensors")["x"], torch.ones(3))
print(seen[0], seen[1], seen[2] == ("torch.save", path), seen[3] == ("safetensors", path + ".safetensors"), len(seen))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["backward", "grad", "True", "True", "4"]
