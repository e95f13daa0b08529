"""TorchNeuron's NKI entry points, ``torch_neuronx.nki_op`` and ``torch_neuronx.wrap_nki``.

NKI kernels are programs for a NeuronCore's engines (SBUF tiles, TensorE
matmuls); the emulator has no NeuronCore to run them on. What does not need
one works as on TorchNeuron: :func:`nki_op` registers the function as a real
PyTorch custom op (``torch.library.custom_op``: it shows in ``torch.ops``,
traces under ``torch.compile`` with its fake implementation, takes
``register_autograd``), and :func:`wrap_nki` returns a caller that takes a
launch grid (``wrap_nki(kernel)[grid](...)``). Launching the kernel raises
:class:`NKIUnavailableError`, saying what to do: keep a PyTorch path for the
kernel and take it when ``torch.neuron.get_device_properties().emulated``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any


class NKIUnavailableError(NotImplementedError):
    """An NKI kernel was launched on the emulated device."""


class NKICaller:
    """What :func:`wrap_nki` returns: ``caller[grid](*args)`` (or ``caller(*args)``) launches the kernel."""

    def __init__(self, kernel: Callable[..., Any], grid: tuple[int, ...] = (), **options: Any) -> None:
        self.kernel = kernel
        self.grid = grid
        self.options = options

    def __getitem__(self, grid: int | tuple[int, ...]) -> NKICaller:
        grid = (grid,) if isinstance(grid, int) else tuple(grid)
        if not all(isinstance(g, int) and g > 0 for g in grid):
            raise ValueError(f"an NKI launch grid is a tuple of positive ints, got {grid!r}")
        return NKICaller(self.kernel, grid, **self.options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _tracing(list(args) + list(kwargs.values())):
            return None  # shapes only (fake tensors): the kernel writes into outputs the caller made
        name = getattr(self.kernel, "__name__", repr(self.kernel))
        raise NKIUnavailableError(
            f"NKI kernel {name!r} (grid {self.grid or '(1,)'}) needs a Trainium NeuronCore: the emulated device "
            "runs PyTorch ops, not NKI programs. Give the op a PyTorch implementation and take it when "
            "torch.neuron.get_device_properties().emulated is true; launch the kernel on the instance.")


def _tracing(values: list[Any]) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return any(isinstance(v, FakeTensor) or getattr(v, "is_meta", False) for v in values)


def wrap_nki(kernel: Callable[..., Any], **options: Any) -> NKICaller:
    """Wrap an NKI kernel for calls from PyTorch code (TorchNeuron's API)."""
    return NKICaller(kernel, **options)


def nki_op(name: str, fn: Callable[..., Any] | None = None,
           mutates_args: str | Iterable[str] = ()) -> Any:
    """Register `fn` as the custom op `name` ("namespace::op"), as TorchNeuron's decorator does.

    Usable as ``@nki_op("mylib::add", mutates_args={})`` or ``nki_op("mylib::add", fn)``. The op's fake
    implementation runs `fn` on fake tensors, so `fn` should only compute shapes before it launches NKI.
    """
    import torch

    if not isinstance(name, str) or "::" not in name:
        raise ValueError(f'nki_op takes a qualified op name like "mylib::add", got {name!r}')

    def register(function: Callable[..., Any]) -> Any:
        op = torch.library.custom_op(name, function, mutates_args=mutates_args)
        op.register_fake(function)
        return op

    return register(fn) if fn is not None else register
