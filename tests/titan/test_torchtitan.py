"""TorchTitan 0.3.0 trains, unmodified, on emulated NeuronCores: FSDP2 x TP on 4 processes matches 1 process.

Optional group: skipped unless torchtitan is installed (``bash scripts/install_titan.sh``). Three torchrun jobs,
all ``python -m torchtitan.train --module llama3 --config llama3_debugmodel`` (default FlexAttention, compiled
with the default Inductor backend, forward and backward) through tests/titan/titan_launch.py:

1. a seed checkpoint, made by one process (TorchTitan's own ``--checkpoint.create_seed_checkpoint``): the one
   initial model both runs load: DTensor's RNG offsets reproduce the unsharded init only for row-sharded
   parameters, on neuron as on CUDA, and TP shards its row-wise layers along dim 1;
2. the reference: 1 process, no sharding, local batch 4;
3. 4 processes, ``data_parallel_shard_degree 2`` (FSDP2) x ``tensor_parallel_degree 2``, local batch 2.

Both read the same global batches (tests/titan/titan_assets.py orders each run's data file for its DP degree),
so per-step loss and gradient norm, as TorchTitan logs them, must agree within LOSS_ATOL/GRAD_NORM_ATOL; all 4
ranks must log the same figures; the probe must show Inductor compiled FlexAttention on neuron tensors that need
gradients, on every rank. Measured on a 2-core host: loss agrees to 7e-5, grad norm to 1e-4 (the log's last
digit); about 2 minutes in all (seed ~12 s, reference 25-45 s, 4 processes 45-70 s, mostly Inductor compiles).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torchtitan", reason="optional TorchTitan group: install with `bash scripts/install_titan.sh`")

from titan_assets import write_assets  # noqa: E402

HERE = Path(__file__).resolve().parent
LAUNCH = HERE / "titan_launch.py"
SEQ_LEN, GLOBAL_BATCH, STEPS = 256, 4, 3
DP, TP = 2, 2
HEADS = 16  # llama3 debugmodel
# The reference and FSDP2xTP2 reduce in different orders, with FSDP's default bf16 parameters in both; measured
# differences are <= 5e-5 (loss) and <= 1e-4 (grad norm, logged to 4 decimals). A DP rank reading the wrong
# samples, a gradient reduced over the wrong group or a missed TP all-reduce moves them by 1e-2 or more.
LOSS_ATOL = 1e-3
GRAD_NORM_ATOL = 1e-3
RUN_TIMEOUT_S = 900

COMMON = [
    "--module", "llama3", "--config", "llama3_debugmodel",
    "--training.seq_len", str(SEQ_LEN), "--training.steps", str(STEPS), "--debug.seed", "0",
    # TorchTitan's default spmd_types backend needs a newer torch than 2.13; partial_dtensor is its DTensor one.
    "--parallelism.spmd_backend", "partial_dtensor",
    "--metrics.disable_color_printing",
]
STEP_LINE = re.compile(r"^\[rank(\d+)\]:.*\bstep:\s*(\d+)\s+loss:\s*(\S+)\s+grad_norm:\s*(\S+)")


def _torchrun(name: str, workdir: Path, nproc: int, args: list[str], tmp: Path, probe: bool) -> tuple[str, float]:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_DATASETS_CACHE=str(tmp / "hf_datasets"),
        # A fresh Inductor cache: the probe (a pre-grad pass) sees only graphs Inductor compiles, not cache hits.
        TORCHINDUCTOR_CACHE_DIR=str(tmp / f"inductor-{name}"),
    )
    env.pop("TITAN_PROBE_DIR", None)
    if probe:
        env["TITAN_PROBE_DIR"] = str(tmp / f"probe-{name}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "--role", "rank", "--tee", "3", str(LAUNCH), *COMMON, *args]
    log = tmp / f"{name}.log"
    start = time.monotonic()
    with open(log, "w") as out:
        # Own session, so a timeout takes torchrun's workers down with it.
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"{name} run timed out after {RUN_TIMEOUT_S} s (log {log}):\n{log.read_text()[-6000:]}")
    wall = time.monotonic() - start
    text = log.read_text()
    assert rc == 0, f"{name} run failed (rc {rc}, log {log}):\n{text[-6000:]}"
    return text, wall


def _steps(log: str, nproc: int) -> dict[int, tuple[float, float]]:
    """{step: (loss, grad_norm)}, checking that every rank logged every step with the same figures."""
    by_rank: dict[int, dict[int, tuple[float, float]]] = {}
    for line in log.splitlines():
        m = STEP_LINE.match(line)
        if m:
            rank, step, loss, norm = int(m[1]), int(m[2]), float(m[3]), float(m[4])
            by_rank.setdefault(rank, {})[step] = (loss, norm)
    assert sorted(by_rank) == list(range(nproc)), f"ranks that logged steps: {sorted(by_rank)}"
    first = by_rank[0]
    assert sorted(first) == list(range(1, STEPS + 1)), f"steps logged: {sorted(first)}"
    for rank, steps in by_rank.items():
        assert steps == first, f"rank {rank} logged {steps}, rank 0 logged {first}"
    return first


def _probes(folder: Path, nproc: int) -> list[dict]:
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(nproc)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("titan")
    ref_dir = write_assets(tmp / "ref", SEQ_LEN, GLOBAL_BATCH, STEPS, dp=1)
    dist_dir = write_assets(tmp / "dist", SEQ_LEN, GLOBAL_BATCH, STEPS, dp=DP)
    seed = tmp / "seed"
    _torchrun("seed", ref_dir, 1, ["--training.local_batch_size", str(GLOBAL_BATCH), "--checkpoint.enable",
                                   "--checkpoint.create_seed_checkpoint", "--checkpoint.folder", str(seed)],
              tmp, probe=False)
    load = ["--checkpoint.enable", "--checkpoint.load_only", "--checkpoint.initial_load_path", str(seed / "step-0")]
    ref_log, ref_wall = _torchrun("ref", ref_dir, 1, ["--training.local_batch_size", str(GLOBAL_BATCH), *load],
                                  tmp, probe=True)
    dist_args = ["--training.local_batch_size", str(GLOBAL_BATCH // DP),
                 "--parallelism.data_parallel_shard_degree", str(DP), "--parallelism.tensor_parallel_degree", str(TP)]
    dist_log, dist_wall = _torchrun("dist", dist_dir, DP * TP, [*dist_args, *load], tmp, probe=True)
    result = {
        "ref": {"log": ref_log, "steps": _steps(ref_log, 1), "probes": _probes(tmp / "probe-ref", 1), "wall": ref_wall},
        "dist": {"log": dist_log, "steps": _steps(dist_log, DP * TP), "probes": _probes(tmp / "probe-dist", DP * TP),
                 "wall": dist_wall},
    }
    for name in ("ref", "dist"):
        figures = ", ".join(f"{s}: loss {lo:.5f} grad_norm {gn:.4f}" for s, (lo, gn) in result[name]["steps"].items())
        print(f"torchtitan {name}: {result[name]['wall']:.1f} s; {figures}")
    return result


def test_fsdp2_tp_matches_one_process(runs: dict) -> None:
    ref, dist = runs["ref"]["steps"], runs["dist"]["steps"]
    for step in range(1, STEPS + 1):
        (ref_loss, ref_norm), (loss, norm) = ref[step], dist[step]
        assert math.isfinite(loss) and math.isfinite(norm) and norm > 0, (step, loss, norm)
        assert abs(loss - ref_loss) <= LOSS_ATOL, f"step {step}: loss {loss} vs reference {ref_loss}"
        assert abs(norm - ref_norm) <= GRAD_NORM_ATOL, f"step {step}: grad_norm {norm} vs reference {ref_norm}"
    # Steps 2.. run on the weights the optimizer updated, so they check the updates too. (With random-word data
    # 3 steps do not lower the loss reliably: each step's batch is new text, and the loss moves by ~0.05 anyway.)
    assert len(set(ref.values())) == STEPS, ref


def test_mesh_and_checkpoint_as_configured(runs: dict) -> None:
    log = runs["dist"]["log"]
    assert f"dp_shard={DP}, cp=1, tp={TP}" in log
    assert "Applied FSDP to the model" in log
    assert re.search(r"active dimensions: \[.*'tp'.*'fsdp'.*\]", log), "no tp x fsdp mesh"
    assert f"global batch size {GLOBAL_BATCH}" in log and f"global batch size {GLOBAL_BATCH}" in runs["ref"]["log"]
    for name in ("ref", "dist"):
        assert "Finished loading the checkpoint" in runs[name]["log"], name


@pytest.mark.parametrize("name", ["ref", "dist"])
def test_flex_attention_compiled_on_neuron(runs: dict, name: str) -> None:
    # (batch, heads, seq, head_dim) of the attention each rank runs: TP splits the debugmodel's 16 heads.
    batch, heads = (GLOBAL_BATCH, HEADS) if name == "ref" else (GLOBAL_BATCH // DP, HEADS // TP)
    for report in runs[name]["probes"]:
        assert report["device_type"] == "neuron" and report["current_device"] == report["rank"], report
        calls = report["flex_calls_compiled"]
        assert calls, f"rank {report['rank']}: Inductor compiled no FlexAttention call"
        assert all(c["device"] == "neuron" for c in calls), calls
        assert any(c["requires_grad"] for c in calls), f"no FlexAttention call that needs a backward: {calls}"
        assert all(c["shape"][:3] == [batch, heads, SEQ_LEN] for c in calls), calls
        assert report["neuron_flex_rewrite_installed"], report
