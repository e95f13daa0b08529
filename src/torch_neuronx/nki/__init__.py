"""An eager host interpreter of the NKI API (NKI 0.6), with Trainium's rules and on-chip capacity checked.

Kernels written for AWS's Neuron Kernel Interface run unchanged::

    import nki
    import nki.language as nl
    import nki.isa as nisa

    @nki.jit
    def add_kernel(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        ta, tb = nl.load(a), nl.load(b)
        nl.store(out, nl.add(ta, tb))
        return out

    add_kernel(x, y)                     # neuron (or CPU) tensors: outputs on the same device
    nki.simulate(add_kernel)(xn, yn)     # NumPy in, NumPy out

``import nki`` gives this package when AWS's own ``nki`` is not installed
(``nki.__emulated__`` is true; see :func:`provider`); ``torch_neuronx.nki``
always names it. Every instruction runs as torch ops on host tiles, checks
the rules of the target NeuronCore (``NEURON_PLATFORM_TARGET_OVERRIDE`` or the
emulated instance) and raises :class:`NkiValidationError` at the kernel's line
when one is broken; :func:`last_report` tells the SBUF/PSUM high-water marks
of the last launch against the target's budget (``TORCH_NEURONX_NKI_CAPACITY``
= warn, strict or off). docs/nki.md has the details.
"""

from __future__ import annotations

from torch_neuronx.nki import isa, language, typing
from torch_neuronx.nki._errors import NkiCapacityWarning, NkiRangeWarning, NkiValidationError
from torch_neuronx.nki._launch import Kernel, LaunchReport, jit, last_report, simulate, simulate_kernel
from torch_neuronx.nki._target import Target, current_target
from torch_neuronx.nki._tensor import MemoryRegion, NkiTensor

__emulated__ = True
__version__ = "0.6.0+torch_neuronx"

baremetal = jit  # the older dialect's entry points run on the same interpreter
benchmark = jit


def provider() -> str:
    """Which ``nki`` a plain ``import nki`` gives in this environment: "aws" (the real package) or "torch_neuronx"."""
    import sys

    module = sys.modules.get("nki")
    if module is None:
        import importlib

        module = importlib.import_module("nki")
    return "torch_neuronx" if getattr(module, "__emulated__", False) else "aws"


__all__ = [
    "Kernel", "LaunchReport", "MemoryRegion", "NkiCapacityWarning", "NkiRangeWarning", "NkiTensor",
    "NkiValidationError", "Target",
    "baremetal", "benchmark", "current_target", "isa", "jit", "language", "last_report", "provider", "simulate",
    "simulate_kernel", "typing",
]
