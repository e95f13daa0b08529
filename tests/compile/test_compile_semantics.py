"""TorchNeuron semantics of backend "neuron": static shapes, modes, fullgraph, graph breaks, metrics."""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_neuronx.compile as neuron_compile
from torch_neuronx.compile import backend, bucketing, metrics


def _f(x: torch.Tensor) -> torch.Tensor:
    return x.sin() * 2 + x.cos()  # one small kernel: cheap to compile for every shape


def test_backend_is_registered_as_neuron() -> None:
    assert "neuron" in torch._dynamo.list_backends()
    assert torch._dynamo.lookup_backend("neuron") is backend.neuron_backend


def test_device_interface_reports_torch_neuron() -> None:
    from torch._dynamo.device_interface import get_interface_for_device

    interface = get_interface_for_device("neuron")
    assert interface.device_count() == torch.neuron.device_count()
    assert interface.current_device() == torch.neuron.current_device()
    assert interface.is_available()
    assert interface.Stream is torch.neuron.Stream and interface.Event is torch.neuron.Event
    interface.synchronize()
    assert interface.Worker.get_device_properties(0).total_memory == torch.neuron.get_device_properties(0).total_memory


def test_dynamic_true_is_refused(dev: torch.device) -> None:
    x = torch.randn(4, 8, device=dev)
    with pytest.raises(Exception, match="static shapes") as info:
        torch.compile(_f, backend="neuron", dynamic=True)(x)
    assert "bucket" in str(info.value)
    with pytest.raises(neuron_compile.NeuronDynamicShapesError):
        neuron_compile.compile(_f, dynamic=True)


def test_other_modes_warn_once_and_compile(dev: torch.device) -> None:
    backend._warned_modes.discard("max-autotune")
    x = torch.randn(4, 8, device=dev)
    with pytest.warns(UserWarning, match="mode='max-autotune' is ignored"):
        out = torch.compile(_f, backend="neuron", mode="max-autotune")(x)
    torch.testing.assert_close(out, _f(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        neuron_compile.compile(lambda t: t.cos() + 1, mode="max-autotune")(x)  # warned already: silent


def test_fullgraph(dev: torch.device) -> None:
    x = torch.randn(4, 8, device=dev)
    torch.testing.assert_close(neuron_compile.compile(_f, fullgraph=True)(x), _f(x))
    assert metrics.snapshot()["graph_breaks"]["count"] == 0


def test_graph_breaks_are_counted_with_reasons(dev: torch.device) -> None:
    def broken(x: torch.Tensor) -> torch.Tensor:
        y = x.sin()
        torch._dynamo.graph_break()
        return y.cos()

    x = torch.randn(4, 8, device=dev)
    torch.testing.assert_close(torch.compile(broken, backend="neuron")(x), x.sin().cos())
    m = metrics.snapshot()
    assert m["graphs_compiled"] == 2
    assert m["graph_breaks"]["count"] >= 1
    assert any("graph_break" in reason for reason in m["graph_breaks"]["reasons"])


def test_new_shape_compiles_new_static_graph(dev: torch.device) -> None:
    compiled = neuron_compile.compile(_f)
    for rows in (4, 6, 4):
        x = torch.randn(rows, 8, device=dev)
        torch.testing.assert_close(compiled(x), _f(x))
    m = metrics.snapshot()
    assert m["graphs_compiled"] == 2 and m["recompilations"] == 1
    change = m["recompile_reasons"][0]["changed"]
    assert change == [{"input": "L['x']", "dim": 0, "before": 4, "after": 6}]
    (function,) = m["functions"].values()
    assert function["distinct_input_shapes"] == [{"L['x']": [4, 8]}, {"L['x']": [6, 8]}]


def test_automatic_dynamic_still_compiles_static_graphs(dev: torch.device) -> None:
    # dynamic unset: Dynamo marks dim 0 dynamic after the second shape; the backend specialises anyway.
    compiled = torch.compile(_f, backend="neuron")
    for rows in (3, 5, 7, 5):
        x = torch.randn(rows, 8, device=dev)
        torch.testing.assert_close(compiled(x), _f(x))
    m = metrics.snapshot()
    assert m["graphs_compiled"] == 3
    assert [r["changed"][0]["after"] for r in m["recompile_reasons"]] == [5, 7]


def test_many_recompiles_warn_with_the_varying_dim(dev: torch.device, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "recompile_warning_threshold", 1)
    compiled = neuron_compile.compile(_f)
    with pytest.warns(UserWarning, match=r"recompiled 2 times.*L\['x'\] dim 1 took 3 sizes.*bucketing"):
        for cols in (3, 5, 7):
            compiled(torch.randn(2, cols, device=dev))


def _token_model(ids: torch.Tensor, mask: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    return (table[ids] * mask.unsqueeze(-1)).sum(1)


def test_bucketing_bounds_recompilations(dev: torch.device) -> None:
    lengths = [5, 9, 23, 9, 5]
    table = torch.randn(64, 4, device=dev)
    batches = [[list(range(1, n + 1))] for n in lengths]

    def graphs_for(pad: dict) -> int:
        torch._dynamo.reset()
        metrics.reset()
        compiled = neuron_compile.compile(_token_model)
        for batch in batches:
            ids, mask = bucketing.pad_batch(batch, device=dev, **pad)
            torch.testing.assert_close(compiled(ids, mask, table), _token_model(ids, mask, table))
        return metrics.snapshot()["graphs_compiled"]

    assert graphs_for({"pad_to_multiple_of": None}) == len(set(lengths))
    assert graphs_for({"pad_to_multiple_of": 16}) == 2  # lengths 16 and 32
    plan = bucketing.propose_buckets(lengths, max_graphs=2)
    assert plan.buckets == (9, 23)
    assert graphs_for({"buckets": plan.buckets}) == 2
