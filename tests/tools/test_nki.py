"""NKI entry points: nki_op registers a real custom op (fake impl, torch.compile, autograd registration);
launching an NKI kernel on the emulator raises a clear error, as there is no NeuronCore to run it."""

from __future__ import annotations

import pytest
import torch

import torch_neuronx
from torch_neuronx.tools.nki import NKIUnavailableError


def add_kernel(a_input, b_input, c_output):  # type: ignore[no-untyped-def]  # an NKI kernel stands here
    raise AssertionError("never run: there is no NeuronCore")


@torch_neuronx.nki_op("nki_test::add", mutates_args={})
def nki_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    torch_neuronx.wrap_nki(add_kernel)[(x.shape[0],)](x, y, out)
    return out


def test_nki_op_registers_a_custom_op_with_shapes() -> None:
    assert torch.ops.nki_test.add.default is not None
    x = torch.randn(4, 3, device="meta")
    assert nki_add(x, x).shape == (4, 3)  # the fake implementation: shapes without a kernel


def test_nki_op_traces_under_compile_and_fails_only_at_launch() -> None:
    x = torch.randn(4, 3, device="neuron")
    with pytest.raises(NKIUnavailableError, match="'add_kernel'.*grid \\(4,\\).*emulated"):
        nki_add(x, x)
    graph = []

    def backend(gm, inputs):  # type: ignore[no-untyped-def]
        graph.append(gm)
        return gm

    torch._dynamo.reset()
    with pytest.raises(NKIUnavailableError):
        torch.compile(lambda a: nki_add(a, a) * 2, backend=backend)(x)
    assert any("nki_test.add" in str(n.target) for n in graph[0].graph.nodes)


def test_bad_names_and_grids_are_refused() -> None:
    with pytest.raises(ValueError, match="qualified op name"):
        torch_neuronx.nki_op("add")
    with pytest.raises(ValueError, match="positive ints"):
        torch_neuronx.wrap_nki(add_kernel)[(0, 2)]
