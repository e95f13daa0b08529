"""examples/distributed_tp_fsdp.py runs under torchrun on 4 emulated cores (2 x 2) and learns."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import torch

from torch_neuronx.testing.workers import free_port, rank_env, run_processes, torchrun_argv

REPO = Path(__file__).resolve().parents[2]


def test_tp_fsdp_example_under_torchrun(tmp_path: Path) -> None:
    saved = tmp_path / "full.pt"
    argv = torchrun_argv("--standalone", "--nproc-per-node", "4", str(REPO / "examples" / "distributed_tp_fsdp.py"),
                         "--steps", "4", "--save", str(saved))
    (p,) = run_processes([(argv, {})], tmp_path, timeout=180, cwd=REPO)
    assert p.rc == 0, p.log()
    losses = [float(x) for x in re.findall(r"step\s+\d+\s+loss (\S+)", p.out)]
    assert len(losses) == 4 and losses[-1] < losses[0], p.out
    assert "DeviceMesh((dp=2, tp=2), 'neuron'" in p.out and "rank 0 on neuron:0" in p.out, p.out
    assert "returned a view tensor" not in p.err, p.err
    state = torch.load(saved, weights_only=True)
    assert all(t.device.type == "cpu" for t in state.values())


def test_example_refuses_a_mesh_that_does_not_fit(tmp_path: Path) -> None:
    # one process (as launched with a wrong --nproc-per-node) cannot hold a tp=2 mesh
    env = rank_env(0, 1, free_port())
    argv = [sys.executable, str(REPO / "examples" / "distributed_tp_fsdp.py"), "--tp", "2", "--steps", "1"]
    (p,) = run_processes([(argv, env)], tmp_path, timeout=120, cwd=REPO)
    assert p.rc != 0
    assert "ValueError: mesh 1 x 2 needs 2 processes, but 1 were launched" in p.err, p.err[-3000:]
