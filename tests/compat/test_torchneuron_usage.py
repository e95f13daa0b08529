"""Scripts written only against TorchNeuron's documented API (scripts/) run here unchanged, each in a fresh
process with only the environment its docstring names, and check the documented results themselves."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).with_name("scripts")
ENV = {
    "preserved_artifacts.py": {"TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS": "1", "TORCH_NEURONX_DEBUG_DIR": "{tmp}"},
    "retain_device.py": {"TORCH_NEURONX_RETAIN_DEVICE_MODE": "1"},
}


@pytest.mark.parametrize("script", sorted(p.name for p in SCRIPTS.glob("*.py")))
def test_torchneuron_script_runs_unchanged(script: str, tmp_path: Path) -> None:
    extra = {k: v.format(tmp=tmp_path) for k, v in ENV.get(script, {}).items()}
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_NEURONX_")} | extra
    env["TORCH_NEURONX_NEFF_CACHE_DIR"] = str(tmp_path / "cache")
    r = subprocess.run([sys.executable, str(SCRIPTS / script)], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]
