"""Memory diagnostics that never crash or mislead: history under threads, stacks of op results, the stream pool,
reuse keys, PYTORCH_ALLOC_CONF (rounding, max_non_split_rounding_mb, errors), forked children, pools, alignment,
torch.cuda's signatures and the single-value getters. Each test is a regression test of issue 20."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch

from torch_neuronx import _C
from torch_neuronx.testing.workers import BASE_ENV

MIB = 1 << 20


def run(code: str, conf: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(BASE_ENV)
    env.pop("PYTORCH_ALLOC_CONF", None)
    if conf is not None:
        env["PYTORCH_ALLOC_CONF"] = conf
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def clean() -> None:
    torch.neuron.memory._record_memory_history(None)
    torch.neuron.empty_cache()
    torch.neuron.reset_peak_memory_stats()


# ---------------------------------------------------------------- crash: history under threads


def test_threaded_stress_of_history_snapshots_streams_and_allocations() -> None:
    """The short form of `python -m torch_neuronx.testing.memory_stress --seconds 60` (on main, glibc aborted
    with "corrupted double-linked list" within a second or two of this mix)."""
    r = run("from torch_neuronx.testing import memory_stress; raise SystemExit(memory_stress.main(['--seconds', '4']))")
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    assert "consistent" in r.stdout


# ---------------------------------------------------------------- stacks of op results


def frames_of_allocs(snapshot: dict) -> list[int]:
    return [len(e.get("frames", [])) for e in snapshot["device_traces"][0] if e["action"] == "alloc"]


def test_op_results_carry_their_stack(clean: None) -> None:
    x = torch.randn(1000, device="neuron")
    torch.neuron.memory._record_memory_history(max_entries=1000, clear_history=True)
    try:
        y = x * 2  # a kernel's result, adopted as device memory
        z = torch.cat([x, y])  # another
        snap = torch.neuron.memory._snapshot()
    finally:
        torch.neuron.memory._record_memory_history(None)
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
    assert len(allocs) == 2
    for e in allocs:
        assert any(f["name"] == "test_op_results_carry_their_stack" for f in e["frames"]), e["frames"][:5]
    live = {b["address"]: b for s in snap["segments"] for b in s["blocks"]}
    assert live[y.data_ptr()]["frames"] and live[z.data_ptr()]["frames"]


def test_every_allocation_of_a_training_step_has_a_stack(clean: None) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.neuron.memory._record_memory_history(clear_history=True)
    try:
        for _ in range(3):
            loss = model(torch.randn(16, 32, device="neuron")).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        snap = torch.neuron.memory._snapshot()
    finally:
        torch.neuron.memory._record_memory_history(None)
    frames = frames_of_allocs(snap)
    assert len(frames) > 40 and all(n > 0 for n in frames), frames


def test_no_stacks_are_gathered_while_recording_is_off(clean: None) -> None:
    torch.neuron.memory._record_memory_history(None)
    x = torch.ones(10, device="neuron") * 3
    torch.neuron.memory._record_memory_history("state", clear_history=True)
    try:
        blocks = {b["address"]: b for s in torch.neuron.memory._snapshot()["segments"] for b in s["blocks"]}
    finally:
        torch.neuron.memory._record_memory_history(None)
    assert blocks[x.data_ptr()]["frames"] == []  # allocated before recording began: no stack, as on CUDA


# ---------------------------------------------------------------- streams


STREAM_CHURN = r"""
import torch
MIB = 1 << 20
torch.ones(1, device="neuron")
with torch.neuron.memory.override_hbm_capacity(1 << 30, 0):
    for _ in range(200):  # a stream per step: on main, 200 cached 20 MiB segments, and retries on a 1 GiB core
        with torch.neuron.stream(torch.neuron.Stream()):
            t = torch.empty(MIB, device="neuron")  # 4 MiB, in a 20 MiB segment of its stream
            del t
    s = torch.neuron.memory_stats()
    print(s["allocated_bytes.all.current"], s["reserved_bytes.all.current"] // MIB, s["num_alloc_retries"])
ids = {torch.neuron.Stream().stream_id for _ in range(100)}
high = {torch.neuron.Stream(priority=-1).stream_id for _ in range(100)}
print(len(ids), len(high), len(ids & high), int(0 in ids | high))
"""


def test_new_streams_come_from_a_pool_and_do_not_strand_the_cache() -> None:
    r = run(STREAM_CHURN)  # a fresh process: the bound below is about this loop's cache alone
    assert r.returncode == 0, r.stderr[-2000:]
    (allocated, reserved_mib, retries), pools = (list(map(int, line.split())) for line in r.stdout.split("\n")[:2])
    # torch.cuda draws from 32 streams per priority: at most one cached 20 MiB segment each (+ the small pool)
    assert allocated < MIB and reserved_mib <= 32 * 20 + 2 and retries == 0, (allocated, reserved_mib, retries)
    assert pools == [32, 32, 0, 0]


def test_a_block_is_reused_only_on_its_own_stream_whatever_the_id(clean: None) -> None:
    s1 = torch.neuron.Stream(stream_id=1, device_index=0, device_type=20)
    far = torch.neuron.Stream(stream_id=65537, device_index=0, device_type=20)  # 1 + 2**16
    with torch.neuron.stream(s1):
        a = torch.empty(MIB, device="neuron")
        ptr = a.data_ptr()
        del a
    with torch.neuron.stream(far):
        b = torch.empty(MIB, device="neuron")
        assert b.data_ptr() != ptr  # the cached block belongs to stream 1
    with torch.neuron.stream(s1):
        c = torch.empty(MIB, device="neuron")
        assert c.data_ptr() == ptr


# ---------------------------------------------------------------- PYTORCH_ALLOC_CONF

SIZE_CLASSES = r"""
from torch_neuronx import _C
MIB = 1 << 20
print(*[_C._size_class(n) for n in (MIB + MIB // 2 + 1, 3 * MIB + 1, 600 * 1024 + 1, 5 * MIB + 3)])
"""


@pytest.mark.parametrize(("conf", "expected"), [
    # c10 looks the divisions up by floor(log2(size)): [1, 2) MiB in 4, [2, 4) MiB in 1 (512-byte steps),
    # every later interval in 4; sizes below 1 MiB use the first interval's
    ("roundup_power2_divisions:[1:4,2:1,>:4]", [7 * MIB // 4, 3 * MIB + 512, 640 * 1024, 6 * MIB]),
    ("roundup_power2_divisions:[>:0]", [3 * MIB // 2 + 512, 3 * MIB + 512, 600 * 1024 + 512, 5 * MIB + 512]),
    # [1, 2) MiB and below in 2, [4, 8) MiB in 8; the interval between keeps the default 4
    ("roundup_power2_divisions:[1:2,4:8]", [2 * MIB, 7 * MIB // 2, 768 * 1024, 5 * MIB + MIB // 2]),
    ("roundup_power2_divisions:2", [2 * MIB, 4 * MIB, 768 * 1024, 6 * MIB]),
    (None, [7 * MIB // 4, 7 * MIB // 2, 640 * 1024, 6 * MIB]),  # TorchNeuron's quarters
])
def test_roundup_power2_divisions_follow_c10(conf: str | None, expected: list[int]) -> None:
    r = run(SIZE_CLASSES, conf)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [int(v) for v in r.stdout.split()] == expected


NON_SPLIT = r"""
import torch
MIB = 1 << 20
big = torch.empty(40 * MIB, dtype=torch.uint8, device="neuron")
ptr = big.data_ptr()
del big
out = []
for n in (36, 25, 19):
    t = torch.empty(n * MIB, dtype=torch.uint8, device="neuron")
    out.append(int(t.data_ptr() == ptr))
    del t
print(*out, torch.neuron.max_memory_reserved() // MIB)
"""


@pytest.mark.parametrize(("conf", "expected"), [
    # c10's default max_non_split_rounding_mb is 20: a cached 40 MiB oversize block serves 36 and 25 MiB,
    # not 19 MiB (under max_split_size: it would split an unsplittable block)
    ("max_split_size_mb:20", "1 1 0 60"),
    ("max_split_size_mb:20,max_non_split_rounding_mb:20", "1 1 0 60"),
    ("max_split_size_mb:20,max_non_split_rounding_mb:1024", "1 1 0 60"),
    ("max_split_size_mb:30,max_non_split_rounding_mb:40", "1 0 0 66"),  # 25 MiB < 30: not from the oversize block
    # values past 18 digits (review r34b: refused as "not at least 20") clamp to the largest size, as c10's
    # parseMaxSplitSize does: no block is oversize then, and the one 40 MiB segment serves 36, 25 and 19 MiB
    ("max_split_size_mb:18446744073709551615", "1 1 1 40"),
    ("max_split_size_mb:99999999999999999999999,max_non_split_rounding_mb:100000000000000000000", "1 1 1 40"),
])
def test_max_non_split_rounding_mb(conf: str, expected: str) -> None:
    r = run(NON_SPLIT, conf)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == expected


BAD_CONF = r"""
import warnings, torch
warnings.simplefilter("always")
for attempt in range(2):
    try:
        torch.empty(10, device="neuron")
        print("ok")
    except ValueError as e:
        print("ValueError", str(e).replace("\n", " "))
"""


@pytest.mark.parametrize(("conf", "key"), [
    ("max_split_size_mb:abc", "max_split_size_mb:abc"),
    ("max_split_size_mb:", "max_split_size_mb:"),
    ("max_split_size_mb", "max_split_size_mb"),
    ("max_split_size_mb:-1", "max_split_size_mb:-1"),
    ("max_split_size_mb:5", "max_split_size_mb:5"),
    ("max_split_size_mb:40,,garbage_collection_threshold:0.5", "empty setting"),
    ("garbage_collection_threshold:1.5", "garbage_collection_threshold:1.5"),
    ("garbage_collection_threshold:nan", "garbage_collection_threshold:nan"),
    ("roundup_power2_divisions:3", "roundup_power2_divisions:3"),
    ("roundup_power2_divisions:[3:4]", "roundup_power2_divisions:[3:4]"),
    ("roundup_power2_divisions:[1:4", "roundup_power2_divisions:[1:4"),
    ("expandable_segments:maybe", "expandable_segments:maybe"),
    (":", "':' is not a valid setting"),  # neither key nor value (issue 34): raised, as docs/memory.md says
    ("bogus_key:", "bogus_key:"),  # an unknown key without a value is malformed too, not merely unknown
])
def test_a_bad_alloc_conf_raises_naming_the_variable_and_key(conf: str, key: str) -> None:
    r = run(BAD_CONF, conf)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith("ValueError PYTORCH_ALLOC_CONF") for line in lines), r.stdout
    assert key in lines[0] and "INTERNAL ASSERT" not in r.stdout + r.stderr and "stoull" not in r.stdout


@pytest.mark.parametrize(("conf", "warned"), [
    ("bogus_key:1", "unknown key"),
    ("expandable_segments:True", "no expandable segments"),
    ("backend:cudaMallocAsync", "one backend"),
    ("pinned_use_cuda_host_register:True", "no meaning"),
])
def test_an_unsupported_alloc_conf_key_warns_once(conf: str, warned: str) -> None:
    r = run(BAD_CONF + "torch.ones(3, device='neuron') + 1\n", conf)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["ok", "ok"]
    assert r.stderr.count("PYTORCH_ALLOC_CONF") == 1 and warned in r.stderr, r.stderr[-2000:]


def test_the_snapshot_reports_the_settings_in_force() -> None:
    r = run("import torch; torch.ones(1, device='neuron'); "
            "s = torch.neuron.memory._snapshot()['allocator_settings']; "
            "print(s['max_split_size'] >> 20, s['max_non_split_rounding_size'] >> 20, "
            "s['roundup_power2_divisions']['2097152'])",
            "max_split_size_mb:64,max_non_split_rounding_mb:32,roundup_power2_divisions:[1:4,2:8]")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["64", "32", "8"]


# ---------------------------------------------------------------- fork, pools, alignment

FORK_OP = r"""
import os, torch
x = torch.ones(1000, device="neuron")
pid = os.fork()
if pid == 0:
    codes = []
    for op in (lambda: x * 3, lambda: x.sum(), lambda: torch.cat([x, x]), lambda: x.clone()):
        try:
            op()
            codes.append("ran")
        except RuntimeError as e:
            codes.append("refused" if "forked subprocess" in str(e) else "other")
    print(*codes, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
print(float((x * 2).sum()))
"""


def test_a_forked_child_cannot_compute_on_the_device() -> None:
    r = run(FORK_OP)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["refused", "refused", "refused", "refused", "2000.0"]


def test_pool_choice_depends_on_the_request_only(clean: None) -> None:
    small = torch.empty(MIB - 1, dtype=torch.uint8, device="neuron")  # small pool, size class 1 MiB
    del small
    before = torch.neuron.memory_stats()
    t = torch.empty(MIB, dtype=torch.uint8, device="neuron")  # 1 MiB: the large pool, whatever is cached
    after = torch.neuron.memory_stats()
    assert after["allocated_bytes.large_pool.current"] - before["allocated_bytes.large_pool.current"] == MIB
    assert after["allocated_bytes.small_pool.current"] == before["allocated_bytes.small_pool.current"]
    del t


def test_blocks_start_on_512_byte_boundaries(clean: None) -> None:
    sizes = [1, 200, 256, 300, 600, 1000, 5000, 70_000, MIB - 1, MIB, 3 * MIB + 7, 17 * MIB + 3]
    live = []
    for i in range(60):
        n = sizes[i % len(sizes)]
        live.append(torch.empty(n, dtype=torch.uint8, device="neuron"))
        if i % 3 == 2:
            live.pop(i % len(live))  # free some, so that merged blocks are reused
        live.append(live[-1] + 1)  # op results too
    for t in live:
        boundary = 256 if _C._size_class(t.numel()) == 256 else 512
        assert t.data_ptr() % boundary == 0, (t.numel(), t.data_ptr() % 512)
    for seg in torch.neuron.memory_snapshot():
        assert seg["address"] % 512 == 0
        address = seg["address"]
        for b in seg["blocks"]:  # only a 256-byte block sits off a boundary, free or not
            assert address % 512 == 0 or b["size"] == 256, (b, address % 512)
            address += b["size"]


# ---------------------------------------------------------------- torch.cuda's signatures, getters


def test_torch_cuda_signatures_are_accepted(tmp_path, clean: None) -> None:  # type: ignore[no-untyped-def]
    mem = torch.neuron.memory
    mem._record_memory_history(enabled="all", context="all", stacks="python", max_entries=100, device=None,
                               clear_history=True, compile_context=True, global_record_annotations=True,
                               skip_actions=["free_requested", "snapshot"])
    try:
        x = torch.ones(100, device="neuron")
        del x
        snap = mem._snapshot(augment_with_fx_traces=True)
        mem._dump_snapshot(str(tmp_path / "s.pickle"), augment_with_fx_traces=True)
    finally:
        mem._record_memory_history(None)
    actions = {e["action"] for e in snap["device_traces"][0]}
    assert "alloc" in actions and "free_completed" in actions
    assert "free_requested" not in actions and "snapshot" not in actions
    assert (tmp_path / "s.pickle").stat().st_size > 0
    assert mem.memory_snapshot(mempool_id=(0, 0), include_traces=False) == mem.memory_snapshot()
    assert torch.neuron.memory_snapshot(mempool_id=None) == mem.memory_snapshot()
    with pytest.raises(ValueError, match="one memory pool"):
        mem.memory_snapshot(mempool_id=(1, 2))
    with pytest.raises(ValueError, match="skip_actions"):
        mem._record_memory_history(skip_actions=["bogus"])
    mem._record_memory_history(True, trace_alloc_max_entries=10)  # the legacy boolean form
    try:
        y = torch.ones(3, device="neuron")
        assert [e["action"] for e in mem._snapshot()["device_traces"][0]][-2:] == ["alloc", "snapshot"]
        del y
    finally:
        mem._record_memory_history(False)


def test_snapshot_events_line_up_with_the_trace(clean: None) -> None:
    torch.neuron.memory._record_memory_history(clear_history=True)
    try:
        x = torch.ones(1000, device="neuron")
        trace = torch.neuron.memory._snapshot()["device_traces"][0]
    finally:
        torch.neuron.memory._record_memory_history(None)
    assert trace[-1]["action"] == "snapshot" and trace[-1]["size"] >= x.untyped_storage().nbytes()


def test_single_value_getters_equal_memory_stats(clean: None) -> None:
    keep = [torch.ones(n, device="neuron") for n in (10, 5000, MIB)]
    del keep[1]
    for device in (None, 0, "neuron:0", torch.device("neuron", 0)):
        s = torch.neuron.memory_stats(device)
        assert torch.neuron.memory_allocated(device) == s["allocated_bytes.all.current"] > 0
        assert torch.neuron.max_memory_allocated(device) == s["allocated_bytes.all.peak"]
        assert torch.neuron.memory_reserved(device) == s["reserved_bytes.all.current"]
        assert torch.neuron.max_memory_reserved(device) == s["reserved_bytes.all.peak"]
    with pytest.raises((IndexError, RuntimeError, ValueError)):
        torch.neuron.memory_allocated(10_000)


def test_warnings_do_not_fire_for_a_clean_configuration() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.ones(3, device="neuron").sum()
