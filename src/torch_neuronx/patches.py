"""Every patch of a PyTorch internal, in one place.

The plugin uses PyTorch's registration APIs wherever they exist (PrivateUse1
hooks, guard, allocator, dispatcher kernels, c10d backends, Dynamo backends,
Inductor device backends). What follows is what they do not reach. Each
patch names the torch version it was written against, why torch offers no
hook, and the test in ``tests/test_patches.py`` that fails once torch gains
the hook (then the patch goes). :func:`apply` runs at ``import torch_neuronx``;
every patch is idempotent and checks what it replaces.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

TARGET_TORCH = "2.13"
BACKEND = "neuron"

# What each patch replaced, by name, so that tests can call the original.
ORIGINALS: dict[str, Callable[..., Any]] = {}


def apply() -> None:
    """Apply the patches needed at import (idempotent); Inductor's waits for Inductor (compile/inductor.py)."""
    patch_tensor_printing()
    patch_init_process_group()


# ---------------------------------------------------------------- printing
# torch._tensor_str formats a tensor by running ops on it where it lives
# (masked_select, abs, ceil, ...) after widening it to float64, except on the
# devices it lists as lacking FP64 (MPS, MAIA, some XPUs); the list has no
# registration hook. On neuron those float64 ops are CPU fallbacks, so
# printing a tensor would report fallbacks and warn. Format a host copy of
# neuron tensors instead: the text is exactly the CPU's, and the device suffix
# still comes from the tensor itself (torch._tensor_str._str_intern).
# Test: test_tensor_printing_still_has_no_device_hook.


def patch_tensor_printing() -> None:
    import torch._tensor_str as tensor_str

    format_data = tensor_str._tensor_str
    if getattr(format_data, "_neuron_aware", False):
        return
    ORIGINALS["_tensor_str"] = format_data

    def _tensor_str(self: torch.Tensor, indent: int) -> str:
        if self.device.type == BACKEND:
            self = self.detach().cpu()
        return format_data(self, indent)

    _tensor_str._neuron_aware = True  # type: ignore[attr-defined]
    tensor_str._tensor_str = _tensor_str


# ---------------------------------------------------------------- c10d default
# init_process_group() without a backend builds a group for the accelerator
# alone and names its backend "undefined", so CPU tensors (object
# collectives, distributed-checkpoint metadata) have no backend on it; torch
# has no hook to name the default backend of a PrivateUse1 accelerator. The
# "neuron" backend serves CPU and neuron tensors, so name it when the backend
# is left out and neuron is the accelerator (or the device_id).
# torch.distributed.device_mesh imported the function by name: both bindings
# are replaced. Test: test_init_process_group_still_leaves_backend_undefined.


def patch_init_process_group() -> None:
    if not torch.distributed.is_available():
        return
    import torch.distributed as dist
    import torch.distributed.device_mesh as device_mesh
    from torch.distributed import distributed_c10d

    original = distributed_c10d.init_process_group
    if getattr(original, "_neuron_default", False):
        return
    ORIGINALS["init_process_group"] = original
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> None:
        bound = signature.bind_partial(*args, **kwargs)
        if bound.arguments.get("backend") is None and _neuron_is_default(bound.arguments.get("device_id")):
            bound.arguments["backend"] = BACKEND
        return original(*bound.args, **bound.kwargs)

    init_process_group._neuron_default = True  # type: ignore[attr-defined]
    for module in (dist, distributed_c10d, device_mesh):
        if getattr(module, "init_process_group", None) is original:
            module.init_process_group = init_process_group  # type: ignore[attr-defined]


def _neuron_is_default(device_id: object) -> bool:
    if device_id is not None:
        kind = device_id.type if isinstance(device_id, torch.device) else torch.device(device_id).type  # type: ignore[arg-type]
        return kind == BACKEND
    return torch._C._get_accelerator().type == BACKEND


# ---------------------------------------------------------------- Inductor re-indexing
# Inductor's scheduler re-indexes a pointwise node to a reduction's iteration
# domain after fusion (Scheduler._try_reindex_pointwise_for_reduction). It
# skips CPU nodes ("CPU reindexing is not validated yet") and takes every
# other device for a SIMD (GPU) backend, whose nodes group as (numel,
# rnumel); neuron runs the C++ (CPU) backend, whose groups are size tuples,
# and the pass fails on them. The only switch, config.loop_reindexing_after_
# fusion, is process-wide: turning it off would change CPU compiles too. So
# neuron nodes are skipped as CPU nodes are, in every compile (the "neuron"
# backend and plain torch.compile on neuron tensors alike).
# Applied by compile/inductor.py when Inductor is loaded.
# Test: test_inductor_reindexing_still_skips_only_cpu.


def patch_inductor_reindexing() -> None:
    from torch._inductor.scheduler import Scheduler

    original = Scheduler._try_reindex_pointwise_for_reduction
    if getattr(original, "_neuron_aware", False):
        return
    ORIGINALS["_try_reindex_pointwise_for_reduction"] = original

    @functools.wraps(original)
    def _try_reindex_pointwise_for_reduction(self: Any, node1: Any, node2: Any) -> bool:
        if _on_neuron(node1) or _on_neuron(node2):
            return False
        return original(self, node1, node2)

    _try_reindex_pointwise_for_reduction._neuron_aware = True  # type: ignore[attr-defined]
    Scheduler._try_reindex_pointwise_for_reduction = _try_reindex_pointwise_for_reduction  # type: ignore[method-assign]


def _on_neuron(node: Any) -> bool:
    device = node.get_device()
    return device is not None and device.type == BACKEND


# ---------------------------------------------------------------- FlexAttention
# torch.nn.attention.flex_attention._validate_device accepts a fixed set of
# device types ({"cuda", "cpu", "xpu", "hpu", "mps"}, a local literal) and
# raises for any other: no registration reaches it. The HOP underneath runs
# on any device (its dense forward and backward never look at the device),
# so neuron tensors are let through; the CPU-only refusal of backward is not
# copied, because neuron's backward works (the dense one, or the compiled
# rewrite in compile/flex.py). When Dynamo traces a flex call on neuron, the
# check also adds compile/flex.py's pass to Inductor, at trace time, through
# torch_neuronx.compile.flex_support (marked as Dynamo's
# assume_constant_result marks functions, so Dynamo calls it while tracing
# rather than tracing into it).
# Queued by torch_neuronx/__init__.py to run when the device initialises:
# flex needs neuron tensors, and importing the module at `import torch` would
# cost every process.
# Test: test_flex_attention_still_refuses_unknown_devices.
#
# The HOP also has autocast kernels for CPU and CUDA only, and does not fall
# through AutocastPrivateUse1, so under torch.autocast("neuron") it found no
# kernel. That one is a registration (py_impl), not a patch: it casts q, k, v
# to the autocast dtype as the CPU/CUDA kernels do.


def patch_flex_attention(compile_support: Callable[[], object]) -> None:
    """`compile_support` runs when Dynamo traces a neuron flex call (compile.flex_support: adds the pass)."""
    import torch.nn.attention.flex_attention as flex_module
    from torch._C import DispatchKey
    from torch._higher_order_ops.flex_attention import flex_attention as flex_hop

    if DispatchKey.AutocastPrivateUse1 not in flex_hop.py_kernels:
        flex_hop.py_impl(DispatchKey.AutocastPrivateUse1)(_flex_attention_autocast)

    original = flex_module._validate_device
    if getattr(original, "_neuron_aware", False):
        return
    ORIGINALS["flex_validate_device"] = original

    @functools.wraps(original)
    def _validate_device(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        if query.device.type != BACKEND:
            return original(query, key, value)
        if torch.compiler.is_compiling():
            compile_support()
        return None

    _validate_device._neuron_aware = True  # type: ignore[attr-defined]
    flex_module._validate_device = _validate_device


def _flex_attention_autocast(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any,
                             **kwargs: Any) -> Any:
    from torch._C import DispatchKey, DispatchKeySet, _ExcludeDispatchKeyGuard
    from torch._higher_order_ops.flex_attention import flex_attention as flex_hop

    dtype = torch.get_autocast_dtype(query.device.type)

    def cast(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t

    with _ExcludeDispatchKeyGuard(DispatchKeySet(DispatchKey.AutocastPrivateUse1)):
        return flex_hop(cast(query), cast(key), cast(value), *args, **kwargs)


# Inductor's flex lowering sends every device but "cpu" and "mps" to Triton.
# The lowering table has no per-device registration, so neuron's entry is
# wrapped: calls that need no log-sum-exp go to CPU's C++ template (neuron
# runs Inductor's C++ backend); any other reaching it means compile/flex.py's
# pass was removed from config.pre_grad_custom_pass, and the error says so
# rather than "No module named 'triton'". Applied by compile/flex.install.
# Test: test_flex_lowering_still_sends_other_devices_to_triton.


def patch_flex_lowering() -> None:
    from torch._inductor import lowering

    forward = torch.ops.higher_order.flex_attention
    backward = torch.ops.higher_order.flex_attention_backward
    original = lowering.lowerings[forward]
    if getattr(original, "_neuron_aware", False):
        return
    ORIGINALS["flex_attention_lowering"] = original
    original_backward = lowering.lowerings[backward]
    ORIGINALS["flex_attention_backward_lowering"] = original_backward

    @functools.wraps(original)
    def flex_attention(query: Any, key: Any, value: Any, subgraph: Any, block_mask: Any, scale: Any,
                       kernel_options: dict[str, Any], *args: Any) -> Any:
        if query.get_device().type != BACKEND:
            return original(query, key, value, subgraph, block_mask, scale, kernel_options, *args)
        from torch._inductor.kernel.flex.flex_cpu import check_cpu_supported, lower_cpu

        if kernel_options.get("OUTPUT_LOGSUMEXP", True) or any(args[:2]) or not check_cpu_supported():
            raise _flex_pass_missing()  # the pass sends these to the dense path (compile/flex.py)
        return lower_cpu(query, key, value, subgraph, block_mask, scale, kernel_options, *args)

    @functools.wraps(original_backward)
    def flex_attention_backward(query: Any, *args: Any, **kwargs: Any) -> Any:
        if query.get_device().type != BACKEND:
            return original_backward(query, *args, **kwargs)
        raise _flex_pass_missing()

    flex_attention._neuron_aware = True  # type: ignore[attr-defined]
    lowering.lowerings[forward] = flex_attention
    lowering.lowerings[backward] = flex_attention_backward


def _flex_pass_missing() -> NotImplementedError:
    return NotImplementedError(
        "flex_attention on neuron reached Inductor's Triton lowering: the neuron rewrite "
        "(torch_neuronx.compile.flex.PASS) is not in torch._inductor.config.pre_grad_custom_pass. "
        "If you set that option, keep the neuron pass in it, e.g. [your_pass, torch_neuronx.compile.flex.PASS]."
    )


# ---------------------------------------------------------------- torch-neuronx check
# `torch-neuronx check` watches a user's unmodified job from inside its
# processes (tools/check/probe.py). Three things it needs have no hook in
# torch 2.13: the tensors a backward pass or autograd.grad starts from (the
# loss: autograd has global hooks per Node, none per backward call), the
# files torch.save or safetensors' save_file writes (torch.serialization and
# safetensors have no save hook), and the DeviceMeshes a job
# builds (device_mesh keeps no registry: only a context-manager stack). The
# wrappers call the original first or after recording, never change
# arguments or results, and are applied only in the checker's child processes
# (TORCH_NEURONX_CHECK_DIR set). Test: test_check_hooks_still_missing_from_torch.


def patch_for_check(on_backward: Callable[..., None], on_save: Callable[..., None],
                    on_mesh: Callable[[Any], None]) -> None:
    """Wrap what the probe watches: ``on_backward(roots, gradients, source)`` before torch.autograd.backward
    (source "backward") and torch.autograd.grad ("grad"); ``on_save(obj, f, kind)`` after torch.save ("torch.save")
    and safetensors.torch.save_file ("safetensors", when safetensors is installed); ``on_mesh(mesh)`` after a
    DeviceMesh is built."""
    import torch.autograd
    import torch.serialization

    if getattr(torch.autograd.backward, "_neuron_check", False):
        return
    backward, grad, save = torch.autograd.backward, torch.autograd.grad, torch.serialization.save
    ORIGINALS["autograd.backward"], ORIGINALS["autograd.grad"], ORIGINALS["save"] = backward, grad, save

    @functools.wraps(backward)
    def checked_backward(tensors: Any, grad_tensors: Any = None, *args: Any, **kwargs: Any) -> Any:
        on_backward(tensors, grad_tensors, "backward")
        return backward(tensors, grad_tensors, *args, **kwargs)

    @functools.wraps(grad)
    def checked_grad(outputs: Any, inputs: Any, grad_outputs: Any = None, *args: Any, **kwargs: Any) -> Any:
        on_backward(outputs, grad_outputs, "grad")
        return grad(outputs, inputs, grad_outputs, *args, **kwargs)

    @functools.wraps(save)
    def checked_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        result = save(obj, f, *args, **kwargs)
        on_save(obj, f, "torch.save")
        return result

    checked_backward._neuron_check = True  # type: ignore[attr-defined]
    torch.autograd.backward = checked_backward
    torch.autograd.grad = checked_grad
    torch.serialization.save = torch.save = checked_save
    try:
        import safetensors.torch as st
    except ImportError:
        st = None
    if st is not None:
        save_file = st.save_file
        ORIGINALS["safetensors.save_file"] = save_file

        @functools.wraps(save_file)
        def checked_save_file(tensors: Any, filename: Any, *args: Any, **kwargs: Any) -> Any:
            result = save_file(tensors, filename, *args, **kwargs)
            on_save(tensors, filename, "safetensors")
            return result

        st.save_file = checked_save_file
    if torch.distributed.is_available():
        from torch.distributed.device_mesh import DeviceMesh

        init = DeviceMesh.__init__
        ORIGINALS["DeviceMesh.__init__"] = init

        @functools.wraps(init)
        def checked_init(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            on_mesh(self)

        DeviceMesh.__init__ = checked_init  # type: ignore[method-assign]
