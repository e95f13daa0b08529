"""The emulated machine read from the environment, against AWS's published numbers."""

from __future__ import annotations

import pytest

from torch_neuronx.runtime.config import NeuronConfigError, from_environment, parse_bytes, parse_core_list

GIB = 1 << 30


@pytest.mark.parametrize(
    ("instance", "lnc", "cores", "hbm_gib", "chip"),
    [
        ("trn1.2xlarge", None, 2, 16, "trn1"),
        ("trn1.32xlarge", None, 32, 16, "trn1"),
        ("trn1n.32xlarge", None, 32, 16, "trn1n"),
        ("inf2.xlarge", None, 2, 16, "inf2"),
        ("inf2.8xlarge", None, 2, 16, "inf2"),
        ("inf2.24xlarge", None, 12, 16, "inf2"),
        ("inf2.48xlarge", None, 24, 16, "inf2"),
        ("trn2.3xlarge", None, 4, 24, "trn2"),
        ("trn2.3xlarge", "1", 8, 12, "trn2"),
        ("trn2.48xlarge", None, 64, 24, "trn2"),
        ("trn2.48xlarge", "2", 64, 24, "trn2"),
    ],
)
def test_instances(instance: str, lnc: str | None, cores: int, hbm_gib: int, chip: str) -> None:
    env = {"TORCH_NEURONX_INSTANCE_TYPE": instance}
    if lnc:
        env["NEURON_LOGICAL_NC_CONFIG"] = lnc
    cfg = from_environment(env)
    assert cfg.device_count == cores
    assert cfg.hbm_per_core == hbm_gib * GIB
    assert cfg.instance.chip.name == chip
    # The HBM of all logical cores adds up to the instance's HBM.
    assert cfg.logical_cores * cfg.hbm_per_core == cfg.instance.chips * cfg.instance.chip.hbm_bytes


def test_default_is_trn2_48xlarge_lnc2() -> None:
    cfg = from_environment({})
    assert (cfg.instance.name, cfg.lnc, cfg.device_count, cfg.hbm_per_core) == ("trn2.48xlarge", 2, 64, 24 * GIB)


def test_trn2_48xlarge_lnc1_is_capped_at_torch_limit() -> None:
    with pytest.warns(UserWarning, match="at most 127"):
        cfg = from_environment({"NEURON_LOGICAL_NC_CONFIG": "1"})
    assert cfg.logical_cores == 128 and cfg.device_count == 127 and cfg.hbm_per_core == 12 * GIB


def test_visible_cores() -> None:
    cfg = from_environment({"NEURON_RT_VISIBLE_CORES": "4-7"})
    assert cfg.visible_cores == (4, 5, 6, 7) and cfg.device_count == 4
    assert parse_core_list("0,2,5-6", 8) == (0, 2, 5, 6)


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"TORCH_NEURONX_INSTANCE_TYPE": "p5.48xlarge"}, "not a known instance"),
        ({"TORCH_NEURONX_INSTANCE_TYPE": "trn1.2xlarge", "NEURON_LOGICAL_NC_CONFIG": "2"}, "needs Trn2"),
        ({"NEURON_LOGICAL_NC_CONFIG": "3"}, "must be 1 or 2"),
        ({"NEURON_RT_VISIBLE_CORES": "70"}, "only 64 logical"),
        ({"NEURON_RT_VISIBLE_CORES": "3-1"}, "empty"),
        ({"NEURON_RT_VISIBLE_CORES": "a"}, "core ids or ranges"),
        ({"NEURON_RT_VISIBLE_CORES": "1,1"}, "twice"),
        ({"TORCH_NEURONX_HBM_PER_CORE": "lots"}, "TORCH_NEURONX_HBM_PER_CORE.*as a size"),
        ({"TORCH_NEURONX_HBM_PER_CORE": "99999999T"}, "TORCH_NEURONX_HBM_PER_CORE.*between 1 byte"),
        ({"TORCH_NEURONX_HBM_PER_CORE": "0"}, "TORCH_NEURONX_HBM_PER_CORE.*between 1 byte"),
        ({"TORCH_NEURONX_HBM_PER_CORE": "0.1"}, "TORCH_NEURONX_HBM_PER_CORE.*between 1 byte"),
        ({"NEURON_RT_VISIBLE_CORES": "0-99999999999"}, "names core 64.*only 64 logical"),
        ({"NEURON_RT_VISIBLE_CORES": "99999999999999999999"}, "only 64 logical"),
    ],
)
def test_bad_environment_is_explained(env: dict[str, str], match: str) -> None:
    with pytest.raises(NeuronConfigError, match=match):
        from_environment(env)


def test_parse_bytes() -> None:
    assert parse_bytes("1024") == 1024
    assert parse_bytes("256MiB") == 256 << 20
    assert parse_bytes("1.5GiB") == 3 << 29
    assert parse_bytes("2G") == 2 << 30


def test_torchrun_local_rank_binding(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch_neuronx.runtime import torchrun_local_rank

    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert torchrun_local_rank(64) is None  # not launched by torchrun: leave the device alone
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    assert torchrun_local_rank(64) == 3
    with pytest.raises(NeuronConfigError, match="local rank 3.*only 2 NeuronCores"):
        torchrun_local_rank(2)
    assert torchrun_local_rank(1) == 0  # each worker was given its own core


def test_local_rank_that_is_not_a_number_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch_neuronx.runtime import torchrun_local_rank

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    for bad in ("x", "-1", "1.5", ""):
        monkeypatch.setenv("LOCAL_RANK", bad)
        with pytest.raises(NeuronConfigError, match="LOCAL_RANK=.*non-negative integer"):
            torchrun_local_rank(64)


def _import_torch_with(env: dict[str, str], code: str = "import torch; print(torch.neuron.device_count())"):
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=120)


def test_bad_log_level_warns_and_import_torch_still_works() -> None:
    proc = _import_torch_with({"TORCH_NEURONX_LOG_LEVEL": "LOUD"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "64"
    assert "TORCH_NEURONX_LOG_LEVEL='LOUD' is not a level, ignored" in proc.stderr


def test_bad_recompile_threshold_warns_and_keeps_the_default() -> None:
    code = "import torch_neuronx.compile.metrics as m; print(m.recompile_warning_threshold)"
    proc = _import_torch_with({"TORCH_NEURONX_RECOMPILE_WARN_THRESHOLD": "abc"}, code)
    assert proc.returncode == 0 and proc.stdout.strip() == "4", proc.stderr[-2000:]
    assert "TORCH_NEURONX_RECOMPILE_WARN_THRESHOLD='abc'" in proc.stderr
    proc = _import_torch_with({"TORCH_NEURONX_RECOMPILE_WARN_THRESHOLD": "9"}, code)
    assert proc.stdout.strip() == "9"


def test_bad_machine_environment_fails_at_first_use_with_the_variable_named() -> None:
    """`import torch` survives a bad value; using the device raises the explanation, not a pybind TypeError."""
    code = ("import torch\ntry:\n    torch.zeros(1, device='neuron')\n"
            "except Exception as e:\n    print(type(e).__name__, e)")
    proc = _import_torch_with({"TORCH_NEURONX_HBM_PER_CORE": "99999999T"}, code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "TORCH_NEURONX_HBM_PER_CORE" in proc.stdout and "TypeError" not in proc.stdout


def test_hbm_override_nests_and_refuses_nonsense() -> None:
    import torch

    before = torch.neuron.mem_get_info(0)[1]
    with torch.neuron.memory.override_hbm_capacity(8 << 20, device=0):
        assert torch.neuron.mem_get_info(0)[1] == 8 << 20
        with torch.neuron.memory.override_hbm_capacity(4 << 20, device=0):
            assert torch.neuron.mem_get_info(0)[1] == 4 << 20
        assert torch.neuron.mem_get_info(0)[1] == 8 << 20  # restored to the outer override, not the default
    assert torch.neuron.mem_get_info(0)[1] == before
    for bad in (0, -5, 1.5, True):
        with pytest.raises(ValueError, match="positive number of bytes"):
            with torch.neuron.memory.override_hbm_capacity(bad):  # type: ignore[arg-type]
                pass


def test_free_memory_is_never_negative_below_what_is_in_use() -> None:
    import torch

    keep = torch.empty(1 << 20, device="neuron:0")  # 4 MiB
    with torch.neuron.memory.override_hbm_capacity(1 << 20, device=0):
        free, total = torch.neuron.mem_get_info(0)
        assert (free, total) == (0, 1 << 20)
    del keep
