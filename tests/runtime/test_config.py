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
        ({"TORCH_NEURONX_HBM_PER_CORE": "lots"}, "as a size"),
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
    from torch_neuronx.runtime import _torchrun_local_rank

    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert _torchrun_local_rank(64) is None  # not launched by torchrun: leave the device alone
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    assert _torchrun_local_rank(64) == 3
    with pytest.raises(NeuronConfigError, match="local rank 3.*only 2 NeuronCores"):
        _torchrun_local_rank(2)
    assert _torchrun_local_rank(1) == 0  # each worker was given its own core
