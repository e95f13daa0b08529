"""`torch-neuronx migrate`, proven by training: the migrated corpus scripts train on `neuron` exactly as the
hand-written native versions do.

- single device: the migrated XLA script's losses equal the native script's, bit for bit; its CPU twin
  (`--target cpu`) agrees; its checkpoint loads on a CPU-only process (no torch_neuronx) with the native values;
- two ranks under torchrun: the migrated `xmp.spawn` + `xm.optimizer_step` script and the migrated
  `MpDeviceLoader` + 'xla' process-group script give the losses and weights of a native DDP script, and the
  weights of a one-process full-batch CPU run (the gradients were averaged, as `optimizer_step` did, not summed);
- NxD tensor parallel on two ranks: the migrated ColumnParallelLinear / RowParallelLinear MLP gives the losses of
  a hand-written DTensor version, and of the unsharded model on one CPU process;
- Optimum Neuron SFT with tensor parallelism (marked slow): the migrated NeuronSFTTrainer script gives the losses
  of a hand-written TRL + DistributedConfig one;
- `--check`: the migrated script passes `torch-neuronx check` against its CPU twin.

About 2 minutes on a loaded 2-core machine (torchrun launches run side by side).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from torch_neuronx.testing.workers import Proc, run_processes, torchrun_argv
from torch_neuronx.tools.cli import main as cli_main

CORPUS = Path(__file__).parent / "migrate_corpus"
TIMEOUT = 900.0  # a deadline for hung processes, not a speed assertion


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("migrated")
    # the corpus holds Optimum Neuron / NxD scripts with flagged features: exit code 1, every file written
    assert cli_main(["migrate", str(CORPUS), "--out", str(out / "neuron"), "--quiet"]) == 1
    assert cli_main(["migrate", str(CORPUS), "--out", str(out / "cpu"), "--target", "cpu", "--quiet"]) == 1
    return out


def _run(cmds: list[list[str]], cwd: Path, logs: Path) -> list[Proc]:
    procs = run_processes([(c, {}) for c in cmds], logs, TIMEOUT, cwd=cwd)
    for p in procs:
        assert p.rc == 0 and not p.timed_out, p.log()
    return procs


def _losses(out: Path, rank: int = 0) -> list[float]:
    return json.loads((out / f"losses_rank{rank}.json").read_text())


_LOAD_ON_CPU = """
import json, sys
sys.modules["torch_neuronx"] = None  # a machine without the plugin: importing it would fail
import torch
out = {}
for path in sys.argv[1:]:
    sd = torch.load(path, weights_only=True)  # no map_location: every tensor must already be a CPU tensor
    sd = sd.get("model", sd)
    out[path] = {k: [v.device.type, v.flatten().tolist()] for k, v in sd.items()}
print(json.dumps(out))
"""


def _load_without_plugin(paths: list[Path], logs: Path) -> dict[str, dict[str, list]]:
    env = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    (p,) = run_processes([([sys.executable, "-c", _LOAD_ON_CPU, *map(str, paths)], env)], logs, TIMEOUT)
    assert p.rc == 0, p.log()
    return json.loads(p.out.strip().splitlines()[-1])


def test_single_device_script_trains_as_the_native_one(migrated: Path, tmp_path: Path) -> None:
    a, b, c = tmp_path / "migrated", tmp_path / "native", tmp_path / "cpu_twin"
    py = sys.executable
    _run([[py, str(migrated / "neuron" / "xla_single.py"), "--steps", "4", "--out", str(a)],
          [py, str(CORPUS / "native_single.py"), "--steps", "4", "--out", str(b)],
          [py, str(migrated / "cpu" / "xla_single.py"), "--steps", "4", "--out", str(c)]],
         migrated / "neuron", tmp_path / "logs")
    assert len(_losses(a)) == 4
    assert _losses(a) == _losses(b)  # same ops on the same device: bit for bit
    assert _losses(c) == pytest.approx(_losses(a), rel=1e-5)  # the CPU twin: the portable reference
    loaded = _load_without_plugin([a / "checkpoint.pt", b / "checkpoint.pt"], tmp_path / "logs_load")
    mine, native = loaded[str(a / "checkpoint.pt")], loaded[str(b / "checkpoint.pt")]
    assert mine.keys() == native.keys() == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    assert all(v[0] == "cpu" for v in mine.values())  # xm.save moved everything to the CPU, as the rewrite does
    assert mine == native


def _full_batch_reference(steps: int) -> dict[str, torch.Tensor]:
    """One process on the CPU, the whole global batch per step: what averaged gradients must reproduce."""
    sys.path.insert(0, str(CORPUS))
    try:
        from _data import GLOBAL_BATCH, MLP, dataset
    finally:
        sys.path.remove(str(CORPUS))
    ds = dataset(steps)
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for s in range(steps):
        x, y = ds.tensors[0][s * GLOBAL_BATCH:(s + 1) * GLOBAL_BATCH], ds.tensors[1][s * GLOBAL_BATCH:(s + 1) *
                                                                                      GLOBAL_BATCH]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return {k: v.detach() for k, v in model.state_dict().items()}


def test_two_ranks_average_gradients_as_optimizer_step_did(migrated: Path, tmp_path: Path) -> None:
    steps = 3
    outs = {name: tmp_path / name for name in ("xla_spawn", "xla_torchrun", "native_ddp")}
    cmds = []
    for name, out in outs.items():
        script = (CORPUS / "native_ddp.py") if name == "native_ddp" else migrated / "neuron" / f"{name}.py"
        cmds.append(torchrun_argv("--standalone", "--nproc-per-node", "2", str(script), "--steps", str(steps),
                                  "--out", str(out)))
    _run(cmds, migrated / "neuron", tmp_path / "logs")
    for rank in (0, 1):
        native = _losses(outs["native_ddp"], rank)
        assert len(native) == steps
        for name in ("xla_spawn", "xla_torchrun"):
            assert _losses(outs[name], rank) == pytest.approx(native, rel=1e-6, abs=1e-7), (name, rank)
    assert _losses(outs["native_ddp"], 0) != _losses(outs["native_ddp"], 1)  # each rank saw its own shard
    ckpts = [outs[n] / "checkpoint.pt" for n in outs]
    loaded = _load_without_plugin(ckpts, tmp_path / "logs_load")
    reference = _full_batch_reference(steps)
    for path in ckpts:
        sd = loaded[str(path)]
        assert sd.keys() == reference.keys()  # the model was not wrapped: the keys carry no "module." prefix
        for k, (device, values) in sd.items():
            assert device == "cpu"
            torch.testing.assert_close(torch.tensor(values), reference[k].flatten(), atol=2e-6, rtol=1e-5,
                                       msg=f"{path}: {k}")


def _unsharded_tp_reference(steps: int) -> list[float]:
    """nxd_tp_mlp.py's model and data in one CPU process, nothing sharded: what a right TP plan reproduces."""
    class TPMLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up, self.down = torch.nn.Linear(32, 64), torch.nn.Linear(64, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.down(torch.relu(self.up(x)))

    torch.manual_seed(0)
    model = TPMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(8, 32, generator=g), torch.randint(0, 8, (8,), generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_nxd_tensor_parallel_mlp_trains_as_the_native_dtensor_one(migrated: Path, tmp_path: Path) -> None:
    steps = 3
    mine, native = tmp_path / "nxd", tmp_path / "native"
    _run([torchrun_argv("--standalone", "--nproc-per-node", "2", str(migrated / "neuron" / "nxd_tp_mlp.py"),
                        "--steps", str(steps), "--out", str(mine)),
          torchrun_argv("--standalone", "--nproc-per-node", "2", str(CORPUS / "native_tp_mlp.py"),
                        "--steps", str(steps), "--out", str(native))], migrated / "neuron", tmp_path / "logs")
    reference = _unsharded_tp_reference(steps)
    for rank in (0, 1):
        assert _losses(mine, rank) == _losses(native, rank)
        assert _losses(mine, rank) == pytest.approx(reference, rel=1e-5)


@pytest.mark.slow
def test_optimum_sft_with_tensor_parallelism_trains_as_the_native_one(migrated: Path, tmp_path: Path) -> None:
    """NeuronSFTTrainer + tensor_parallel_size=2, migrated to TRL + DistributedConfig(tp_size=2): the losses of a
    hand-written native script (about a minute: two Hugging Face torchrun launches)."""
    from torch_neuronx.testing import hf as tiny_hf

    model = tiny_hf.save_checkpoint(tmp_path / "model", 128)  # 4 heads, 2 KV heads: divisible by tp 2
    mine, native = tmp_path / "migrated", tmp_path / "native"
    env_cmds = [torchrun_argv("--standalone", "--nproc-per-node", "2", str(script), str(model), str(out), "3")
                for script, out in ((migrated / "neuron" / "optimum_sft_tp.py", mine),
                                    (CORPUS / "native_sft_tp.py", native))]
    _run(env_cmds, migrated / "neuron", tmp_path / "logs")
    assert len(_losses(mine)) == 3
    assert _losses(mine) == _losses(native)


def test_migrate_then_check_against_the_cpu_twin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        code = cli_main(["migrate", str(CORPUS / "xla_single.py"), "--out", str(tmp_path / "m"), "--json",
                         str(tmp_path / "migrate.json"), "--check-out", str(tmp_path / "check"), "--check", "--",
                         "--steps", "3", "--out", str(tmp_path / "run")])
    finally:
        os.chdir(cwd)
    out = capsys.readouterr().out
    assert code == 0, out
    assert (tmp_path / "m" / "xla_single_cpu_reference.py").exists()
    doc = json.loads((tmp_path / "migrate.json").read_text())
    check_json = doc["files"][0]["check_report"]
    check = json.loads(Path(check_json).read_text())
    assert check["verdict"] == "pass", out
    assert "3 losses within tolerance of the reference" in out
