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
    from torch_neuronx.tools import log, op_tracker

    compile._register()
    distributed._register()
    log.configure_from_env()
    op_tracker.apply_env()


if not hasattr(torch, "neuron"):
    _register()


__all__ = ["__version__", "runtime"]
