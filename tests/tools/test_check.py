"""`torch-neuronx check`: planted faults each caught by the right layer with the right evidence, and jobs
without faults (the repository's examples, a Hugging Face model directory) passing all four layers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from torch_neuronx.tools.check import report
from torch_neuronx.tools.check.run import CheckConfig, check
from torch_neuronx.tools.check.verdicts import LAYERS

REPO = Path(__file__).resolve().parents[2]
FAULTS = Path(__file__).with_name("check_faults.py")


def run_check(tmp_path: Path, command: list[str], **kwargs: Any) -> dict[str, Any]:
    cfg = CheckConfig(command=command, out_dir=tmp_path / "check", progress=False, cwd=tmp_path,
                      timeout=kwargs.pop("timeout", 300), **kwargs)
    doc = check(cfg)
    json.dumps(doc)  # the document is plain JSON
    return doc


def evidence(doc: dict[str, Any], layer: str, verdict: str, check_name: str) -> list[dict[str, Any]]:
    return [e for e in doc["layers"][layer]["evidence"] if e["verdict"] == verdict and e["check"] == check_name]


def fault(tmp_path: Path, name: str, reference: bool = True) -> list[str]:
    return [str(FAULTS), name, "{device}" if reference else "neuron", str(tmp_path)]


def test_a_shape_that_changes_every_step_fails_compilation(tmp_path: Path) -> None:
    doc = run_check(tmp_path, fault(tmp_path, "recompile", reference=False))
    assert doc["layers"]["compilation"]["verdict"] == "fail"
    [e] = evidence(doc, "compilation", "fail", "steady_state_recompile")
    assert e["step"] == 2 and e["count"] == 3 and "dim 0: 5 -> 6" in e["message"], e
    [shapes] = evidence(doc, "compilation", "warn", "distinct_shapes")
    assert shapes["shapes"] == 5 and shapes["observed_lengths"] == [4, 5, 6, 7, 8]
    assert "buckets=[8]" in shapes["message"]
    assert doc["layers"]["correctness"]["verdict"] == "warn"  # no reference: said, not hidden
    assert doc["ranks"][0]["warmup_steps"] == 5 and doc["ranks"][0]["step_time_s"] is None


def test_a_nan_at_step_3_fails_correctness(tmp_path: Path) -> None:
    doc = run_check(tmp_path, fault(tmp_path, "nan"))
    [e] = evidence(doc, "correctness", "fail", "finite_loss")
    assert e["step"] == 3 and e["rank"] == 0
    assert [s["finite"] for s in doc["steps"]] == [True, True, True, False, False]  # NaN weights after step 3
    # The CPU reference has the NaN too: the losses agree (NaN is the fault, not a divergence).
    assert doc["verdict"] == "fail"
    assert doc["layers"]["compilation"]["verdict"] == "pass"


def test_a_checkpoint_with_neuron_only_state_fails_correctness(tmp_path: Path) -> None:
    doc = run_check(tmp_path, fault(tmp_path, "neuron_state"))
    [e] = evidence(doc, "correctness", "fail", "checkpoint")
    assert e["path"] == str(tmp_path / "model.pt") and "neuron" in e["message"]
    assert doc["checkpoints"][0]["loads_on_cpu"] is False
    assert evidence(doc, "correctness", "pass", "loss_vs_reference")


def test_a_clean_checkpoint_loads_on_cpu_with_the_saved_values(tmp_path: Path) -> None:
    doc = run_check(tmp_path, fault(tmp_path, "clean"))
    [e] = evidence(doc, "correctness", "pass", "checkpoint")
    assert "holds exactly the values saved" in e["message"]
    assert doc["verdict"] == "pass", report.text(doc)


def test_a_loss_that_leaves_the_reference_fails_correctness(tmp_path: Path) -> None:
    doc = run_check(tmp_path, fault(tmp_path, "diverge"))
    [e] = evidence(doc, "correctness", "fail", "loss_vs_reference")
    assert e["step"] == 1 and e["rank"] == 0  # step 0 runs before the first update: equal on both
    steps = doc["steps"]
    assert steps[0]["loss"] == pytest.approx(steps[0]["reference_loss"], abs=1e-6)


def test_memory_near_the_core_capacity_warns(tmp_path: Path) -> None:
    doc = run_check(tmp_path, fault(tmp_path, "near_full", reference=False),
                    env={"TORCH_NEURONX_HBM_PER_CORE": "32MiB"})
    [e] = evidence(doc, "operations", "warn", "memory")
    assert e["capacity"] == 32 << 20 and 0.9 < e["peak"] / e["capacity"] <= 1.0, e
    assert "over the 90% line" in e["message"] and doc["layers"]["operations"]["verdict"] == "warn"


def test_a_model_over_the_core_capacity_fails_operations(tmp_path: Path) -> None:
    doc = run_check(tmp_path, fault(tmp_path, "oom", reference=False), env={"TORCH_NEURONX_HBM_PER_CORE": "32MiB"})
    [e] = evidence(doc, "operations", "fail", "oom")
    assert "out of memory" in e["message"].lower() or "ran out of device memory" in e["message"]
    assert "32.00 MiB" in e["message"] and e["log_tail"]


def test_sharding_a_model_twice_fails_distribution(tmp_path: Path) -> None:
    doc = run_check(tmp_path, fault(tmp_path, "double_shard", reference=False), nproc_per_node=2)
    found = evidence(doc, "distribution", "fail", "double_wrap")
    assert {e["rank"] for e in found} == {0, 1}
    assert "fully_shard was applied twice" in found[0]["message"]
    assert doc["layers"]["operations"]["verdict"] == "fail"  # the ranks crashed: reported with their logs


def test_a_mesh_smaller_than_the_world_fails_distribution(tmp_path: Path) -> None:
    doc = run_check(tmp_path, fault(tmp_path, "small_mesh", reference=False), nproc_per_node=2)
    found = evidence(doc, "distribution", "fail", "mesh")
    assert {e["rank"] for e in found} == {0, 1}
    assert found[0]["shape"] == [1] and "ranks [1] are outside it" in found[0]["message"]


def test_a_hanging_job_is_a_reported_failure_not_a_hung_checker(tmp_path: Path) -> None:
    script = tmp_path / "hang.py"
    script.write_text("import time, torch\nx = torch.nn.Linear(2, 2).to('neuron')\n"
                      "opt = torch.optim.SGD(x.parameters(), lr=0.1)\nx(torch.ones(1, 2, device='neuron')).sum()"
                      ".backward()\nopt.step()\nprint('stuck', flush=True)\ntime.sleep(600)\n")
    doc = run_check(tmp_path, [str(script)], timeout=25)
    [e] = evidence(doc, "operations", "fail", "hang")
    assert "25 s deadline" in e["message"] and "step 1" in e["message"] and "stuck" in e["log_tail"]
    assert doc["run"]["timed_out"] and doc["run"]["seconds"] < 40


def test_train_tiny_passes_all_four_layers(tmp_path: Path) -> None:
    doc = run_check(tmp_path, [str(REPO / "examples" / "train_tiny.py"), "--steps", "6", "--device", "{device}"])
    assert {k: v["verdict"] for k, v in doc["layers"].items()} == dict.fromkeys(LAYERS, "pass"), report.text(doc)
    [e] = evidence(doc, "correctness", "pass", "loss_vs_reference")
    assert e["max_abs_diff"] < 1e-4
    assert len(doc["steps"]) == 6 and all(s["tokens"] == 8 * 63 for s in doc["steps"])
    assert doc["ranks"][0]["memory"][0]["peak"] > 0
    page = tmp_path / "report.html"
    report.write_html(doc, page)
    assert page.read_text().count("data:image/png;base64,") == 3


def test_a_hugging_face_model_directory_passes(tmp_path: Path) -> None:
    from torch_neuronx.testing import hf as tiny_hf

    model = tiny_hf.save_checkpoint(tmp_path / "model")
    cfg = CheckConfig(hf_model=str(model), out_dir=tmp_path / "check", progress=False, cwd=tmp_path, timeout=400)
    doc = check(cfg)
    assert {k: v["verdict"] for k, v in doc["layers"].items()} == dict.fromkeys(LAYERS, "pass"), report.text(doc)
    records = {e["name"]: e for e in evidence(doc, "correctness", "pass", "record")}
    assert set(records) == {"probe_logits", "generated_0", "generated_1", "generated_2"}
    assert all(e["max_abs_diff"] == 0 for e in records.values())  # greedy tokens and fp32 logits, exactly
    [ckpt] = evidence(doc, "correctness", "pass", "checkpoint")
    assert "gives the trained model's logits" in ckpt["message"]
    # 4 SFT steps (eager) and 3 generate calls; the static-cache decode graph compiles in the first one only.
    assert len(doc["steps"]) == 7 and doc["ranks"][0]["warmup_steps"] == 5


def test_hf_sft_tp_fsdp_example_passes_all_four_layers(tmp_path: Path) -> None:
    example = str(REPO / "examples" / "hf_sft_tp_fsdp.py")
    doc = run_check(tmp_path, [example, "--steps", "3", "--out", str(tmp_path / "dist")], nproc_per_node=4,
                    reference=[example, "--steps", "3", "--cpu-reference", "--out", str(tmp_path / "cpu")],
                    reference_nproc_per_node=0, timeout=600)
    assert {k: v["verdict"] for k, v in doc["layers"].items()} == dict.fromkeys(LAYERS, "pass"), report.text(doc)
    [layout] = evidence(doc, "distribution", "pass", "layout")
    assert "tp" in layout["message"] and "fully_shard" in layout["message"]
    assert evidence(doc, "correctness", "pass", "loss_vs_reference")


def test_bad_arguments_are_clear_errors(tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "torch_neuronx", "check", *args], capture_output=True,
                              text=True, cwd=tmp_path, timeout=120)

    r = cli("--", "missing.py")
    assert r.returncode == 2 and "missing.py does not exist" in r.stderr
    r = cli("--instance", "trn9.huge", "--", str(FAULTS))
    assert r.returncode == 2 and "not a Neuron instance type" in r.stderr and "trn1.32xlarge" in r.stderr
    r = cli()
    assert r.returncode == 2 and "give either a command" in r.stderr
    r = cli("--hf-model", str(tmp_path))
    assert r.returncode == 2 and "no config.json" in r.stderr
    mine = tmp_path / "out" / "neuron"  # a folder of the user's where the checker would write: never replaced
    mine.mkdir(parents=True)
    (mine / "keep.txt").write_text("mine")
    r = cli("--out", str(tmp_path / "out"), "--", str(FAULTS), "clean", "neuron", str(tmp_path))
    assert r.returncode == 2 and "was not made by torch-neuronx check" in r.stderr
    assert (mine / "keep.txt").read_text() == "mine"


def test_the_probe_is_not_loaded_unless_the_checker_runs() -> None:
    code = ("import sys, torch; print('torch_neuronx.tools.check.probe' in sys.modules, "
            "torch.autograd.backward.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout.split()
    assert out == ["False", "torch.autograd"]


def test_hostile_checker_variables_never_stop_the_job(tmp_path: Path) -> None:
    code = "import torch; x = torch.ones(2, device='neuron'); print('ran', (x + 1).sum().item())"
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    for env in ({"TORCH_NEURONX_CHECK_DIR": str(blocker / "sub")},  # cannot be made: warn, run unwatched
                {"TORCH_NEURONX_CHECK_DIR": str(tmp_path / "ev"), "TORCH_NEURONX_CHECK_LAUNCH_TIME": "banana",
                 "RANK": "x"}):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           env={**os.environ, **env})
        assert r.returncode == 0 and "ran 4.0" in r.stdout, r.stderr[-2000:]
        assert "torch-neuronx check could not watch this process" in r.stderr


@pytest.mark.parametrize("argv,expected", [
    (["--", "a.py", "x"], (["a.py", "x"], None)),
    (["--", "a.py", "--reference", "--", "b.py", "y"], (["a.py"], ["b.py", "y"])),
])
def test_command_line_split(argv: list[str], expected: tuple[list[str], list[str] | None]) -> None:
    from torch_neuronx.tools.check.cli import _split

    assert _split(argv) == expected


def test_wrappers_wrapping_wrappers_are_named() -> None:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from torch_neuronx.tools.check.probe import describe_wrappers

    def ddp(inner: torch.nn.Module) -> torch.nn.Module:  # the wrapper's structure, without a process group
        outer = DistributedDataParallel.__new__(DistributedDataParallel)
        torch.nn.Module.__init__(outer)
        outer.module = inner
        return outer

    model = torch.nn.Linear(2, 2)
    assert describe_wrappers(model)["double_wrapped"] == [] and describe_wrappers(ddp(model))["ddp"] == ["<root>"]
    twice = describe_wrappers(ddp(ddp(model)))
    assert twice["ddp"] == ["<root>", "module"]
    assert twice["double_wrapped"] == ["DDP at <root> wraps DDP at module"]


def test_markers_do_nothing_without_the_checker() -> None:
    import torch

    import torch_neuronx.check as marks
    from torch_neuronx.tools.check import probe

    marks.step(torch.tensor(1.0))
    marks.record("x", torch.ones(2))
    assert probe.active() is None


def _events(tmp_path: Path, steps: list[dict[str, Any]]) -> Any:
    from torch_neuronx.tools.check.results import read_run
    from torch_neuronx.tools.check.run import Side

    events = tmp_path / "ev"
    events.mkdir()
    lines = [{"e": "start", "t": 0.0, "launched": 0.0}, {"e": "first_forward", "t": 1.0}]
    lines += [{"e": "step", "t": 2.0 + i, "i": i, "loss": 1.0, "losses": [1.0], "finite": True, **s}
              for i, s in enumerate(steps)]
    lines.append({"e": "end", "t": 99.0, "compile": {"functions": {}, "graphs": 1}, "wrappers": []})
    (events / "rank0.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n{\"e\": \"st")  # a cut line
    return Side("neuron", ["job"], ranks=read_run(events))


@pytest.mark.parametrize("recompile_at,verdict", [(None, "pass"), (1, "pass"), (2, "fail"), (5, "fail")])
def test_steady_state_starts_after_the_last_compilation(tmp_path: Path, recompile_at: int | None,
                                                        verdict: str) -> None:
    from torch_neuronx.tools.check.verdicts import Thresholds, compilation

    steps: list[dict[str, Any]] = [{"compile": {"graphs": 1, "recompiles": []}}] + [{} for _ in range(5)]
    if recompile_at is not None:
        steps[recompile_at] = {"compile": {"graphs": 1, "recompiles": [{"function": "f", "reason": "x: 1 -> 2"}]}}
    side = _events(tmp_path, steps)
    run = side.ranks[0]
    assert run.warmup_steps == (recompile_at or 0) + 1 and len(run.steady()) == 6 - run.warmup_steps
    assert compilation(side, Thresholds(warmup_steps=2)).verdict == verdict
    st = run.step_time()
    assert (st is None) == (recompile_at == 5) and (st is None or st["p50"] == 1.0)
