"""TorchNeuron's top-level API and environment: every name exists with TorchNeuron's meaning, is the same
function as torch.neuron's where both have it, and docs/torchneuron.md documents every name and variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torch_neuronx
from torch_neuronx.runtime import env

DOC = Path(__file__).resolve().parents[1] / "docs" / "torchneuron.md"

# The names issue 12 lists, from TorchNeuron's torch_neuronx/__init__.py.
DEVICES = ["device_count", "current_device", "set_device", "get_device_properties", "device",
           "is_neuron_runtime_initialized"]
STREAMS = ["synchronize", "Stream", "Event", "current_stream", "default_stream", "set_stream", "stream"]
MEMORY = ["memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved", "memory_stats",
          "memory_summary", "reset_peak_memory_stats", "reset_accumulated_memory_stats", "empty_cache"]
TRACKING = ["get_fallback_ops", "get_executed_ops", "clear_op_tracking"]
OTHERS = ["get_dynamo_metrics", "reset_dynamo_metrics", "metrics", "profiling", "NeuronProfiler", "nki_op", "wrap_nki"]


@pytest.mark.parametrize("name", DEVICES + STREAMS + MEMORY + TRACKING + OTHERS)
def test_name_exists_and_is_documented(name: str) -> None:
    assert getattr(torch_neuronx, name) is not None
    assert f"`{name}`" in DOC.read_text(), f"docs/torchneuron.md does not document {name}"


@pytest.mark.parametrize("name", [n for n in DEVICES + STREAMS + MEMORY + ["get_dynamo_metrics",
                                                                          "reset_dynamo_metrics"]])
def test_shared_names_are_torch_neuron_functions(name: str) -> None:
    twin = "is_initialized" if name == "is_neuron_runtime_initialized" else name
    assert getattr(torch_neuronx, name) is getattr(torch.neuron, twin)


def test_invalid_device_is_the_error_both_apis_raise() -> None:
    for call in (torch_neuronx.set_device, torch_neuronx.get_device_properties):
        with pytest.raises(ValueError, match="Invalid device id"):
            call(torch_neuronx.device_count())
        with pytest.raises(IndexError):
            call(-5)


@pytest.mark.parametrize("name", sorted(env.VARIABLES))
def test_every_variable_is_documented(name: str) -> None:
    assert f"`{name}`" in DOC.read_text(), f"docs/torchneuron.md does not document {name}"


@pytest.mark.parametrize("name", sorted(n for n, v in env.VARIABLES.items() if v.kind in ("bool", "int")))
def test_a_value_that_does_not_parse_warns_and_keeps_the_default(name: str) -> None:
    with pytest.warns(UserWarning, match=f"{name}='banana' is not"):
        value = env.get(name, {name: "banana"})
    assert value == env.VARIABLES[name].default
    env._warned.discard(name)


def test_bool_spellings() -> None:
    name = "TORCH_NEURONX_RETAIN_DEVICE_MODE"
    for text in ("1", "true", "YES", "on"):
        assert env.get(name, {name: text}) is True
    for text in ("0", "false", "No", "off"):
        assert env.get(name, {name: text}) is False
    assert env.get(name, {}) is False and env.get(name, {name: ""}) is False


def test_every_variable_the_code_reads_is_in_the_table() -> None:
    """A variable read with os.environ instead of env.get escapes the docs: grep the package for names."""
    import re

    root = Path(torch_neuronx.__file__).parent
    # tools/migrate names other stacks' variables (NEURON_CC_FLAGS) and the code it writes: data, not reads
    text = "\n".join(p.read_text() for p in root.rglob("*.py") if "migrate" not in p.parts) + "\n".join(
        p.read_text() for p in (root / "csrc").rglob("*.cpp"))
    read = set(re.findall(r"\"((?:TORCH_NEURONX|NEURON)_[A-Z0-9_]+)\"", text))
    read -= {"TORCH_NEURONX_FUZZ_EXAMPLES"}  # the fuzzer's own test knob, in torch_neuronx.testing
    assert read <= set(env.VARIABLES), sorted(read - set(env.VARIABLES))


def test_launch_blocking_and_fallback_only_change_nothing_here() -> None:
    code = ("import torch, torch_neuronx\n"
            "x = torch.ones(3, dtype=torch.float64, device='neuron')\n"
            "print((x + 1).sum().item(), torch_neuronx.get_fallback_ops() != [])\n")
    outs = set()
    for extra in ({}, {"NEURON_LAUNCH_BLOCKING": "1", "TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS": "1"}):
        r = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True,
                           env={**os.environ, **extra}, check=True)
        outs.add(r.stdout)
    assert outs == {"6.0 True\n"}


def test_log_file_receives_the_log(tmp_path: Path) -> None:
    log = tmp_path / "neuron.log"
    code = "import logging, torch, torch_neuronx\nlogging.getLogger('torch_neuronx').warning('hello file')\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "TORCH_NEURONX_LOG_FILE": str(log), "TORCH_NEURONX_LOG_LEVEL": "1"})
    assert "hello file" in log.read_text() and "hello file" not in r.stderr


# ---------------------------------------------------------------- torch_neuronx.neuron_dynamo_backend (issue 22, 4)


def test_neuron_dynamo_backend_names_are_torchneurons() -> None:
    from torch_neuronx.neuron_dynamo_backend import (
        create_neuron_backend,
        get_model_name,
        get_rank,
        neuron_backend,
        reset_dynamo_metrics,
        set_model_name,
    )
    from torch_neuronx.neuron_dynamo_backend.metrics import NeuronCompilationMetrics, get_dynamo_metrics

    assert callable(neuron_backend) and get_rank() == 0
    reset_dynamo_metrics()
    previous = get_model_name()
    set_model_name("TinyNet")
    try:
        x = torch.randn(5, 3)
        f = torch.compile(lambda t: torch.relu(t) * 2 + 1, backend=create_neuron_backend(), fullgraph=True)
        torch.testing.assert_close(f(x.to("neuron")).cpu(), torch.relu(x) * 2 + 1)
        records = get_dynamo_metrics()
        assert len(records) == 1 and isinstance(records[0], NeuronCompilationMetrics)
        assert records[0].model_name == "TinyNet" and records[0].graph_name.startswith("TinyNet_")
        assert records == torch_neuronx.get_dynamo_metrics()  # the same records as the top-level API
    finally:
        set_model_name(previous)
        reset_dynamo_metrics()
    with pytest.raises(ValueError, match="non-empty string"):
        set_model_name("")


# ---------------------------------------------------------------- environment variables (issue 22, 6)


@pytest.mark.parametrize("text", ["garbage", "-5", "0", "99999999999", "1.5"])
def test_collective_bucket_size_is_validated(text: str) -> None:
    name = "COLLECTIVE_BUCKETSIZE_IN_MB"
    env._warned.discard(name)
    with pytest.warns(UserWarning, match=f"{name}='{text}' is not an integer from 1 to 1048576"):
        assert env.get(name, {name: text}) == 512
    env._warned.discard(name)
    assert env.get(name, {name: " 64 "}) == 64 and env.get(name, {name: "1048576"}) == 1 << 20


def test_bad_values_warn_when_the_device_and_the_process_group_read_them(tmp_path: Path) -> None:
    code = ("import warnings, torch, torch.distributed as dist\n"
            "warnings.simplefilter('always')\n"
            "dist.init_process_group('neuron', store=dist.HashStore(), rank=0, world_size=1)\n"
            "print(torch.neuron.launch_blocking(), torch.ones(2, device='neuron').sum().item())\n")
    bad = {"NEURON_LAUNCH_BLOCKING": "maybe", "TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS": "2",
           "COLLECTIVE_BUCKETSIZE_IN_MB": "-5", "NEURON_USE_SPLIT_ALLGATHER": "yes please",
           "NEURON_USE_SPLIT_REDUCE_SCATTER": "garbage"}
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**base, **bad})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "2.0"]
    for name, text in bad.items():
        assert f"{name}={text!r} is not" in r.stderr, (name, r.stderr)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**base, "NEURON_LAUNCH_BLOCKING": "1"})
    assert r.returncode == 0 and r.stdout.split() == ["True", "2.0"], r.stderr


def test_disable_neff_cache_goes_through_the_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch_neuronx.compile import cache

    monkeypatch.setenv("TORCH_NEURONX_DISABLE_NEFF_CACHE", "garbage")
    env._warned.discard("TORCH_NEURONX_DISABLE_NEFF_CACHE")
    with pytest.warns(UserWarning, match="TORCH_NEURONX_DISABLE_NEFF_CACHE='garbage' is not 1 or 0"):
        assert cache.enabled()  # the default: cache on
    env._warned.discard("TORCH_NEURONX_DISABLE_NEFF_CACHE")
    monkeypatch.setenv("TORCH_NEURONX_DISABLE_NEFF_CACHE", "yes")
    assert not cache.enabled()


def test_unwritable_debug_dir_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch_neuronx.compile import artifacts

    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS", "1")
    monkeypatch.setenv("TORCH_NEURONX_DEBUG_DIR", str(blocker / "debug"))
    torch._dynamo.reset()
    f = torch.compile(lambda t: t * 3, backend="neuron")
    for _ in range(2):  # the same error each time, never a FileNotFoundError from deep inside
        with pytest.raises(Exception) as info:
            f(torch.ones(2, device="neuron"))
        text = str(info.value)
        assert "TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS=1" in text and "TORCH_NEURONX_DEBUG_DIR=" in text
        assert "Set TORCH_NEURONX_DEBUG_DIR to a writable directory" in text
        # Dynamo wraps a backend's error (BackendCompilerFailed); the one underneath is ours
        inner = getattr(info.value, "inner_exception", info.value)
        assert isinstance(inner, artifacts.ArtifactsDirectoryError), repr(info.value)
        assert "FileNotFoundError" not in text
    monkeypatch.setenv("TORCH_NEURONX_DEBUG_DIR", str(tmp_path / "debug"))  # fixed: compiles and keeps artifacts
    torch._dynamo.reset()
    assert f(torch.ones(2, device="neuron")).cpu().tolist() == [3.0, 3.0]
    assert (tmp_path / "debug" / "proc_0" / "index.json").exists()
    torch._dynamo.reset()
