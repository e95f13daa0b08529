"""The caching allocator: statistics against a model of it, capacity and out-of-memory, streams, settings."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torch_neuronx import _C
from torch_neuronx.testing.workers import BASE_ENV

MIB = 1 << 20


def size_class(n: int) -> int:
    """TorchNeuron's documented rounding, re-derived: at least 256 bytes; under 16 MiB, each power-of-two
    interval split in 4; from 16 MiB, 512-byte alignment only."""
    if n <= 256:
        return 256
    if n >= 16 * MIB:
        return -(-n // 512) * 512
    upper = 1 << (n - 1).bit_length()
    step = max(upper // 2 // 4, 512)
    return min(upper, -(-n // step) * step)


@pytest.fixture
def clean() -> None:
    torch.neuron.empty_cache()
    torch.neuron.reset_peak_memory_stats()


@pytest.mark.parametrize("n", [1, 255, 256, 257, 511, 512, 1000, 4000, 5000, 65536, 100_000, MIB - 1, MIB,
                               3 * MIB + 5, 16 * MIB - 1, 16 * MIB, 16 * MIB + 1, 100 * MIB + 3])
def test_size_classes(n: int) -> None:
    assert _C._size_class(n) == size_class(n)


def test_stats_count_block_sizes_and_requests(clean: None) -> None:
    base = torch.neuron.memory_allocated()
    a = torch.empty(1000, dtype=torch.float32, device="neuron")  # 4000 bytes: the 4096 class
    stats = torch.neuron.memory_stats()
    assert torch.neuron.memory_allocated() - base == 4096
    b = a * 2  # a host kernel's result becomes device memory without a copy
    assert torch.neuron.memory_allocated() - base == 8192
    assert torch.neuron.memory_reserved() >= torch.neuron.memory_allocated()
    del a
    assert torch.neuron.memory_allocated() - base == 4096
    assert torch.neuron.max_memory_allocated() - base == 8192
    stats = torch.neuron.memory_stats()
    for key in ("active_bytes.all.peak", "reserved_bytes.all.peak", "num_alloc_retries", "num_ooms",
                "segment.small_pool.current", "inactive_split_bytes.all.current", "num_device_alloc"):
        assert key in stats
    free, total = torch.neuron.mem_get_info()
    assert total == 24 << 30 and free == total - torch.neuron.memory_reserved()
    assert torch.accelerator.memory_allocated() == torch.neuron.memory_allocated()
    del b
    assert torch.neuron.memory_allocated() == base


def test_freed_blocks_are_reused_and_empty_cache_returns_them(clean: None) -> None:
    x = torch.empty(3 * MIB // 4, device="neuron")  # 3 MiB: the large pool, in a 20 MiB segment
    ptr = x.data_ptr()
    reserved = torch.neuron.memory_reserved()
    assert reserved >= 20 * MIB
    del x
    assert torch.neuron.memory_reserved() == reserved  # cached, not returned
    y = torch.empty(3 * MIB // 4, device="neuron")
    assert y.data_ptr() == ptr and torch.neuron.memory_stats()["num_device_alloc"] >= 1
    del y
    torch.neuron.empty_cache()
    assert torch.neuron.memory_reserved() == 0 or torch.neuron.memory_reserved() < reserved


def test_small_and_large_pools(clean: None) -> None:
    small = torch.empty(1000, device="neuron")
    large = torch.empty(MIB, device="neuron")  # 4 MiB
    stats = torch.neuron.memory_stats()
    assert stats["allocated_bytes.small_pool.current"] >= 4096
    assert stats["allocated_bytes.large_pool.current"] >= 4 * MIB
    assert stats["segment.small_pool.current"] >= 1 and stats["segment.large_pool.current"] >= 1
    assert stats["reserved_bytes.small_pool.current"] % (2 * MIB) == 0
    del small, large


class _Op:
    def __init__(self, kind: str, size: int = 0, index: int = 0) -> None:
        self.kind, self.size, self.index = kind, size, index

    def __repr__(self) -> str:
        return f"{self.kind}({self.size or self.index})"


_ops = st.one_of(
    st.builds(_Op, st.just("alloc"), st.one_of(st.integers(0, 4096), st.integers(4096, 3 * MIB),
                                               st.integers(3 * MIB, 40 * MIB))),
    st.builds(_Op, st.just("free"), index=st.integers(0, 1000)),
    st.builds(_Op, st.just("empty_cache")),
    st.builds(_Op, st.just("result"), index=st.integers(0, 1000)),  # a host kernel's result (adopted)
)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.lists(_ops, min_size=1, max_size=40))
def test_statistics_follow_a_model_of_the_allocator(ops: list[_Op]) -> None:
    """Random allocations, frees and cache flushes: the statistics are what a model of the allocator says."""
    torch.neuron.empty_cache()
    base_stats = torch.neuron.memory_stats()
    base_alloc, base_req = base_stats["allocated_bytes.all.current"], base_stats["requested_bytes.all.current"]
    live: list[torch.Tensor] = []
    for op in ops:
        if op.kind == "alloc":
            live.append(torch.empty(op.size, dtype=torch.uint8, device="neuron"))
        elif op.kind == "free" and live:
            live.pop(op.index % len(live))
        elif op.kind == "result" and live:
            live.append(live[op.index % len(live)] + 1)  # a fresh result of the same size
        elif op.kind == "empty_cache":
            torch.neuron.empty_cache()
        s = torch.neuron.memory_stats()
        # The model: small-pool blocks (requests under 1 MiB) are exactly their size class; a large-pool block
        # may keep up to 1 MiB more, the remainder of a segment or cached block too small to split off.
        small = [size_class(t.numel()) for t in live if 0 < t.numel() < MIB]
        large = [size_class(t.numel()) for t in live if t.numel() >= MIB]
        model_req = sum(t.numel() for t in live)
        assert s["allocated_bytes.small_pool.current"] - base_stats["allocated_bytes.small_pool.current"] == sum(
            small), ops
        got_large = s["allocated_bytes.large_pool.current"] - base_stats["allocated_bytes.large_pool.current"]
        assert sum(large) <= got_large <= sum(large) + len(large) * MIB, ops
        assert s["requested_bytes.all.current"] - base_req == model_req
        assert s["allocation.all.current"] - base_stats["allocation.all.current"] == sum(1 for t in live if t.numel())
        assert s["reserved_bytes.all.current"] >= s["active_bytes.all.current"] >= s["allocated_bytes.all.current"]
        for pool in ("small_pool", "large_pool"):
            assert s[f"reserved_bytes.{pool}.current"] >= s[f"allocated_bytes.{pool}.current"]
            assert s[f"inactive_split_bytes.{pool}.current"] <= (s[f"reserved_bytes.{pool}.current"]
                                                               - s[f"allocated_bytes.{pool}.current"])
        for key in ("allocated_bytes", "reserved_bytes", "segment", "allocation"):
            k = f"{key}.all"
            assert s[f"{k}.allocated"] - s[f"{k}.freed"] == s[f"{k}.current"]
            assert s[f"{k}.peak"] >= s[f"{k}.current"]
            assert s[f"{key}.small_pool.current"] + s[f"{key}.large_pool.current"] == s[f"{k}.current"]
        free, total = torch.neuron.mem_get_info()
        assert free + s["reserved_bytes.all.current"] == total
    del live
    torch.neuron.empty_cache()
    s = torch.neuron.memory_stats()
    assert s["allocated_bytes.all.current"] == base_alloc


CORE = "neuron:5"  # capacity tests use a core nothing else touches


def test_out_of_memory_report_and_recovery() -> None:
    with torch.neuron.memory.override_hbm_capacity(64 * MIB, device=CORE), torch.neuron.device(CORE):
        torch.neuron.empty_cache()
        keep = torch.empty(10 * MIB, device="neuron")  # 40 MiB
        ooms = torch.neuron.memory_stats()["num_ooms"]
        with pytest.raises(torch.OutOfMemoryError) as info:
            torch.empty(8 * MIB, device="neuron")  # 32 MiB more does not fit in 64
        msg = str(info.value)
        for part in ("neuron:5", "trn2.48xlarge", "33554432 bytes", "64.00 MiB of HBM", "40.00 MiB allocated",
                     "reserved by the allocator but unallocated", "smaller batch", "tensor parallel or FSDP",
                     "activation checkpointing", "torch.neuron.empty_cache()", "TORCH_NEURONX_HBM_PER_CORE"):
            assert part in msg, (part, msg)
        assert torch.neuron.memory_stats()["num_ooms"] == ooms + 1
        # An op whose result would not fit fails the same way, and nothing leaks.
        used = torch.neuron.memory_allocated()
        with pytest.raises(torch.OutOfMemoryError):
            keep * 2
        assert torch.neuron.memory_allocated() == used
        # Once memory is freed, training goes on.
        del keep
        y = torch.ones(8 * MIB, device="neuron")
        assert y.sum().item() == 8 * MIB
        s = torch.neuron.memory_stats()
        assert s["allocated_bytes.all.current"] <= s["reserved_bytes.all.current"] <= 64 * MIB
        del y


def test_a_request_that_fits_only_without_the_cache_retries() -> None:
    with torch.neuron.memory.override_hbm_capacity(48 * MIB, device=CORE), torch.neuron.device(CORE):
        torch.neuron.empty_cache()
        a = torch.empty(5 * MIB, device="neuron")  # 20 MiB in its own segment
        del a  # cached: 20 MiB reserved, nothing allocated
        retries = torch.neuron.memory_stats()["num_alloc_retries"]
        b = torch.empty(8 * MIB, device="neuron")  # 32 MiB: fits only once the cached 20 MiB are returned
        assert torch.neuron.memory_stats()["num_alloc_retries"] == retries + 1
        del b


def test_real_model_that_does_not_fit_fails_like_hardware() -> None:
    # 24 GiB per core: a 7B-parameter model in fp32 (28 GB) cannot be placed on one core.
    with pytest.raises(torch.OutOfMemoryError, match="of HBM"):
        torch.empty(7_000_000_000, dtype=torch.float32, device="neuron")
    assert torch.neuron.memory_stats()["num_ooms"] >= 1


def test_stats_are_per_device(clean: None) -> None:
    before = torch.neuron.memory_allocated(1)
    x = torch.ones(256, device="neuron:1")
    assert torch.neuron.memory_allocated(1) - before == 1024
    assert x.sum().item() == 256
    del x
    assert torch.neuron.memory_allocated(1) == before


def test_untyped_storage_resize_charges_memory(clean: None) -> None:
    t = torch.zeros(100, device="neuron")
    base = torch.neuron.memory_allocated()
    t.untyped_storage().resize_(0)  # FSDP2 frees unsharded parameters this way
    assert torch.neuron.memory_allocated() == base - 512
    t.untyped_storage().resize_(400)
    assert torch.neuron.memory_allocated() == base


def test_record_stream_defers_reuse_to_the_other_stream(clean: None) -> None:
    """As on CUDA: a block freed while another stream uses it is not handed out again until that is safe, and
    blocks are cached per stream."""
    side = torch.neuron.Stream()
    x = torch.empty(4096, device="neuron")
    ptr = x.data_ptr()
    x.record_stream(side)
    del x
    snap = torch.neuron.memory._snapshot()
    states = [b["state"] for s in snap["segments"] for b in s["blocks"] if b["address"] == ptr]
    assert states == ["active_pending_free"]
    assert torch.neuron.memory_stats()["active_bytes.all.current"] >= 16384
    y = torch.empty(4096, device="neuron")  # the next allocation finds the side stream done (work is synchronous)
    assert y.data_ptr() == ptr
    with torch.neuron.stream(side):
        z = torch.empty(4096, device="neuron")  # another stream's allocation never takes this stream's blocks
    assert z.data_ptr() != y.data_ptr()
    ptr_z = z.data_ptr()
    del z
    w = torch.empty(4096, device="neuron")  # back on the default stream: not the side stream's block
    assert w.data_ptr() != ptr_z
    with pytest.raises(RuntimeError, match="neuron stream"):
        w.record_stream(torch.Stream(device="cpu"))


def test_memory_summary_is_readable() -> None:
    x = torch.ones(10, device="neuron")
    text = torch.neuron.memory_summary()
    assert "Allocated memory" in text and "HBM reserved memory" in text and "24.00 GiB" in text
    assert all(len(line) == 77 for line in text.splitlines()), text
    del x


def test_set_per_process_memory_fraction() -> None:
    try:
        torch.neuron.memory.set_per_process_memory_fraction(0.5, 0)
        assert torch.neuron.mem_get_info(0)[1] == 12 << 30
    finally:
        torch.neuron.memory.set_per_process_memory_fraction(1.0, 0)
    with pytest.raises(ValueError):
        torch.neuron.memory.set_per_process_memory_fraction(1.5, 0)


ALLOC_CONF = r"""
import torch
MIB = 1 << 20
from torch_neuronx import _C
print(_C._size_class(300 * 1024 + 1))                  # roundup_power2_divisions:8
x = torch.empty(40 * MIB // 4, device="neuron")          # a 40 MiB block, over max_split_size
del x
y = torch.empty(19 * MIB // 4, device="neuron")          # under max_split_size: may not take the oversize block
s = torch.neuron.memory_stats()
print(s["max_split_size"] // MIB, s["oversize_segments.current"], s["segment.large_pool.current"])
"""


def test_pytorch_alloc_conf_is_honoured() -> None:
    env = {**BASE_ENV, "PYTORCH_ALLOC_CONF": "max_split_size_mb:32,roundup_power2_divisions:8"}
    r = subprocess.run([sys.executable, "-c", ALLOC_CONF], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    rounded, line = r.stdout.split("\n")[:2]
    assert int(rounded) == 320 * 1024  # (256 KiB, 512 KiB] in 8 steps of 32 KiB
    assert line.split() == ["32", "1", "2"]  # the 40 MiB segment is oversize; the 20 MiB one is not


FORK = r"""
import os, torch
x = torch.ones(1000, device="neuron")
before = torch.neuron.memory_stats()
pid = os.fork()
if pid == 0:
    try:
        torch.ones(3, device="neuron")
    except RuntimeError as e:
        os._exit(7 if "forked subprocess" in str(e) else 1)
    os._exit(0)
_, status = os.waitpid(pid, 0)
y = x * 2
del y
after = torch.neuron.memory_stats()
print(os.waitstatus_to_exitcode(status), after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"],
      float(x.sum()))
"""


def test_forked_child_cannot_use_the_device_and_the_parent_allocator_is_intact() -> None:
    r = subprocess.run([sys.executable, "-c", FORK], env=BASE_ENV, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["7", "True", "1000.0"]


def test_allocations_from_many_threads() -> None:
    import threading

    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for i in range(200):
                t = torch.full((k * 97 + i % 5 * 1000,), float(k), device="neuron")
                assert float((t + 1).sum()) == (k + 1) * t.numel()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    base = torch.neuron.memory_allocated()
    threads = [threading.Thread(target=work, args=(k,)) for k in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and torch.neuron.memory_allocated() == base


@pytest.mark.skipif(os.environ.get("TORCH_NEURONX_SKIP_SLOW") == "1", reason="slow")
def test_oom_snapshot_written_when_asked(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "oom.pickle"
    code = ("import torch\ntry:\n    torch.empty(2**28, device='neuron')\nexcept torch.OutOfMemoryError as e:\n"
            "    print('written to' in str(e))\n")
    env = {**BASE_ENV, "TORCH_NEURONX_HBM_PER_CORE": "256MiB", "TORCH_NEURONX_OOM_SNAPSHOT": str(path)}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr[-2000:]
    import pickle

    snapshot = pickle.loads(path.read_bytes())
    assert set(snapshot) >= {"segments", "device_traces", "allocator_settings"}


SNAPSHOT = r"""
import pickle, sys, torch
from torch.cuda import _memory_viz

def make_weights():
    return torch.empty(3 << 20, device="neuron")  # 12 MiB: a large-pool block

torch.neuron.memory._record_memory_history(max_entries=1000)
w = make_weights()
acts = [torch.ones(1000, device="neuron") for _ in range(3)]  # three 4 KiB blocks of the small pool
del acts[1]
snap = torch.neuron.memory._snapshot()
torch.neuron.memory._dump_snapshot(sys.argv[1])
torch.neuron.memory._record_memory_history(enabled=None)
blocks = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
big = [b for b in blocks if b["size"] == 12 << 20]
assert len(big) == 1 and any(f["name"] == "make_weights" for f in big[0]["frames"]), big
small = [b for b in blocks if b["requested_size"] == 4000]
assert len(small) == 2 and all(b["size"] == 4096 for b in small), small
assert all(isinstance(s["device"], int) for s in snap["segments"])
trace = snap["device_traces"][0]
actions = [e["action"] for e in trace]
assert actions.count("alloc") >= 4 and "free_requested" in actions and "segment_alloc" in actions, actions
assert any(f["name"] == "<listcomp>" or f["name"] == "<module>" for e in trace if e["action"] == "alloc"
           for f in e.get("frames", []))
with open(sys.argv[1], "rb") as f:
    assert pickle.load(f)["segments"]
print(_memory_viz.segsum(snap).splitlines()[0])
print(len(_memory_viz.trace_plot(snap)), len(_memory_viz.segment_plot(snap)))
text = _memory_viz.trace(snap)
print(int("12.0MiB" in text and text.count("[") >= 4 and "del " in text))
"""


def test_snapshot_renders_with_pytorch_memory_viz(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A recorded history renders with PyTorch's own visualiser; blocks and stacks are the ones made."""
    path = tmp_path / "snapshot.pickle"
    r = subprocess.run([sys.executable, "-c", SNAPSHOT, str(path)], env=BASE_ENV, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    summary, plots, trace_ok = r.stdout.strip().splitlines()
    assert "segment" in summary.lower()
    trace_html, segment_html = map(int, plots.split())
    assert trace_html > 1000 and segment_html > 1000  # HTML pages embedding the snapshot for MemoryViz.js
    assert trace_ok == "1"  # the textual trace lists the 12 MiB segment, the blocks carved from it, the free


def test_profiler_reports_neuron_memory_as_device_memory() -> None:
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(256, 256, device="neuron")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], profile_memory=True) as prof:
        y = x @ x
        del y
    mm = next(e for e in prof.key_averages() if e.key == "aten::mm")
    assert mm.device_memory_usage == 256 * 256 * 4 and mm.cpu_memory_usage == 0
    assert "NEURON Mem" in prof.key_averages().table()


def test_memory_timeline_covers_the_device(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json
    import warnings

    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(512, 512, device="neuron")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], profile_memory=True,
                 record_shapes=True, with_stack=True) as prof:
        y = x @ x
        z = y.relu()
        del y, z
    path = tmp_path / "timeline.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        prof.export_memory_timeline(str(path), device="neuron:0")
    times, sizes = json.loads(path.read_text())
    peak = max(sum(column) for column in zip(*sizes, strict=True))
    assert len(times) >= 2 and peak >= 2 * 512 * 512 * 4
