"""Python numbers that change between calls of a graph compiled for "neuron" (issue 34, item 1).

Dynamo passes a Python float it does not specialise (a float argument, a float
attribute, an optimizer's learning rate) to the backend as a 0-d CPU tensor
that the graph reads with ``item()``. Each case runs several calls with
changing values, compared with Inductor on CPU: values within float rounding,
and the same number of graphs (when Dynamo must specialise a value, the
recompile is Dynamo's, on both backends, and the neuron metrics name its reason).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import torch_neuronx
from torch_neuronx.compile import metrics


@pytest.fixture(autouse=True)
def _fresh() -> None:
    torch._dynamo.reset()
    counters.clear()
    torch_neuronx.reset_dynamo_metrics()


def _graphs() -> int:
    """Graphs Dynamo compiled since the last reset (the same counter for every backend)."""
    return int(counters["stats"]["unique_graphs"])


def _on_both(run: Callable[[str, str], Any]) -> tuple[Any, int, Any, int]:
    """`run(device, backend)` on neuron and with Inductor on CPU: (neuron result, its graphs, CPU result, graphs)."""
    neuron = run("neuron", "neuron")
    neuron_graphs = _graphs()
    torch._dynamo.reset()
    counters.clear()
    cpu = run("cpu", "inductor")
    return neuron, neuron_graphs, cpu, _graphs()


def _adamw_with_linear_lr(device: str, backend: str) -> list[torch.Tensor]:
    """PyTorch's compiled-optimizer tutorial: AdamW + LinearLR, `opt.step(); sched.step()` compiled together."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).to(device)
    # foreach=True on both: the path AdamW picks by itself for an accelerator's parameters.
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, foreach=True)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.25, total_iters=4)

    @torch.compile(backend=backend)
    def step() -> None:
        opt.step()
        sched.step()

    x = torch.randn(8, 4).to(device)
    for _ in range(2):
        opt.zero_grad()
        model(x).square().sum().backward()
        step()
    return [p.detach().cpu() for p in model.parameters()]


def test_compiled_adamw_step_with_a_float_learning_rate_schedule_matches_inductor() -> None:
    # Reference: the same Dynamo graphs run by the "eager" backend on CPU (Inductor's CPU compile of a foreach
    # optimizer step costs as much as the neuron one; its values equal eager's within float rounding).
    neuron = _adamw_with_linear_lr("neuron", "neuron")
    neuron_graphs = _graphs()
    torch._dynamo.reset()
    counters.clear()
    cpu = _adamw_with_linear_lr("cpu", "eager")
    for a, b in zip(neuron, cpu, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # The foreach path makes Dynamo specialise the learning rate: one graph per value, on CPU too. The neuron
    # metrics count each recompile and give Dynamo's reason.
    assert neuron_graphs == _graphs() == 2
    reasons = metrics.snapshot()["recompile_reasons"]
    assert len(reasons) == neuron_graphs - 1
    assert all("['lr']" in r["reason"] for r in reasons), reasons


class _Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.alpha = 0.5

    def forward(self, x: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        return self.lin(x) * self.alpha / temperature


_VALUES = ((1.0, 0.5), (0.7, 0.5), (0.3, 0.25), (2.0, 1.5))  # (temperature kwarg, alpha attribute) per call


def _scaled_calls(device: str, backend: str) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = _Scaled().to(device)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    x = torch.randn(2, 4).to(device)
    out = []
    for temperature, alpha in _VALUES:
        model.alpha = alpha
        out.append(compiled(x, temperature=temperature).detach().cpu())
    return out


def test_float_kwarg_and_float_attribute_changed_between_calls_fullgraph() -> None:
    neuron, neuron_graphs, cpu, cpu_graphs = _on_both(_scaled_calls)
    for a, b in zip(neuron, cpu, strict=True):
        torch.testing.assert_close(a, b)
    # The first values, then one graph per float that changed, which then takes it as an input (Dynamo's automatic
    # dynamic): the temperature, then the attribute. Later values compile nothing.
    assert neuron_graphs == cpu_graphs == 3


def test_float_with_a_model_left_on_the_cpu_and_autocopy_off(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = _Scaled()
    compiled = torch.compile(model, backend="neuron")
    x = torch.randn(2, 4)
    for temperature, _ in _VALUES[:3]:  # CPU autocopy: the model's tensors are copied, the float is read
        out = compiled(x, temperature=temperature)
        assert out.device.type == "neuron"
        torch.testing.assert_close(out.cpu(), model(x, temperature=temperature))
    # Autocopy off: only tensors the user can move are refused; a Python float is not one of them.
    monkeypatch.setenv("TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY", "1")
    torch._dynamo.reset()
    on_device = _Scaled().to("neuron")
    on_device.load_state_dict(model.state_dict())
    compiled = torch.compile(on_device, backend="neuron", fullgraph=True)
    for temperature, _ in _VALUES[:3]:
        out = compiled(x.to("neuron"), temperature=temperature)
        torch.testing.assert_close(out.cpu(), model(x, temperature=temperature))


def test_dropout_with_a_changing_probability() -> None:
    def drop(x: torch.Tensor, p: float) -> torch.Tensor:
        return F.dropout(x, p, training=True)

    compiled = torch.compile(drop, backend="neuron", fullgraph=True)
    x = torch.ones(4096, device="neuron")
    for p in (0.1, 0.5, 0.8):
        y = compiled(x, p).cpu()
        kept = y[y != 0]
        # Kept elements are scaled by 1 / (1 - p), as on CPU; the dropped fraction is p within 5 standard errors.
        torch.testing.assert_close(kept, torch.full_like(kept, 1 / (1 - p)))
        assert abs((y == 0).float().mean().item() - p) < 5 * (p * (1 - p) / x.numel()) ** 0.5
        torch.manual_seed(7)
        first = compiled(x, p).cpu()
        torch.manual_seed(7)
        torch.testing.assert_close(compiled(x, p).cpu(), first)  # one seed, one mask
    # F.dropout needs p as a constant: Dynamo specialises it (the same on CPU), and the metrics say why.
    reasons = [r["reason"] for r in metrics.snapshot()["recompile_reasons"]]
    assert len(reasons) == 2 and all("p ==" in r for r in reasons), reasons


def _softmax_with_temperature(x: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(x / temperature, -1)


@pytest.mark.parametrize("fullgraph", [False, True])
def test_float_changed_together_with_the_input_shape(fullgraph: bool) -> None:
    # Issue 34 review: once the size changes too, Dynamo's graph takes a symbolic size and the float; the neuron
    # backend compiles it per shape outside Dynamo's tracing context, where the float must still be an input.
    def calls(device: str, backend: str) -> list[torch.Tensor]:
        compiled = torch.compile(_softmax_with_temperature, backend=backend, fullgraph=fullgraph)
        torch.manual_seed(0)
        data = torch.randn(1, 6)
        return [compiled(data[:, :n].to(device), t).cpu() for n, t in ((4, 1.0), (4, 0.7), (6, 0.7), (6, 0.3))]

    neuron, neuron_graphs, cpu, cpu_graphs = _on_both(calls)
    for a, b in zip(neuron, cpu, strict=True):
        torch.testing.assert_close(a, b)
    assert neuron_graphs == cpu_graphs


class _TopScaled(torch.nn.Module):
    """An int and a float keyword, as in a sampling head: ``model(x, temperature=t, k=k)``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, temperature: float = 1.0, k: int = 2) -> torch.Tensor:
        return self.lin(x) / temperature * k


@pytest.mark.parametrize("fullgraph", [False, True])
def test_float_changed_together_with_an_int(fullgraph: bool) -> None:
    def calls(device: str, backend: str) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = _TopScaled().to(device)
        compiled = torch.compile(model, backend=backend, fullgraph=fullgraph)
        x = torch.randn(2, 4).to(device)
        return [compiled(x, temperature=t, k=k).detach().cpu() for t, k in ((1.0, 2), (0.7, 2), (0.3, 3), (1.5, 3))]

    neuron, neuron_graphs, cpu, cpu_graphs = _on_both(calls)
    for a, b in zip(neuron, cpu, strict=True):
        torch.testing.assert_close(a, b)
    assert neuron_graphs == cpu_graphs


def test_changing_int_is_specialised_per_value_and_the_warnings_name_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # An int that changes is compiled into each graph (one per value, as for shapes): the warnings must name the
    # argument and not advise bucketing, which pads shapes and cannot help a value.
    monkeypatch.setattr(metrics, "recompile_warning_threshold", 1)
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 3)

    def scale(x: torch.Tensor, k: int) -> torch.Tensor:
        return x * k + 1

    compiled = torch.compile(scale, backend="neuron")
    x = torch.arange(3.0)
    with pytest.warns(UserWarning) as caught:
        for k in (2, 3, 4, 5, 6):
            torch.testing.assert_close(compiled(x.to("neuron"), k).cpu(), scale(x, k))
    texts = [str(w.message) for w in caught if "torch_neuronx" in str(w.message)]
    recompiles = [t for t in texts if "recompiled" in t]
    limit = [t for t in texts if "recompile_limit" in t]
    assert len(recompiles) == 1 and "L['k'] took 2 values (3, 4)" in recompiles[0], texts
    assert len(limit) == 1 and "int argument L['k']" in limit[0], texts
    assert all("as a tensor" in t and "bucketing" not in t for t in recompiles + limit), texts
    # The first value, then one graph per value until the limit (3 per Dynamo graph); k=6 runs eagerly.
    assert metrics.snapshot()["graphs_compiled"] == 4


def test_float64_graph_reads_a_changing_float_in_double_precision() -> None:
    # Review r34b: a float that changes with the shape and an int reached Inductor's C++ kernel as a C++ float
    # (an unbacked SymFloat), so float64 graphs computed with it rounded to float32: 1e-300 and 1e-50 became 0
    # (x / s gave inf), 0.3 lost its last 29 bits. Such graphs now hold the float as a constant, one graph per
    # value; the metrics name the float as the reason. The reference is eager (CPU Inductor's own FX graph cache
    # serves the 0.3 call a graph of another value in torch 2.13).
    def fn(x: torch.Tensor, s: float, k: int) -> torch.Tensor:
        return (x - 5).clamp(min=s).log() + x / s + k

    compiled = torch.compile(fn, backend="neuron")
    for i, s in enumerate((0.5, 1e-300, 0.3, 1e-50)):
        x = torch.ones(3 + 2 * i, 2, dtype=torch.float64)
        torch.testing.assert_close(compiled(x.to("neuron"), s, 1 + i).cpu(), fn(x, s, 1 + i), rtol=0, atol=0,
                                   msg=f"s={s}")
    reasons = [r["reason"] for r in metrics.snapshot()["recompile_reasons"]]
    assert any("1e-300" in r for r in reasons), reasons


def test_a_float_compiled_in_as_a_constant_is_not_served_for_the_next_value() -> None:
    # clamp takes its min only as a number: Inductor compiles the float in and Dynamo guards on its value, so
    # the next value traces the same graph code again. The neuron cache served the first value's graph for it
    # (clamp at 0.2 with s = 0.3); the key now holds the numbers' values. (CPU Inductor's own FX graph cache
    # has the same collision in torch 2.13: the reference here is eager.)
    def fn(x: torch.Tensor, s: float) -> torch.Tensor:
        return x.clamp(min=s) * s

    compiled = torch.compile(fn, backend="neuron")
    x = torch.linspace(-1, 1, 6)
    for s in (0.1, 0.2, 0.3, 0.4):
        torch.testing.assert_close(compiled(x.to("neuron"), s).cpu(), fn(x, s), rtol=0, atol=0, msg=f"s={s}")


def test_a_float_read_at_run_time_keeps_one_graph_per_shape() -> None:
    # the twin: a float the graph multiplies by stays a runtime input: no graph per value
    def fn(x: torch.Tensor, s: float) -> torch.Tensor:
        return x * s + 1

    compiled = torch.compile(fn, backend="neuron")
    for n in (6, 8):
        x = torch.linspace(-1, 1, n)
        for s in (0.1, 0.2, 0.3, 0.4):
            torch.testing.assert_close(compiled(x.to("neuron"), s).cpu(), fn(x, s), rtol=0, atol=0)
    assert metrics.snapshot()["graphs_compiled"] <= 3  # the first value, then a runtime float, per shape


def test_a_float_an_op_must_compare_is_compiled_in_when_the_shape_changes_too() -> None:
    # Review r34c: hardtanh(x, -s, s) compares its bounds when it lowers (-s > s), which a float read at run time
    # cannot answer (GuardOnDataDependentSymNode): such a graph now holds the float as a constant, per value
    def fn(x: torch.Tensor, s: float) -> torch.Tensor:
        return F.hardtanh(x, -s, s)

    compiled = torch.compile(fn, backend="neuron")
    for i, s in enumerate((0.2, 0.3, 0.4)):
        x = torch.linspace(-1, 1, 64 + i)
        torch.testing.assert_close(compiled(x.to("neuron"), s).cpu(), fn(x, s), rtol=0, atol=0, msg=f"s={s}")


def test_the_recompile_limit_warning_names_a_float_compiled_in(monkeypatch: pytest.MonkeyPatch) -> None:
    # Review r34c: when a float64 graph's float fills the limit, the warning blamed shapes and advised bucketing
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 3)

    def fn(x: torch.Tensor, s: float) -> torch.Tensor:
        return x * s

    compiled = torch.compile(fn, backend="neuron")
    with pytest.warns(UserWarning) as caught:
        for i, s in enumerate((0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625)):
            x = torch.ones(4 + min(i, 1), dtype=torch.float64)  # one shape change, then the float alone
            torch.testing.assert_close(compiled(x.to("neuron"), s).cpu(), fn(x, s), rtol=0, atol=0)
    texts = [str(w.message) for w in caught if "recompile_limit" in str(w.message)]
    assert texts and "L['s']" in texts[0] and "Bucket the inputs" not in texts[0], texts
