"""`torch-neuronx migrate --tp-invariance 2`: a migrated NxD tensor-parallel script at TP = 2 against itself at
TP = 1, the run that shares none of the plan's layout assumptions (so `--check`'s CPU twin cannot stand in).

- the NxD-style block of the corpus (vocabulary-parallel embedding with a positional padding index, fused QKV with
  the output gathered, a skip-bias output projection, a gate/up MLP sharded through to the down projection) gives
  every loss and every gradient of its TP = 1 run, and the padding row gets no gradient on either rank;
- the fault it must catch: the same block with NxD's fused gate/up (`stride=2`, split after the layer). The
  migration flags it (exit 1), and the check shows why: at TP = 2 the gradients differ from TP = 1.

Two multi-process launches (each a torchrun of 2 and of 1 process, side by side), 2 steps of a tiny model.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from torch_neuronx.tools.cli import main as cli_main

CORPUS = Path(__file__).parent / "migrate_corpus"
BLOCK = CORPUS / "nxd_tp_block.py"
SEPARATE = ("        self.gate = ColumnParallelLinear(D, HIDDEN, bias=False, gather_output=False)\n"
            "        self.up = ColumnParallelLinear(D, HIDDEN, bias=False, gather_output=False)\n")
FUSED = "        self.gate_up = ColumnParallelLinear(D, 2 * HIDDEN, bias=False, gather_output=False, stride=2)\n"
SEPARATE_USE = "x = x + self.down(nn.functional.silu(self.gate(x)) * self.up(x))"
FUSED_USE = "gate, up = self.gate_up(x).chunk(2, dim=-1)\n        x = x + self.down(nn.functional.silu(gate) * up)"


def _migrate_and_compare(script: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli_main(["migrate", str(script), "--out", str(out / "migrated"), "--quiet", "--tp-invariance", "2",
                     "--tp-invariance-out", str(out / "tp"), "--", "--steps", "2"])
    return code, capsys.readouterr().out


def test_the_nxd_block_at_tp2_equals_tp1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _migrate_and_compare(BLOCK, tmp_path, capsys)
    assert code == 0, out
    assert "tp-invariance: PASS" in out and "2 losses and 2 steps of gradients on 2 ranks equal" in out
    pad = 1  # the block's padding index: its embedding row gets no gradient, sharded or not
    for record in (tmp_path / "tp" / "tp2" / "rank0.pt", tmp_path / "tp" / "tp2" / "rank1.pt",
                   tmp_path / "tp" / "tp1" / "rank0.pt"):
        grads = torch.load(record, weights_only=True)["grads"]
        embedding = grads[0][0]  # the first parameter: embed.weight, (VOCAB, D)
        assert embedding.shape == (16, 8)
        others = torch.cat([embedding[:pad], embedding[pad + 1:]])
        assert torch.count_nonzero(embedding[pad]) == 0 and torch.count_nonzero(others) > 0


def test_a_fused_strided_gate_up_is_flagged_and_the_check_shows_it(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    source = BLOCK.read_text()
    assert SEPARATE in source and SEPARATE_USE in source
    fused = tmp_path / "nxd_fused.py"
    fused.write_text(source.replace(SEPARATE, FUSED).replace(SEPARATE_USE, FUSED_USE))
    code, out = _migrate_and_compare(fused, tmp_path, capsys)
    assert code == 1, out
    assert "1 flag(s)" in out and "ColumnParallelLinear(stride=...) has no same-meaning native form" in \
        (tmp_path / "migrated" / "nxd_fused.py").read_text()
    assert "tp-invariance: FAIL" in out and "the gradient differs" in out, out
    assert "differ from the TP = 1 run's" in out


SLEEPER = """import time
import torch.distributed as dist
from neuronx_distributed.parallel_layers import parallel_state
dist.init_process_group("xla")
parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
time.sleep(300)
"""


def test_a_signal_stops_every_process_of_the_check(tmp_path: Path) -> None:
    """SIGTERM to `migrate --tp-invariance` while both torchruns and their ranks run: exit 143 with one line, and
    none of its descendants (torchrun agents, ranks, the guardians) is left running."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from torch_neuronx.runtime import processes

    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    cli = subprocess.Popen([sys.executable, "-m", "torch_neuronx.tools.cli", "migrate", str(script), "--out",
                            str(tmp_path / "o"), "--quiet", "--tp-invariance", "2", "--tp-invariance-out",
                            str(tmp_path / "tp")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: dict[int, int | None] = {}  # pid -> its start time (a pid alone may be another process's later)
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline:  # until the 3 ranks (2 + 1) run, under their 2 torchrun agents
            seen.update((p, processes.start_time(p)) for p in processes.descendants(cli.pid) if p not in seen)
            if sum("tp_probe" in processes.command(p) for p in seen) >= 5:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the ranks never started")
        cli.send_signal(signal.SIGTERM)
        _, err = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 128 + signal.SIGTERM and len(err.strip().splitlines()) == 1, err
    assert "every process it started was stopped" in err and "Traceback" not in err
    left = [p for p, start in seen.items() if (st := processes._stat(p)) is not None and st[0] not in ("Z", "X")
            and processes.start_time(p) == start]
    assert left == [], [processes.command(p) for p in left]
    assert os.path.exists(tmp_path / "o" / "sleeper.py")
