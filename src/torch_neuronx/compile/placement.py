"""CPU tensors given to a compiled graph: TorchNeuron's autocopy and retain-device rules.

A graph compiled by the ``neuron`` backend runs on the device. When Dynamo
hands it CPU tensors (a CPU input, a model left on the CPU), TorchNeuron
copies them to the device at each call ("CPU autocopy") and leaves the outputs
there. Here the same:

* the graph is placed on the device (its CPU device constants become the
  neuron device, its CPU tensor constants are moved) and compiled for it;
* at each call, CPU tensor arguments are copied to the device; a graph that
  mutates one of them in place writes the result back into the caller's CPU
  tensor, so no update is lost;
* outputs stay on neuron, unless ``TORCH_NEURONX_RETAIN_DEVICE_MODE=1``: then
  they go back to the device the inputs came from (CPU inputs give CPU
  outputs), and inputs from both devices are an error;
* ``TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY=1`` makes a CPU input an error
  that names the argument.

Graphs whose inputs are all on the device take none of this: no wrapper, no cost.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_map

from torch_neuronx.runtime import env


class NEFFExecutionError(RuntimeError):
    """A compiled graph cannot run with the inputs it was given (TorchNeuron's name for it)."""


def cpu_positions(example_inputs: Sequence[Any], python_scalars: frozenset[int] = frozenset()) -> list[int]:
    """The CPU tensor inputs to copy to the device; `python_scalars` (Dynamo's Python numbers) stay where they are."""
    return [i for i, x in enumerate(example_inputs)
            if isinstance(x, torch.Tensor) and x.device.type == "cpu" and i not in python_scalars]


def python_scalar_positions(gm: torch.fx.GraphModule) -> frozenset[int]:
    """The inputs that are Python numbers in the user's code (a float argument, a float attribute, an optimizer's
    learning rate): Dynamo passes each as a 0-d CPU tensor and reads it with ``item()`` in the graph, so that a new
    value does not recompile.

    They are runtime inputs of the graph, as in TorchNeuron, whose executor turns Python scalars into scalar
    tensor inputs at each call (torch_neuronx/neuron_dynamo_backend/executor.py, ``Executor._prepare_inputs``),
    not constants. They stay 0-d CPU tensors: Inductor reads a CPU scalar input of a device graph directly (as it
    does for CUDA graphs); a device copy would make its ``item()`` data-dependent when the graph is specialised.
    """
    positions = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        grapharg = node.meta.get("grapharg")
        if grapharg is not None and getattr(grapharg, "pass_arg_as_tensor", False):
            positions.append(i)
    return frozenset(positions)


def check_autocopy(example_inputs: Sequence[Any], cpu: list[int], names: list[str]) -> None:
    """Raise for the first CPU input when autocopy is disabled."""
    if cpu and env.get("TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY"):
        i = cpu[0]
        name = f" ({names[i]})" if i < len(names) and names[i] else ""
        raise RuntimeError(
            f"Input tensor at index {i}{name} is on cpu device, expected neuron. Move tensor to Neuron device "
            "first with tensor.to('neuron') (or unset TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY to copy it "
            "automatically)")


def target_device(example_inputs: Sequence[Any]) -> torch.device:
    """The core the graph runs on: that of its first neuron input, else the current device."""
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type == "neuron":
            return x.device
    return torch.device("neuron", torch.neuron.current_device())  # type: ignore[attr-defined]


# Factories whose device defaults to the CPU: in a graph lowered to the device they make device tensors.
_FACTORIES = frozenset({torch.tensor, torch.as_tensor, torch.scalar_tensor, torch.zeros, torch.ones, torch.empty,
                        torch.empty_strided, torch.full, torch.arange, torch.range, torch.linspace, torch.logspace,
                        torch.eye, torch.rand, torch.randn, torch.randint, torch.randperm, torch.tril_indices,
                        torch.triu_indices})


def place_graph(gm: torch.fx.GraphModule, device: torch.device) -> None:
    """Make a graph traced on CPU inputs compute on `device`: device constants, factories that default to
    the CPU, and tensor constants."""

    def on_device(value: Any) -> Any:
        if isinstance(value, torch.device) and value.type == "cpu":
            return device
        return value

    for node in gm.graph.nodes:
        node.args = tree_map(on_device, node.args)
        kwargs = tree_map(on_device, dict(node.kwargs))
        if kwargs.get("device") == "cpu" or (node.op == "call_function" and node.target in _FACTORIES
                                             and kwargs.get("device") is None):
            kwargs["device"] = device
        node.kwargs = kwargs
        if node.op == "get_attr":
            owner, _, attr = str(node.target).rpartition(".")
            module = gm.get_submodule(owner) if owner else gm
            value = getattr(module, attr, None)
            if isinstance(value, torch.Tensor) and value.device.type == "cpu":
                moved = value.to(device)
                if isinstance(value, torch.nn.Parameter):
                    moved = torch.nn.Parameter(moved, requires_grad=value.requires_grad)
                setattr(module, attr, moved)
    gm.recompile()


def output_device(example_inputs: Sequence[Any], python_scalars: frozenset[int] = frozenset()) -> str | None:
    """With TORCH_NEURONX_RETAIN_DEVICE_MODE=1, the device type the outputs return to (None: stay). Python numbers
    (`python_scalars`, passed by Dynamo as 0-d CPU tensors) are not the user's tensors and do not count."""
    if not env.get("TORCH_NEURONX_RETAIN_DEVICE_MODE"):
        return None
    kinds = sorted({x.device.type for i, x in enumerate(example_inputs)
                    if isinstance(x, torch.Tensor) and i not in python_scalars})
    if len(kinds) > 1:
        raise NEFFExecutionError(f"cannot mix input devices with TORCH_NEURONX_RETAIN_DEVICE_MODE=1, got "
                                 f"{' and '.join(kinds)}: move every input (and the model) to one device")
    return kinds[0] if kinds and kinds[0] != "neuron" else None


class CpuInputs:
    """Runs a neuron graph on arguments some of which are CPU tensors (see the module docstring)."""

    def __init__(self, run: Callable[..., Any], cpu: list[int], device: torch.device, back_to: str | None) -> None:
        self.run = run
        self.cpu = cpu
        self.device = device
        self.back_to = back_to

    def __call__(self, *args: Any) -> Any:
        moved = list(args)
        for i in self.cpu:
            moved[i] = args[i].to(self.device)
        versions = [moved[i]._version for i in self.cpu]
        out = self.run(*moved)
        for i, version in zip(self.cpu, versions, strict=True):
            if moved[i]._version != version:  # mutated in place by the graph: the caller's tensor gets it
                with torch.no_grad():
                    args[i].copy_(moved[i])
        if self.back_to is not None:
            back = self.back_to
            out = tree_map(lambda t: t.to(back) if isinstance(t, torch.Tensor) and t.device.type == "neuron"
                           else t, out)
        return out
