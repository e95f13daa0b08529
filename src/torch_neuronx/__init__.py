"""TorchNeuron: AWS Trainium / Inferentia as a native PyTorch device, emulated on the host.

``import torch_neuronx`` (or plain ``import torch``, through the ``torch.backends``
autoload entry point) registers the ``neuron`` device: ``torch.device("neuron")``
tensors with their own memory, every ATen op eagerly, and ``torch.neuron``.
Nothing touches the emulated hardware until the device is first used.
"""

from __future__ import annotations


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
    from torch_neuronx import device

    torch._register_device_module("neuron", device)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_storage=True, for_packed_sequence=True
    )
    # Trainium computes in bf16; CUDA's float16 default would be the wrong
    # choice for torch.autocast("neuron") without a dtype.
    torch.set_autocast_dtype("neuron", torch.bfloat16)
    _patch_tensor_printing()
    _C._set_init_callback(runtime._initialize)
    _C._route_structured_ops()
    from torch_neuronx import compile as _compile  # noqa: F401  (arranges backend "neuron", lazily)
    from torch_neuronx import distributed

    distributed._register()
    from torch_neuronx.tools import logging as _logging
    from torch_neuronx.tools import op_tracker

    _logging.configure_from_env()
    op_tracker.apply_env()


def _patch_tensor_printing() -> None:
    # PyTorch's printer widens values to float64 to choose a format, except on
    # devices it knows lack FP64 (MPS, MAIA, some XPUs); it has no registration
    # hook for that list. Neuron lacks FP64 too: widen neuron tensors to
    # float32 instead, as PyTorch does for MPS.
    import torch._tensor_str as tensor_str

    widen = tensor_str.tensor_totype
    if getattr(widen, "_neuron_aware", False):
        return

    def tensor_totype(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype=torch.float) if t.device.type == "neuron" else widen(t)

    tensor_totype._neuron_aware = True  # type: ignore[attr-defined]
    tensor_str.tensor_totype = tensor_totype


if not hasattr(torch, "neuron"):
    _register()


__all__ = ["__version__", "runtime"]
