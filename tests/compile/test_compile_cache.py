"""The compile cache: memory, disk across processes (concurrent ones too), corruption, opt-out."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torch_neuronx.compile as neuron_compile
from torch_neuronx.compile import cache, metrics

# A training step of a small model in a fresh process; prints whether it matched eager, and the metrics.
CHILD = r"""
import json, time, torch
import torch_neuronx.compile
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 4), torch.nn.Tanh()).to("neuron")
x = torch.randn(8, 16, device="neuron")
start = time.perf_counter()
out = torch.compile(model, backend="neuron")(x)
out.square().mean().backward()
seconds = time.perf_counter() - start
grads = [p.grad.clone() for p in model.parameters()]
model.zero_grad()
ref = model(x)
ref.square().mean().backward()
ok = torch.allclose(out, ref, atol=1e-6) and all(
    torch.allclose(g, p.grad, atol=1e-6) for g, p in zip(grads, model.parameters()))
print(json.dumps({"ok": ok, "seconds": seconds, "cache": torch.neuron.get_dynamo_metrics()["cache"]}))
"""


def _env(root: Path) -> dict[str, str]:
    env = {**os.environ, "TORCH_NEURONX_NEFF_CACHE_DIR": str(root / "neff"),
           "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor_default"),
           "TORCHINDUCTOR_COMPILE_THREADS": "1"}  # a few kernels: a compile worker pool costs more than it saves
    env.pop("TORCH_NEURONX_DISABLE_NEFF_CACHE", None)
    return env


def _start(root: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", CHILD], env=_env(root), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen[str]) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_disk_cache_across_processes_and_corruption(tmp_path: Path) -> None:
    # Two processes compile the same model at once into an empty cache: both succeed.
    cold = [_result(p) for p in [_start(tmp_path), _start(tmp_path)]]
    assert all(r["ok"] for r in cold)
    assert all(r["cache"]["disk_hits"] + r["cache"]["disk_misses"] == 1 for r in cold)

    warm = _result(_start(tmp_path))
    assert warm["ok"] and warm["cache"]["disk_hits"] == 1 and warm["cache"]["disk_misses"] == 0
    assert warm["seconds"] < 0.6 * min(r["seconds"] for r in cold), (warm, cold)

    # Truncate a kernel library; garble the cached graphs (AOTAutograd and FX graph entries).
    root = tmp_path / "neff" / "inductor"
    kernel = max(root.rglob("*.main.so"), key=lambda p: p.stat().st_size)
    kernel.write_bytes(kernel.read_bytes()[:1000])
    graphs = [p for d in ("aotautograd", "fxgraph") for p in (root / d).rglob("*") if p.is_file()]
    assert graphs
    for path in graphs:
        path.write_bytes(path.read_bytes()[::-1])
    recovered = _result(_start(tmp_path))
    assert recovered["ok"]
    assert recovered["cache"]["disk_misses"] == 1
    assert set(recovered["cache"]["corrupt_entries_removed"]) == {str(p) for p in [kernel, *graphs]}


def test_verify_removes_damaged_files(tmp_path: Path) -> None:
    data = tmp_path / "inductor" / "ab"
    data.mkdir(parents=True)
    library = Path(torch._C.__file__).read_bytes()  # any real shared library
    good, bad = data / "good.so", data / "bad.so"
    good.write_bytes(library)
    bad.write_bytes(library)
    cache.seal(tmp_path)
    bad.write_bytes(library[:-100])  # sealed, then truncated
    pickle_ = data / "entry"
    pickle_.write_text("written atomically by a process that has not sealed it yet")
    whole, cut = data / "whole.main.so", data / "cut.main.so"  # unsealed libraries
    whole.write_bytes(library)
    cut.write_bytes(library[: len(library) // 2])
    busy = data / "busy.main.so"  # a compiler is still writing it, under Inductor's lock
    busy.write_bytes(library[:100])
    locks = tmp_path / "inductor" / "locks"
    locks.mkdir()
    with open(locks / "busy.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cache.forget_verification()
        removed = cache.verify(tmp_path)
    assert sorted(removed) == sorted([str(bad), str(cut)])
    assert all(p.exists() for p in (good, pickle_, whole, busy))
    assert cache.verify(tmp_path) == []  # once per process and directory


def test_memory_cache_serves_an_identical_graph(dev: torch.device) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.sin() + 1

    x = torch.randn(6, 3, device=dev)
    neuron_compile.compile(f)(x)
    torch._dynamo.reset()  # Dynamo forgets; the backend's memory cache does not
    torch.testing.assert_close(neuron_compile.compile(f)(x), f(x))
    c = metrics.snapshot()["cache"]
    assert c["memory_hits"] == 1 and c["memory_misses"] == 1


def test_cache_can_be_disabled(dev: torch.device, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TORCH_NEURONX_DISABLE_NEFF_CACHE", "1")
    x = torch.randn(5, 3, device=dev)
    for _ in range(2):
        torch._dynamo.reset()
        torch.testing.assert_close(neuron_compile.compile(lambda t: t.exp() - 1)(x), x.exp() - 1)
    c = metrics.snapshot()["cache"]
    assert c["memory_hits"] == c["disk_hits"] == c["disk_misses"] == 0
    assert not any(tmp_path.iterdir())


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TORCH_NEURONX_NEFF_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.cache_dir() == (tmp_path / "torch_neuronx" / "neff").resolve()
