"""The runnable examples: each makes its tiny model on the spot, runs on neuron and compares with CPU."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from torch_neuronx.testing.workers import BASE_ENV

REPO = Path(__file__).resolve().parents[2]


def _run(*argv: str) -> str:
    proc = subprocess.run([sys.executable, *argv], cwd=REPO, env={**BASE_ENV, "HF_HUB_OFFLINE": "1"},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def test_main_job_trains_and_matches_cpu() -> None:
    out = _run("examples/train_tiny.py", "--steps", "6", "--compare-cpu")
    first, last = (float(x) for x in re.search(r"^loss (\S+) -> (\S+) over 6 steps", out, re.M).groups())
    assert last < first, out
    assert float(re.search(r"max \|difference\| (\S+)$", out, re.M).group(1)) < 1e-4, out
    assert "device neuron (" in out and "peak device memory" in out, out


def test_generate_example_matches_cpu() -> None:
    out = _run("examples/hf_generate.py", "--new-tokens", "8", "--compare-cpu")
    assert "neuron (compiled, static cache)" in out and out.rstrip().endswith("match"), out


def test_sft_example_matches_cpu() -> None:
    out = _run("examples/hf_sft.py", "--steps", "3", "--max-length", "128", "--compare-cpu")
    assert "device neuron:0, pad_to_multiple_of 128" in out, out
    neuron = [float(x) for x in re.search(r"^neuron losses: (.*)$", out, re.M).group(1).split()]
    assert len(neuron) == 3 and neuron[-1] < neuron[0], out
    assert float(re.search(r"max \|loss difference\| (\S+)", out).group(1)) < 2e-2, out  # bf16 autocast on both
