"""TorchNeuron's compile-side behaviour: CPU autocopy, retain-device mode, fallback execution, compile metrics
(get_dynamo_metrics, the graph_stats table, torch_neuronx.metrics) and preserved artifacts. Each checks the
documented behaviour, with the CPU run of the same code as the reference for values."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torch_neuronx
from torch_neuronx.compile import metrics


@pytest.fixture(autouse=True)
def _fresh() -> None:
    torch._dynamo.reset()
    torch_neuronx.reset_dynamo_metrics()


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))


# ---------------------------------------------------------------- CPU autocopy


def test_cpu_inputs_are_copied_and_outputs_stay_on_the_device() -> None:
    model = _mlp()
    x = torch.randn(4, 6)
    out = torch.compile(model, backend="neuron")(x)
    assert out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), model(x))
    out.sum().backward()  # gradients flow back to the CPU parameters
    ref = _mlp()
    ref(x).sum().backward()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert p.grad is not None and p.grad.device.type == "cpu"
        torch.testing.assert_close(p.grad, q.grad)


def test_in_place_update_of_a_cpu_input_reaches_the_caller() -> None:
    def step(x: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        count.add_(1)
        return x * count

    count = torch.zeros(())
    compiled = torch.compile(step, backend="neuron")
    for i in range(1, 4):
        out = compiled(torch.ones(3), count)
        assert count.item() == i and count.device.type == "cpu"
        assert torch.equal(out.cpu(), torch.full((3,), float(i)))


def test_device_constants_of_a_cpu_traced_graph_are_placed_on_the_device() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x + torch.arange(x.shape[0], device=x.device) + torch.tensor([1.0, 2.0, 3.0])

    x = torch.randn(3)
    out = torch.compile(f, backend="neuron")(x)
    assert out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), f(x))


def test_disabled_autocopy_names_the_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY", "1")

    def f(weights: torch.Tensor, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return weights * 2, inputs * 2

    with pytest.raises(Exception, match=r"Input tensor at index 1 \(L\['inputs'\]\) is on cpu device, expected "
                       r"neuron. Move tensor to Neuron device first with tensor.to\('neuron'\)"):
        torch.compile(f, backend="neuron")(torch.ones(2, device="neuron"), torch.ones(2))


def test_retain_device_mode_returns_outputs_to_the_input_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_NEURONX_RETAIN_DEVICE_MODE", "1")
    model = _mlp()
    x = torch.randn(4, 6)
    out = torch.compile(model, backend="neuron")(x)
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, model(x))
    dev = torch.compile(_mlp().to("neuron"), backend="neuron")(x.to("neuron"))
    assert dev.device.type == "neuron"  # neuron inputs: outputs stay


def test_retain_device_mode_refuses_mixed_input_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_NEURONX_RETAIN_DEVICE_MODE", "1")

    def f(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a * 2, b * 2

    with pytest.raises(Exception, match="cannot mix input devices with TORCH_NEURONX_RETAIN_DEVICE_MODE=1, "
                                        "got cpu and neuron"):
        torch.compile(f, backend="neuron")(torch.ones(2), torch.ones(2, device="neuron"))


# ---------------------------------------------------------------- fallback execution


def _broken_compile() -> torch.Tensor:
    # An Inductor option that does not exist makes the compile fail, as a neuronx-cc error would.
    f = torch.compile(lambda x: x.sin() + 1, backend="neuron", options={"no_such_inductor_option": 1})
    return f(torch.randn(4, device="neuron"))


def test_a_failed_compile_raises_by_default() -> None:
    with pytest.raises(Exception, match="no_such_inductor_option"):
        _broken_compile()


def test_fallback_execution_runs_the_graph_eagerly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "0")
    with pytest.warns(UserWarning, match="falling back to eager execution"):
        out = _broken_compile()
    assert out.device.type == "neuron"
    torch._dynamo.reset()
    monkeypatch.setenv("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "1")
    x = torch.randn(4, device="neuron")  # the option overrides the variable
    f = torch.compile(lambda x: x.cos(), backend="neuron",
                      options={"no_such_inductor_option": 1, "fallback_execution": True})
    with pytest.warns(UserWarning, match="falling back"):
        torch.testing.assert_close(f(x).cpu(), x.cpu().cos())


# ---------------------------------------------------------------- metrics


def test_get_dynamo_metrics_has_one_record_per_graph_in_torchneuron_form() -> None:
    model = torch.compile(_mlp().to("neuron"), backend="neuron")
    with torch.no_grad():
        model(torch.randn(2, 6, device="neuron"))
        model(torch.randn(5, 6, device="neuron"))  # a new shape: a new graph
    records = torch_neuronx.get_dynamo_metrics()
    assert torch.neuron.get_dynamo_metrics == torch_neuronx.get_dynamo_metrics
    assert len(records) == 2
    for r in records:
        assert re.fullmatch(r"model_default_\d+_\w+_\d+", r.graph_name), r.graph_name
        assert r.model_name == "model_default" and not r.has_collectives
        assert r.graph_node_count >= 5 and re.fullmatch(r"\d{8}_\d{6}_\d{6}", r.timestamp)
        assert r.torch_neuronx_fx_passes_us > 0 and len(r.graph_id) == 64
    assert records[0].graph_name != records[1].graph_name
    assert torch._dynamo.utils.counters["neuron"]["compiled_graphs"] == 2
    records[0].graph_name = "changed"  # a copy: the store is untouched
    assert torch_neuronx.get_dynamo_metrics()[0].graph_name != "changed"
    torch_neuronx.reset_dynamo_metrics()
    assert torch_neuronx.get_dynamo_metrics() == [] and not torch._dynamo.utils.counters["neuron"]


def test_model_name_names_the_graphs() -> None:
    torch_neuronx.compile.set_model_name("Encoder")
    try:
        torch.compile(lambda x: x * 3, backend="neuron")(torch.ones(2, device="neuron"))
        (record,) = torch_neuronx.get_dynamo_metrics()
        assert record.model_name == "Encoder" and record.graph_name.startswith("Encoder_")
    finally:
        torch_neuronx.compile.set_model_name(metrics.DEFAULT_MODEL_NAME)
    with pytest.raises(ValueError, match="non-empty string"):
        torch_neuronx.compile.set_model_name("")


COLLECTIVES = r"""
import torch, torch_neuronx
import torch.distributed as dist
from torch.distributed import _functional_collectives as funcol
dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
f = torch.compile(lambda x: funcol.all_reduce(x * 2, "sum", dist.group.WORLD), backend="neuron")
out = f(torch.ones(3, device="neuron"))
(record,) = torch_neuronx.get_dynamo_metrics()
print(out.cpu().tolist(), record.has_collectives, torch._dynamo.utils.counters["neuron"]["graphs_with_collectives"])
dist.destroy_process_group()
"""


def test_collectives_are_flagged() -> None:
    # In its own process: a process group binds its process to one core for good (TorchNeuron's model).
    r = subprocess.run([sys.executable, "-c", COLLECTIVES], capture_output=True, text=True, timeout=300,
                       env={k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "[2.0, 2.0, 2.0] True 1", r.stdout


def test_metrics_report_counts_cache_use() -> None:
    import torch_neuronx.metrics as met

    met.set_enabled(True)
    met.clear_all()
    try:
        f = torch.compile(lambda x: x.exp() * 2, backend="neuron")
        f(torch.ones(3, device="neuron"))
        torch._dynamo.reset()  # Dynamo traces again; the backend's memory cache serves the graph
        f(torch.ones(3, device="neuron"))
        assert met.get_counter_value("CompilationCache.InMemoryHits") == 1
        assert met.get_counter_value("CompilationCache.TotalCompilations") == 1
        data = met.get_metric_data("CompilationTime")
        assert data is not None and data["total_samples"] == 2
        report = met.report()
        assert "Counter: CompilationCache.InMemoryHits\n  Value: 1" in report
        assert "Metric: CompilationTime\n  TotalSamples: 2" in report
        assert set(met.get_compilation_metrics()) >= {"CompilationTime", "CompilationCache.TotalCompilations"}
    finally:
        met.set_enabled(False)
        met.clear_all()
    f(torch.ones(3, device="neuron"))
    assert met.report() == "" and met.get_counter_value("CompilationCache.InMemoryHits") is None  # off: nothing


TABLES = r"""
import torch, torch_neuronx
f = torch.compile(lambda x: x + 1, backend="neuron")
f(torch.ones(2, device="neuron")); f(torch.ones(3, device="neuron"))
"""


def test_graph_stats_table_is_written_at_exit(tmp_path: Path) -> None:
    env = dict(os.environ, TORCH_NEURONX_ENABLED_METRIC_TABLES="graph_stats", TORCH_NEURONX_METRICS_DIR=str(tmp_path))
    subprocess.run([sys.executable, "-c", TABLES], check=True, env=env, capture_output=True, timeout=300)
    with open(tmp_path / "metric_table_graph_stats_rank0.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["graph_id", "graph_name", "model_name", "has_collectives", "graph_node_count",
                             "timestamp", "torch_neuronx_fx_passes_us", "torch_neuronx_lower_us",
                             "torch_neuronx_compile_us"]
    assert len(rows) == 2 and rows[0]["has_collectives"] == "False"


def test_unknown_metric_table_fails_only_at_exit(tmp_path: Path) -> None:
    # TorchNeuron raises only in its CSV writer at exit: compiling works; a warning at the first compile says
    # early which name is wrong, and the exit-time writer raises with TorchNeuron's message.
    env = dict(os.environ, TORCH_NEURONX_ENABLED_METRIC_TABLES="graph_stat")
    r = subprocess.run([sys.executable, "-c", TABLES + "print('compiled both')\n"], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.stdout.strip() == "compiled both", r.stderr
    assert "TORCH_NEURONX_ENABLED_METRIC_TABLES names 'graph_stat', which is not a metric table" in r.stderr
    assert "Metric table 'graph_stat' is not registered. Available tables: ['graph_stats']" in r.stderr
    assert r.stderr.index("not a metric table") < r.stderr.index("is not registered")  # warned first, raised at exit


# ---------------------------------------------------------------- artifacts


def test_preserved_artifacts_follow_torchneuron_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS", "1")
    monkeypatch.setenv("TORCH_NEURONX_DEBUG_DIR", str(tmp_path))
    model = torch.compile(_mlp().to("neuron"), backend="neuron")
    model(torch.randn(3, 6, device="neuron")).sum().backward()
    (record,) = torch_neuronx.get_dynamo_metrics()
    stem = f"model_default_{record.timestamp}"
    expected = {
        f"fx_graphs/proc_0/{stem}.fx.txt", f"fx_graphs/proc_0/{stem}.forward.fx.txt",
        f"fx_graphs/proc_0/{stem}.backward.fx.txt", f"stablehlo/proc_0/{stem}.forward.post_grad.txt",
        f"stablehlo/proc_0/{stem}.backward.post_grad.txt", f"neff/proc_0/{stem}.forward.py",
        f"neff/proc_0/{stem}.backward.py", "proc_0/index.json"}
    assert {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()} == expected
    assert "aten.addmm" in (tmp_path / f"fx_graphs/proc_0/{stem}.forward.fx.txt").read_text()
    assert "aten.mm" in (tmp_path / f"fx_graphs/proc_0/{stem}.backward.fx.txt").read_text()
    assert "extern \"C\"" in (tmp_path / f"neff/proc_0/{stem}.forward.py").read_text()  # its C++ kernels
    (entry,) = json.loads((tmp_path / "proc_0/index.json").read_text())
    assert entry["graph_name"] == record.graph_name and entry["timestamp"] == record.timestamp
    assert all(os.path.exists(p) for p in entry["files"].values())
    # Preserving compiles afresh: the same graph compiled again gets its own files.
    torch._dynamo.reset()
    model(torch.randn(3, 6, device="neuron"))
    assert len(json.loads((tmp_path / "proc_0/index.json").read_text())) == 2


def test_artifacts_are_not_written_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_NEURONX_DEBUG_DIR", str(tmp_path))
    torch.compile(lambda x: x - 1, backend="neuron")(torch.ones(2, device="neuron"))
    assert not any(tmp_path.iterdir())
