"""SFTTrainer with TP x FSDP under torchrun on 4 emulated cores (examples/hf_sft_tp_fsdp.py), against one CPU process.

The example shards at load (`from_pretrained(distributed_config=DistributedConfig(tp_size=2, fsdp_size=2))`),
trains, and saves with `trainer.save_model`; the checkpoint must load on CPU in a
process that never imports torch_neuronx and give the trained model's logits.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from torch_neuronx.testing.workers import BASE_ENV, run_processes, torchrun_argv

REPO = Path(__file__).resolve().parents[2]

EXAMPLE = REPO / "examples" / "hf_sft_tp_fsdp.py"
ARGS = ("--steps", "4", "--precision", "fp32")


def _losses(out: str) -> list[float]:
    return [float(x) for x in re.findall(r"^step \d+ loss (\S+)$", out, flags=re.M)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, Path]:
    work = tmp_path_factory.mktemp("sft_tp_fsdp")
    argv = torchrun_argv("--standalone", "--nproc-per-node", "4", str(EXAMPLE), *ARGS, "--out", str(work / "dist"))
    cpu_argv = [sys.executable, str(EXAMPLE), *ARGS, "--cpu-reference", "--out", str(work / "cpu")]
    dist_run, cpu_run = run_processes([(argv, {}), (cpu_argv, {})], work, timeout=420, cwd=REPO)
    assert dist_run.rc == 0, dist_run.log()
    assert cpu_run.rc == 0, cpu_run.log()
    return dist_run.out, cpu_run.out, work / "dist"


def test_weights_are_sharded_at_load_over_the_2x2_mesh(runs: tuple[str, str, Path]) -> None:
    out, _, _ = runs
    lines = sorted(re.findall(r"^rank (\d)/4 on neuron:(\d): q_proj \(128, 128\) (.*)$", out, flags=re.M))
    assert [(r, d) for r, d, _ in lines] == [(str(i), str(i)) for i in range(4)], out
    for _, _, placement in lines:
        # FSDP shards dim 0 of the TP shard: each core holds a quarter of the projection.
        assert placement == "(_StridedShard(dim=0, sf=2), Shard(dim=0)) over ('fsdp', 'tp'), local (32, 128)", out
    assert "the Trainer trained the model Transformers sharded, unwrapped: True" in out, out


def test_losses_match_one_cpu_process(runs: tuple[str, str, Path]) -> None:
    out, cpu_out, _ = runs
    losses, ref = _losses(out), _losses(cpu_out)
    assert len(losses) == 4 and losses[-1] < losses[0], out
    # Same global batch (2 FSDP ranks x 2 rows), same order, fp32: equal up to reduction order.
    assert losses == pytest.approx(ref, abs=1e-4), (losses, ref)


_LOAD_ON_CPU = textwrap.dedent("""
    import sys
    import torch
    from transformers import AutoModelForCausalLM

    final, probe = sys.argv[1], torch.load(sys.argv[2])
    model = AutoModelForCausalLM.from_pretrained(final)
    with torch.no_grad():
        logits = model(probe["input_ids"]).logits
    assert "torch_neuronx" not in sys.modules and not hasattr(torch, "neuron"), "torch_neuronx was loaded"
    print("max_abs_diff", (logits - probe["logits"]).abs().max().item())
""")


def test_saved_checkpoint_loads_on_cpu_without_torch_neuronx(runs: tuple[str, str, Path]) -> None:
    _, _, out_dir = runs
    final = out_dir / "final"
    assert (final / "model.safetensors").exists() and (final / "config.json").exists()
    env = {**BASE_ENV, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", _LOAD_ON_CPU, str(final), str(out_dir / "probe_logits.pt")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    diff = float(proc.stdout.split("max_abs_diff")[1])
    assert diff < 1e-5, proc.stdout
    probe = torch.load(out_dir / "probe_logits.pt")
    assert probe["logits"].shape == (2, 8, 256)


def test_tp_plan_auto_starts_the_process_group_itself(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """Transformers' `tp_plan="auto"` under torchrun, with no init_process_group in the script (job_tp_plan_auto.py):
    choosing a device first leaves the runtime untouched, and every rank's logits equal one CPU process's."""
    job = Path(__file__).resolve().parent / "job_tp_plan_auto.py"
    argv = torchrun_argv("--standalone", "--nproc-per-node", "2", str(job), str(tiny_llama_dir), str(tmp_path))
    (proc,) = run_processes([(argv, {})], tmp_path, timeout=240)
    assert proc.rc == 0, proc.log()
    for rank in range(2):
        r = json.loads((tmp_path / f"rank{rank}.json").read_text())
        other = 1 - rank
        assert r["before"] == {"after_set_device_index": [other, False], "in_device_context": rank,
                               "in_accelerator_context": rank, "after_set_device": [rank, rank],
                               "initialized": False}, r
        assert r["backend"] == "neuron" and r["device"] == f"neuron:{rank}", r
        # 4 heads x 16 over 2 cores: each holds half of q_proj's rows (colwise).
        assert r["q_proj"] == ["DTensor", [32, 64], f"neuron:{rank}"], r
        assert r["max_diff_vs_cpu"] < 1e-5 and r["max_diff_between_ranks"] == 0.0, r
