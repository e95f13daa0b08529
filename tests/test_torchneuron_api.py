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
    text = "\n".join(p.read_text() for p in root.rglob("*.py")) + "\n".join(
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
