"""torch.neuron's device API against the emulated instance and torch.cuda's conventions."""

from __future__ import annotations

import subprocess
import sys
import threading
import warnings

import pytest
import torch

from torch_neuronx.testing.workers import BASE_ENV

GIB = 1 << 30


def test_module_registered() -> None:
    assert torch._C._get_privateuse1_backend_name() == "neuron"
    assert torch.get_device_module("neuron") is torch.neuron
    assert torch.neuron.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("neuron")
    assert torch._utils._get_available_device_type() == "neuron"


def test_device_count_and_properties_match_default_instance() -> None:
    assert torch.neuron.device_count() == 64  # trn2.48xlarge at LNC=2
    assert torch.accelerator.device_count() == 64
    p = torch.neuron.get_device_properties(0)
    assert p.name == "trn2" and p.total_memory == 24 * GIB and p.instance_type == "trn2.48xlarge"
    assert p.physical_cores_per_logical == 2 and p.logical_cores_per_chip == 4
    assert torch.neuron.get_device_properties(5).chip_index == 1
    assert "neuron" in torch.neuron.get_device_name()  # TorchTitan looks for it
    assert torch.neuron.get_device_capability() == (3, 0)


def test_set_device_and_context_manager() -> None:
    assert torch.neuron.current_device() == 0
    with torch.neuron.device(3):
        assert torch.neuron.current_device() == 3
        t = torch.empty(2, device="neuron")
        assert t.device == torch.device("neuron:3")
    assert torch.neuron.current_device() == 0
    torch.neuron.set_device("neuron:1")
    try:
        assert torch.accelerator.current_device_index() == 1
    finally:
        torch.neuron.set_device(0)


def test_current_device_is_per_thread() -> None:
    seen: list[int] = []

    def worker() -> None:
        torch.neuron.set_device(2)
        seen.append(torch.neuron.current_device())

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == [2] and torch.neuron.current_device() == 0


def test_invalid_device_index_raises() -> None:
    with pytest.raises((RuntimeError, IndexError), match="neuron:64"):
        torch.empty(2, device="neuron:64")
    with pytest.raises((RuntimeError, IndexError), match="Invalid device"):
        torch.neuron.set_device(100)


def test_amp_dtypes() -> None:
    # TorchNeuron's list (its neuron.py), float32 included
    assert torch.neuron.get_amp_supported_dtype() == [torch.float32, torch.float16, torch.bfloat16]
    assert torch.neuron.is_bf16_supported()


def test_autocast_to_float32_stays_enabled() -> None:
    a = torch.randn(4, 8, dtype=torch.bfloat16)
    b = torch.randn(8, 3, dtype=torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # before: "... not supported ... disabling autocast"
        with torch.autocast("neuron", dtype=torch.float32):
            assert torch.is_autocast_enabled("neuron")
            got = a.to("neuron") @ b.to("neuron")
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.cpu(), a.float() @ b.float())  # the matmul ran in fp32, as autocast asks


def test_stream_helpers_of_torchneuron() -> None:
    event = torch.neuron.record_event()
    assert isinstance(event, torch.Event) and event.query()
    mine = torch.Event(device="neuron")
    assert torch.neuron.record_event(mine) is mine
    torch.neuron.wait_event(event)
    assert torch.neuron.query() is True
    torch.neuron._sleep(1000)
    for bad in (-1, 1.5, True, "10"):
        with pytest.raises(ValueError, match="_sleep"):
            torch.neuron._sleep(bad)


def test_device_name_is_torchneurons() -> None:
    # TorchNeuron's get_device_name: "neuron:{i}" for an int (default 0), str(device) for a torch.device
    assert torch.neuron.get_device_name() == "neuron:0"
    assert torch.neuron.get_device_name(0) == "neuron:0"
    assert torch.neuron.get_device_name(torch.device("neuron:3")) == "neuron:3"
    for bad in ("neuron:0", None, 1.0):
        with pytest.raises(ValueError, match="expected torch.device or int"):
            torch.neuron.get_device_name(bad)
    assert torch.neuron.get_device_properties(0).name == "trn2"  # the descriptive name stays here


def test_set_device_minus_one_raises() -> None:
    # TorchNeuron's set_device raises ValueError for -1 (torch.cuda's ignores it); the device context manager
    # keeps -1 as "no change", as both do
    with pytest.raises(ValueError, match="Invalid device id: -1. Valid range is 0 to 63"):
        torch.neuron.set_device(-1)
    with torch.neuron.device(-1):
        assert torch.neuron.current_device() == 0
    assert torch.neuron.current_device() == 0


def test_set_device_before_use_does_not_initialise() -> None:
    code = ("import torch\ntorch.neuron.set_device(5)\n"
            "print(torch.neuron.is_initialized(), torch.neuron.current_device(), "
            "torch.ones(1, device='neuron').device)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=BASE_ENV, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "5", "neuron:5"]


def test_tensor_module_storage_methods() -> None:
    t = torch.arange(4.0)
    assert t.neuron().device.type == "neuron" and t.neuron().is_neuron
    m = torch.nn.Linear(2, 2).neuron()
    assert m.weight.device.type == "neuron"
    s = torch.UntypedStorage(8).neuron()
    assert s.device.type == "neuron" and s.is_neuron


def test_cli_info_reports_instance(capsys: pytest.CaptureFixture[str]) -> None:
    from torch_neuronx.tools import cli

    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "trn2.48xlarge" in out and "24.00 GiB" in out and "64" in out
    data = cli.collect()
    assert data["hbm_per_core_bytes"] == 24 * GIB and data["visible_cores"] == 64
