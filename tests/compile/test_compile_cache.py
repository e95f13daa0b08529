"""The compile cache: memory, disk across processes (concurrent ones too), corruption, opt-out."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
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
print(json.dumps({"ok": ok, "seconds": seconds, "cache": torch_neuronx.compile.metrics.snapshot()["cache"],
                  "inductor": dict(torch._dynamo.utils.counters["inductor"])}))
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


@pytest.fixture(scope="module")
def cold_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], Path, Path]:
    """Two processes compile the same model at once into an empty cache: their results, the folder of the cache
    they filled (the disk test then damages it), and an untouched copy of that cache (the read-only test's)."""
    root = tmp_path_factory.mktemp("cold")
    cold = [_result(p) for p in [_start(root), _start(root)]]
    prewarmed = tmp_path_factory.mktemp("prewarmed")
    shutil.copytree(root / "neff", prewarmed / "neff", symlinks=True)
    return cold, root, prewarmed


def test_disk_cache_across_processes_and_corruption(cold_pair: tuple[list[dict], Path, Path]) -> None:
    # Two processes compile the same model at once into an empty cache: both succeed.
    cold, tmp_path, _ = cold_pair
    assert all(r["ok"] for r in cold)
    assert all(r["cache"]["disk_hits"] + r["cache"]["disk_misses"] == 1 for r in cold)

    warm = _result(_start(tmp_path))
    assert warm["ok"] and warm["cache"]["disk_hits"] == 1 and warm["cache"]["disk_misses"] == 0
    # ... and compiled nothing: Inductor loaded every graph from the cache (a count, not a wall-clock margin,
    # which a busy machine breaks)
    assert warm["inductor"].get("fxgraph_cache_miss", 0) == 0 and warm["inductor"].get("fxgraph_cache_hit", 0) > 0, \
        warm["inductor"]
    assert all(r["inductor"].get("fxgraph_cache_miss", 0) + r["inductor"].get("fxgraph_cache_hit", 0) > 0 for r in cold)

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


def _library() -> bytes:
    return Path(torch._C.__file__).read_bytes()  # any real shared library


def test_verify_removes_damaged_and_stale_unsealed_files(tmp_path: Path) -> None:
    data = tmp_path / "inductor" / "ab"
    data.mkdir(parents=True)
    library = _library()
    good, bad = data / "good.so", data / "bad.so"
    before = cache._snapshot(tmp_path / "inductor")
    good.write_bytes(library)
    bad.write_bytes(library)
    cache.seal(tmp_path, before)  # both written "by this compile": sealed
    bad.write_bytes(library[:-100])  # sealed, then truncated
    fresh = data / "entry"
    fresh.write_text("written atomically by a process that has not sealed it yet")
    stale = data / "stale_entry"  # unsealed and old: a process died before sealing it (or it was planted)
    stale.write_text("planted")
    os.utime(stale, (1, 1))
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
        assert cache.verify(tmp_path) == []  # nothing changed: nothing removed again
    assert sorted(removed) == sorted([str(bad), str(cut), str(stale)])
    assert all(p.exists() for p in (good, fresh, whole, busy))
    assert cache.verify(tmp_path) == [str(busy)]  # its writer is gone and it is cut short


def test_seal_covers_only_what_this_compile_wrote(tmp_path: Path) -> None:
    data = tmp_path / "inductor" / "cd"
    data.mkdir(parents=True)
    other = data / "other.main.so"  # another process wrote (and truncated) it before our compile
    other.write_bytes(_library()[:5000])
    before = cache._snapshot(tmp_path / "inductor")
    mine, cut = data / "mine.main.so", data / "mine_cut.main.so"
    mine.write_bytes(_library())
    cut.write_bytes(_library()[:5000])  # this compile's, but incomplete: never sealed
    os.chmod(mine, 0o664)  # a umask of 002
    cache.seal(tmp_path, before)
    seals = tmp_path / "checksums" / "cd"
    assert sorted(p.name for p in seals.iterdir()) == ["mine.main.so.sha256"]
    assert stat.S_IMODE(mine.stat().st_mode) == 0o644  # no longer group-writable


def test_untrusted_entries_are_removed(tmp_path: Path) -> None:
    data = tmp_path / "inductor" / "ef"
    data.mkdir(parents=True)
    before = cache._snapshot(tmp_path / "inductor")
    foreign, writable, target = data / "foreign.py", data / "writable.py", tmp_path / "elsewhere.py"
    for p in (foreign, writable, target):
        p.write_text("x = 1\n")
    cache.seal(tmp_path, before)
    os.chown(foreign, 65534, 65534)  # now owned by someone else
    os.chmod(writable, 0o666)
    link = data / "link.py"
    link.symlink_to(target)
    cache.forget_verification()
    removed = cache.verify(tmp_path)
    assert sorted(removed) == sorted(str(p) for p in (foreign, writable, link))
    assert target.exists()  # a symlink is removed, never followed


@pytest.mark.parametrize("problem", ["not owned", "world-writable", "symlink"])
def test_untrusted_root_is_refused_for_a_private_one(problem: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    if problem == "not owned":
        os.chown(shared, 65534, 65534)
    elif problem == "world-writable":
        os.chmod(shared, 0o777)
    else:
        real = tmp_path / "real"
        real.mkdir(mode=0o700)
        shared.rmdir()
        shared.symlink_to(real)
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(shared))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home"))
    cache.forget_verification()
    with pytest.warns(UserWarning, match="it is not used"):
        root = cache.trusted_root()
    assert root.path == (tmp_path / "home" / "torch_neuronx" / "neff")
    assert stat.S_IMODE(root.path.stat().st_mode) == 0o700
    # When the private default is the refused one, a private temporary directory.
    monkeypatch.delenv("TORCH_NEURONX_NEFF_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home2"))
    (tmp_path / "home2" / "torch_neuronx" / "neff").mkdir(parents=True, mode=0o777)
    os.chmod(tmp_path / "home2" / "torch_neuronx" / "neff", 0o777)
    with pytest.warns(UserWarning, match="private temporary directory"):
        root = cache.trusted_root()
    assert not root.persistent


def test_new_cache_root_is_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path / "a" / "neff"))
    root = cache.trusted_root()
    assert root.persistent and root.writable
    assert stat.S_IMODE(root.path.stat().st_mode) == 0o700


def test_compile_error_is_not_masked_and_nothing_is_sealed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path))
    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")

    def failing() -> None:
        (tmp_path / "inductor" / "half_written.py").write_text("x =")
        raise ValueError("the real compile error")

    with pytest.raises(ValueError, match="the real compile error"):
        cache.compile_with_disk_cache(failing)
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") == previous
    assert not (tmp_path / "checksums").exists()


def _global_modes() -> list[tuple[str, object]]:
    return [
        ("autocast neuron bf16", lambda: torch.autocast("neuron")),
        ("autocast neuron fp16", lambda: torch.autocast("neuron", dtype=torch.float16)),
        ("autocast cpu", lambda: torch.autocast("cpu")),
        ("no grad", torch.no_grad),
        ("deterministic", lambda: _deterministic()),
    ]


@contextlib.contextmanager
def _deterministic() -> Iterator[None]:
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


def test_cache_key_holds_every_mode_that_changes_the_graph(dev: torch.device) -> None:
    """Compile under each mode, then without it: each result must be what eager gives in that mode."""
    x, w = torch.randn(8, 8, device=dev), torch.randn(8, 8, device=dev, requires_grad=True)

    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b

    for name, mode in _global_modes():
        for ctx in (mode, contextlib.nullcontext, mode):
            torch._dynamo.reset()  # Dynamo forgets: only the backend's memory cache could serve
            with ctx():
                got = torch.compile(f, backend="neuron")(x, w)
                want = f(x, w)
            assert got.dtype == want.dtype, name
            assert got.requires_grad == want.requires_grad, name
            torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-2)


def test_compiles_from_threads_keep_global_state(dev: torch.device) -> None:
    """Compiles swap the Inductor cache directory and configuration: under one lock, and restored after."""
    import threading

    import torch._inductor.config as inductor_config

    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    settings = (inductor_config.fx_graph_cache, inductor_config.loop_reindexing_after_fusion)
    x = torch.randn(16, 16, device=dev)
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            fn = torch.compile(lambda t: (t * (k + 1)).tanh(), backend="neuron")
            for _ in range(2):
                torch.testing.assert_close(fn(x), (x * (k + 1)).tanh())
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") == previous
    assert (inductor_config.fx_graph_cache, inductor_config.loop_reindexing_after_fusion) == settings


def _read_only_mount(source: Path, target: Path) -> bool:
    target.mkdir()
    for cmd in (["mount", "--bind", str(source), str(target)], ["mount", "-o", "remount,ro,bind", str(target)]):
        if subprocess.run(cmd, capture_output=True).returncode != 0:
            subprocess.run(["umount", str(target)], capture_output=True)
            return False
    return True


def test_read_only_cache_serves_hits_and_writes_nothing(cold_pair: tuple[list[dict], Path, Path],
                                                         tmp_path: Path) -> None:
    """A pre-warmed cache on a read-only file system: hits come from it, a miss compiles privately."""
    cold, _, prewarmed = cold_pair  # the cache as the two cold processes filled it
    assert all(r["ok"] for r in cold)
    mounted = tmp_path / "ro"
    if not _read_only_mount(prewarmed / "neff", mounted):
        pytest.skip("making a read-only bind mount needs root (CAP_SYS_ADMIN)")
    try:
        files = sorted(str(p) for p in mounted.rglob("*"))
        env = {**_env(tmp_path), "TORCH_NEURONX_NEFF_CACHE_DIR": str(mounted)}
        hit = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
        assert hit.returncode == 0, hit.stderr[-3000:]
        report = json.loads(hit.stdout.strip().splitlines()[-1])
        assert report["ok"] and report["cache"]["disk_hits"] == 1
        assert "is read-only" in hit.stderr
        # A graph the cache lacks: compiled elsewhere, correct, and nothing written.
        miss = subprocess.run([sys.executable, "-c", CHILD.replace("Linear(16, 4)", "Linear(16, 5)")], env=env,
                              capture_output=True, text=True, timeout=300)
        assert miss.returncode == 0, miss.stderr[-3000:]
        report = json.loads(miss.stdout.strip().splitlines()[-1])
        assert report["ok"] and report["cache"]["disk_misses"] == 1
        assert sorted(str(p) for p in mounted.rglob("*")) == files
    finally:
        subprocess.run(["umount", str(mounted)], capture_output=True)


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
    assert cache.cache_dir() == (tmp_path / "torch_neuronx" / "neff")
