"""TorchNeuron: AWS Trainium / Inferentia as a native PyTorch device, emulated on the host.

``import torch_neuronx`` (or plain ``import torch``, through the ``torch.backends``
autoload entry point) registers the ``neuron`` device: ``torch.device("neuron")``
tensors with their own memory, every ATen op eagerly, and ``torch.neuron``.
Nothing touches the emulated hardware until the device is first used.

The package's top level is TorchNeuron's: device, stream and memory functions
(the same functions as ``torch.neuron``'s), op tracking
(:func:`get_fallback_ops`, :func:`get_executed_ops`, :func:`clear_op_tracking`),
compile metrics, :mod:`torch_neuronx.metrics`, and profiling
(:mod:`torch_neuronx.profiling`, :class:`NeuronProfiler`). docs/torchneuron.md
lists every name with its TorchNeuron source.
"""

from __future__ import annotations

import functools


# Defined before `import torch`: when this package is imported first, torch's
# autoload imports it again, half-initialised, and looks this function up.
def _autoload() -> None:
    """Entry point of the ``torch.backends`` group: importing the package did the work.

    Set ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` to keep ``import torch`` from loading it.
    """


import torch  # noqa: E402

__version__ = "0.1.0"

from torch_neuronx import _C, runtime  # noqa: E402  (_C: the C++ core, registered on load)


def _register() -> None:
    if torch._C._get_privateuse1_backend_name() != "neuron":
        torch.utils.rename_privateuse1_backend("neuron")
    from torch_neuronx import device, patches

    torch._register_device_module("neuron", device)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_storage=True, for_packed_sequence=True
    )
    # Trainium computes in bf16; CUDA's float16 default would be the wrong
    # choice for torch.autocast("neuron") without a dtype.
    torch.set_autocast_dtype("neuron", torch.bfloat16)
    patches.apply()
    _C._route_structured_ops()
    from torch_neuronx import compile, distributed

    # Flex attention needs neuron tensors: patched when the device initialises, not at import.
    device._lazy._lazy_call(functools.partial(patches.patch_flex_attention, compile.flex_support))
    from torch_neuronx.tools import log, op_tracker

    compile._register()
    distributed._register()
    log.configure_from_env()
    op_tracker.apply_env()


if not hasattr(torch, "neuron"):
    _register()
    from torch_neuronx.runtime import env as _env

    if _env.get("TORCH_NEURONX_CHECK_DIR"):  # launched by `torch-neuronx check`: watch this process
        try:
            from torch_neuronx.tools.check import probe as _probe

            _probe.install()
        except Exception as _e:  # the checker reports a job without measurements; the job itself still runs
            import warnings

            warnings.warn(f"torch-neuronx check could not watch this process: {type(_e).__name__}: {_e}",
                          stacklevel=1)

# TorchNeuron's top level: where torch.neuron has the name, the very same function.
from torch_neuronx.compile import get_dynamo_metrics, reset_dynamo_metrics  # noqa: E402
from torch_neuronx.device import (  # noqa: E402
    Event,
    Stream,
    current_device,
    current_stream,
    default_stream,
    device,
    device_count,
    empty_cache,
    get_device_properties,
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_peak_memory_stats,
    set_device,
    set_stream,
    stream,
    synchronize,
)
from torch_neuronx.device import is_initialized as is_neuron_runtime_initialized  # noqa: E402
from torch_neuronx.tools.nki import nki_op, wrap_nki  # noqa: E402
from torch_neuronx.tools.op_tracker import clear_op_tracking, get_executed_ops, get_fallback_ops  # noqa: E402


def __getattr__(name: str) -> object:
    # Submodules with more behind them load on first use: ``import torch`` stays cheap.
    if name in ("metrics", "profiling", "check", "nki"):
        import importlib

        return importlib.import_module(f"torch_neuronx.{name}")
    if name == "NeuronProfiler":
        from torch_neuronx.profiling import NeuronProfiler

        return NeuronProfiler
    raise AttributeError(f"module 'torch_neuronx' has no attribute {name!r}")


__all__ = [
    "Event", "NeuronProfiler", "Stream", "__version__", "clear_op_tracking", "current_device", "current_stream",
    "default_stream", "device", "device_count", "empty_cache", "get_device_properties", "get_dynamo_metrics",
    "get_executed_ops", "get_fallback_ops", "is_neuron_runtime_initialized", "max_memory_allocated",
    "max_memory_reserved", "memory_allocated", "memory_reserved", "memory_stats", "memory_summary", "metrics",
    "nki_op", "profiling", "reset_accumulated_memory_stats", "reset_dynamo_metrics", "reset_peak_memory_stats",
    "runtime", "set_device", "set_stream", "stream", "synchronize", "wrap_nki",
]
