"""torch.profiler on the neuron device and TorchNeuron's profiling API (torch_neuronx.profiling), against what
the C++ Kineto registration and TorchNeuron's sources and docs say they do (docs/profiling.md).

The references: a device event lies inside the CPU op that launched it and sits on that op's core; a
collective's event carries the bytes of its tensor; the chrome trace is what Perfetto reads (ph/ts/dur/pid/tid);
the output layout, file names and capture settings are TorchNeuron's (April-2026 source, Neuron docs
how-to-profile-workload). The C++ switch that every op checks (``g_device_profiling``) is read from the loaded
library itself, so "profiler off" is tested where it matters, not inferred.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import struct
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._C._profiler import _ExperimentalConfig
from torch.profiler import ProfilerActivity, profile

import torch_neuronx
from torch_neuronx.profiling import (
    NeuronConfig,
    NeuronProfiler,
    ProfileMode,
    event_type,
    instance_id,
    parse_nc_spec,
)
from torch_neuronx.testing.workers import BASE_ENV

BOTH = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
STAMP = r"\d{8}_\d{6}_\d{3}(_\d+)?"  # NRT's YYYYMMDD_HHMMSS_mmm


@pytest.fixture(autouse=True)
def _two_cores() -> None:
    if torch.neuron.device_count() < 2:
        pytest.skip("needs two NeuronCores (unset NEURON_RT_VISIBLE_CORES)")


def chrome_trace(prof: profile, tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text())


def device_pid(trace: dict[str, Any]) -> Any:
    pids = [
        e["pid"]
        for e in trace["traceEvents"]
        if e.get("ph") == "M" and e.get("name") == "process_name" and e["args"].get("name") == "neuron"
    ]
    assert len(pids) <= 1
    return pids[0] if pids else None


def kernels(trace: dict[str, Any]) -> list[dict[str, Any]]:
    pid = device_pid(trace)
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and pid is not None and e.get("pid") == pid]


def core_tracks(trace: dict[str, Any]) -> dict[int, str]:
    pid = device_pid(trace)
    return {
        e["tid"]: e["args"]["name"]
        for e in trace["traceEvents"]
        if e.get("ph") == "M" and e.get("name") == "thread_name" and e.get("pid") == pid
    }


def assert_perfetto_readable(trace: dict[str, Any]) -> None:
    """What Perfetto's JSON importer needs of each event (Chrome trace event format)."""
    assert isinstance(trace["traceEvents"], list) and trace["traceEvents"]
    for e in trace["traceEvents"]:
        assert e["ph"] in {"X", "M", "i", "s", "f", "B", "E", "C"}, e
        assert "pid" in e, e
        if e["ph"] == "X":
            assert isinstance(e["ts"], int | float) and isinstance(e["dur"], int | float) and e["dur"] >= 0, e
            assert "tid" in e, e


def run_ops() -> None:
    a = torch.randn(32, 32, device="neuron:0")
    b = torch.randn(32, 32, device="neuron:1")
    (a + 1).relu_()
    b.mm(b)
    b.cpu()
    torch.neuron.synchronize()


# ---------------------------------------------------------------- the switch every op reads

_FLAG = b"_ZN13torch_neuronx18g_device_profilingE"  # torch_neuronx::g_device_profiling


def _flag() -> ctypes.c_bool | None:
    """torch_neuronx::g_device_profiling in the loaded _C library, found through its ELF symbol table."""
    so = Path(torch_neuronx._C.__file__).resolve()
    data = so.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1 or not Path("/proc/self/maps").exists():
        return None
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    value = None
    for sec in sections:
        if sec[1] != 2:  # SHT_SYMTAB
            continue
        strtab = sections[sec[6]][4]
        for off in range(sec[4], sec[4] + sec[5], 24):
            st_name, _, _, _, st_value, _ = struct.unpack_from("<IBBHQQ", data, off)
            if data.startswith(_FLAG + b"\0", strtab + st_name):
                value = st_value
    if value is None:
        return None
    starts = [
        int(line.split("-")[0], 16)
        for line in Path("/proc/self/maps").read_text().splitlines()
        if line.endswith(str(so)) and int(line.split()[2], 16) == 0
    ]
    return ctypes.c_bool.from_address(min(starts) + value) if starts else None


def test_device_profiling_flag_is_on_only_while_a_privateuse1_session_records() -> None:
    flag = _flag()
    if flag is None:
        pytest.skip("g_device_profiling is not in the library's symbol table (stripped build)")
    assert flag.value is False
    with profile(activities=BOTH):
        assert flag.value is True
    assert flag.value is False  # profiler off: every op pays one relaxed load and records nothing


def test_neuron_profiler_switches_the_flag_too(tmp_path: Path) -> None:
    flag = _flag()
    if flag is None:
        pytest.skip("g_device_profiling is not in the library's symbol table (stripped build)")
    with NeuronProfiler(neuron_output_dir=str(tmp_path)):  # no pytorch_activities: device events still on
        assert flag.value is True
    assert flag.value is False


def test_cpu_only_profile_in_a_fresh_process_records_no_device_events() -> None:
    script = textwrap.dedent("""
        import json, torch, torch_neuronx
        from torch.profiler import profile, ProfilerActivity
        a = torch.ones(8, device="neuron:0")
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            a.add(1)
        device = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1]
        print(json.dumps({"device": device, "cpu": [e.name for e in prof.events()]}))
    """)
    done = subprocess.run([sys.executable, "-c", script], env=BASE_ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["device"] == [] and "aten::add" in out["cpu"]


def test_cpu_only_profile_after_a_device_session_records_no_device_events(tmp_path: Path) -> None:
    with profile(activities=BOTH):
        run_ops()
    flag = _flag()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        on = flag.value if flag is not None else None
        run_ops()
    assert not [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1]
    assert not kernels(chrome_trace(prof, tmp_path))
    assert all(e.device_time_total == 0 for e in prof.key_averages())
    assert on is not True


# ---------------------------------------------------------------- torch.profiler with PrivateUse1


def test_device_events_sit_on_the_core_and_inside_the_op_that_ran_them(tmp_path: Path) -> None:
    with profile(activities=BOTH) as prof:
        run_ops()
    trace = chrome_trace(prof, tmp_path)
    events = kernels(trace)
    where = {(e["name"], e["tid"], e["args"]["device"]) for e in events}
    assert ("aten::add.Tensor", 0, "neuron:0") in where
    assert ("aten::relu_", 0, "neuron:0") in where
    assert ("aten::mm", 1, "neuron:1") in where
    assert ("aten::_copy_from", 1, "neuron:1") in where  # b.cpu(): the copy reads core 1
    assert not {e["name"] for e in events if e["tid"] == 0} & {"aten::mm"}
    cpu_ops = {e["args"]["External id"]: e for e in trace["traceEvents"] if e.get("cat") == "cpu_op"}
    for e in events:
        op = cpu_ops[e["args"]["External id"]]  # the CPU op that launched it
        assert e["name"].split(".")[0] == op["name"], (e, op)
        assert op["ts"] - 1 <= e["ts"] and e["ts"] + e["dur"] <= op["ts"] + op["dur"] + 1, (e, op)
    device = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1]
    assert {(e.name, e.device_resource_id) for e in device} >= {("aten::mm", 1), ("aten::add.Tensor", 0)}


def test_chrome_trace_has_one_track_per_core_and_perfetto_fields(tmp_path: Path) -> None:
    with profile(activities=BOTH) as prof:
        run_ops()
    trace = chrome_trace(prof, tmp_path)
    assert_perfetto_readable(trace)
    assert core_tracks(trace) == {0: "neuron:0", 1: "neuron:1"}
    assert {e["tid"] for e in kernels(trace)} == {0, 1}
    assert all(e["cat"] == "kernel" for e in kernels(trace))


def test_key_averages_shows_device_time_for_neuron_ops_only() -> None:
    a = torch.randn(64, 64, device="neuron:0")
    c = torch.randn(64, 64)
    with profile(activities=BOTH) as prof:
        a.mm(a)
        c.cos()
    rows = {(r.key, r.device_type): r for r in prof.key_averages()}
    mm = rows[("aten::mm", torch.autograd.DeviceType.PrivateUse1)]
    assert mm.self_device_time_total > 0 and mm.count == 1
    assert rows[("aten::mm", torch.autograd.DeviceType.CPU)].device_time_total > 0  # the CPU op's device time
    cos = rows[("aten::cos", torch.autograd.DeviceType.CPU)]
    assert cos.device_time_total == 0 and cos.cpu_time_total > 0
    assert "NEURON" in prof.key_averages().table(row_limit=5)


def test_compiled_graphs_are_one_device_event_per_execution(tmp_path: Path) -> None:
    """On hardware a compiled graph is one NEFF execution: one device event on its core, linked to the CPU op
    that runs it, counted as NEURON time; the host kernels it calls (here aten::mm.out) are not events of
    their own. Eager runs of the same ops are the reference for the values."""
    f = torch.compile(lambda x: torch.relu(x) * 2 + torch.sin(x), backend="neuron")
    g = torch.compile(lambda x: torch.relu(x @ x) + 1, backend="neuron")
    x = torch.randn(32, 32, device="neuron:1", requires_grad=True)
    f(x), g(x)  # compiled before the session
    with profile(activities=BOTH) as prof:
        outs = [f(x) for _ in range(5)]
        y = g(x)
        y.sum().backward()
    torch.testing.assert_close(outs[-1], torch.relu(x) * 2 + torch.sin(x))
    torch.testing.assert_close(y, torch.relu(x @ x) + 1)
    trace = chrome_trace(prof, tmp_path)
    events = kernels(trace)
    graphs = [e for e in events if e["name"].startswith("neuron::graph")]
    names = sorted(e["name"] for e in graphs)
    assert len([n for n in names if n.endswith("(forward)")]) == 6 and len(names) == 7, names
    assert len([n for n in names if n.endswith("(backward)")]) == 1
    assert all(e["tid"] == 1 and e["args"]["device"] == "neuron:1" for e in graphs)
    assert not any(e["name"].startswith(("aten::mm", "aten::relu", "aten::sin")) for e in events), events
    cpu_ops = {e["args"]["External id"]: e for e in trace["traceEvents"] if e.get("cat") == "cpu_op"}
    for e in graphs:
        op = cpu_ops[e["args"]["External id"]]  # Inductor's "## Call CompiledFxGraph ... ##"
        assert "CompiledFxGraph" in op["name"], op
        assert op["ts"] - 1 <= e["ts"] and e["ts"] + e["dur"] <= op["ts"] + op["dur"] + 1, (e, op)
    rows = [r for r in prof.key_averages() if "CompiledFxGraph" in r.key]
    assert sum(r.count for r in rows) == 7 and all(r.device_time_total > 0 for r in rows)
    with profile(activities=[ProfilerActivity.CPU]) as cpu_only:
        f(x)
    assert not [e for e in cpu_only.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1]


COLLECTIVES = r"""
import json, sys
import torch, torch.distributed as dist
from torch.profiler import ProfilerActivity, profile
dist.init_process_group("neuron", init_method=f"file://{sys.argv[1]}/pg", rank=0, world_size=1)
small = torch.ones(100, device="neuron:0")
big = torch.ones(3, 1000, dtype=torch.bfloat16, device="neuron:0")
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
    dist.all_reduce(small)
    dist.all_reduce(big)
    dist.broadcast(small, 0)
    dist.barrier()
    torch.neuron.synchronize()
prof.export_chrome_trace(f"{sys.argv[1]}/trace.json")
dist.destroy_process_group()
print(json.dumps([small.nbytes, big.nbytes]))
"""


def test_collectives_are_device_events_with_their_bytes(tmp_path: Path) -> None:
    # Its own process: a process group makes the process TorchNeuron's one-core rank (docs/distributed.md), and
    # the device must not have been used before it.
    r = subprocess.run([sys.executable, "-c", COLLECTIVES, str(tmp_path)], env=BASE_ENV, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    small, big = json.loads(r.stdout.strip().splitlines()[-1])
    trace = json.loads((tmp_path / "trace.json").read_text())
    got = [(e["name"], int(e["args"]["bytes"]), e["tid"]) for e in kernels(trace) if e["name"].startswith("c10d::")]
    assert ("c10d::all_reduce", small, 0) in got
    assert ("c10d::all_reduce", big, 0) in got
    assert ("c10d::broadcast", small, 0) in got
    assert ("c10d::barrier", 0, 0) in got
    assert event_type("c10d::all_reduce") == "cc_running" and event_type("c10d::barrier") == "cc_exec_barrier"


# ---------------------------------------------------------------- NeuronProfiler, April-2026 form


def session_dirs(root: Path) -> list[Path]:
    return sorted(root.glob(f"{instance_id()}_pid_{os.getpid()}/*"))


def device_file_events(session: Path) -> dict[int, list[dict[str, Any]]]:
    out = {}
    for f in session.glob("profile_nc_*_session_0.json"):
        data = json.loads(f.read_text())
        assert f.name == f"profile_nc_{data['nc']}_session_0.json"
        out[data["nc"]] = data["events"]
    return out


def test_april_form_writes_pytorch_trace_mapping_and_device_files(tmp_path: Path) -> None:
    out = tmp_path / "output"
    with NeuronProfiler(pytorch_activities=BOTH, record_shapes=True, neuron_output_dir=str(out)) as prof:
        assert prof.is_active() and prof.get_pytorch_trace() is None
        run_ops()
    assert not prof.is_active() and prof.has_pytorch_profiling()
    assert prof.pytorch_trace_file == f"{out}/pytorch_trace.json" == prof.get_pytorch_trace()
    assert prof.get_nrt_output_directory() == str(out)
    trace = json.loads((out / "pytorch_trace.json").read_text())
    assert_perfetto_readable(trace)
    assert core_tracks(trace) == {0: "neuron:0", 1: "neuron:1"}
    assert trace["record_shapes"] == 1
    [session] = session_dirs(out)
    assert re.fullmatch(STAMP, session.name)
    files = device_file_events(session)
    assert {e["name"] for e in files[1]} >= {"aten::mm", "aten::_copy_from"}
    assert {e["type"] for e in files[1]} == {"nc_exec_running", "tensor_copy"}
    assert {"ntrace.json", "trace_info.json"} <= {p.name for p in session.iterdir()}
    assert_perfetto_readable(json.loads((session / "ntrace.json").read_text()))
    [mapping] = out.glob("framework_mapping_*.json")
    assert re.fullmatch(f"framework_mapping_{STAMP}.json", mapping.name)
    rows = json.loads(mapping.read_text())["data"]
    assert {"framework_op": "aten::mm", "device_event": "aten::mm", "nc": 1} in [
        {k: r[k] for k in ("framework_op", "device_event", "nc")} for r in rows
    ]
    exported = tmp_path / "again.json"
    prof.export_pytorch_trace(str(exported))
    assert json.loads(exported.read_text()) == trace


def test_april_form_relative_trace_file_goes_under_the_output_dir(tmp_path: Path) -> None:
    with NeuronProfiler(
        pytorch_activities=[ProfilerActivity.CPU], pytorch_trace_file="sub/mine.json", neuron_output_dir=str(tmp_path)
    ):
        run_ops()
    trace = json.loads((tmp_path / "sub" / "mine.json").read_text())
    assert not kernels(trace)  # CPU only asked for: no device tracks in the PyTorch trace ...
    assert any(e.get("cat") == "cpu_op" for e in trace["traceEvents"])
    [session] = session_dirs(tmp_path)
    assert device_file_events(session)  # ... but the device ("NRT") files are always written


def test_april_form_without_activities_profiles_the_device_only(tmp_path: Path) -> None:
    with NeuronProfiler(neuron_output_dir=str(tmp_path)) as prof:
        run_ops()
    assert not prof.has_pytorch_profiling() and prof.pytorch_trace_file is None and prof.get_pytorch_trace() is None
    assert not list(tmp_path.glob("*.json"))  # neither pytorch_trace.json nor a framework mapping
    [session] = session_dirs(tmp_path)
    assert set(device_file_events(session)) == {0, 1}
    with pytest.raises(ValueError, match="pytorch_activities"):
        prof.export_pytorch_trace(str(tmp_path / "x.json"))


def test_april_form_nc_filter_keeps_only_those_cores(tmp_path: Path) -> None:
    with NeuronProfiler(pytorch_activities=BOTH, neuron_output_dir=str(tmp_path), event_filters={"nc": ["1"]}) as p:
        run_ops()
    trace = json.loads((tmp_path / "pytorch_trace.json").read_text())
    assert core_tracks(trace) == {1: "neuron:1"} and {e["tid"] for e in kernels(trace)} == {1}
    assert set(device_file_events(Path(p.get_session_directory() or ""))) == {1}
    assert set(p.device_events()) == {1}


@pytest.mark.parametrize(
    ("types", "kept"),
    [
        (["nc_exec_running"], {"aten::add.Tensor", "aten::relu_", "aten::mm", "aten::normal_"}),
        (["tensor_copy"], {"aten::_copy_from"}),
        (["aten::mm"], {"aten::mm"}),
        (["hardware", "^aten::normal_"], {"aten::add.Tensor", "aten::relu_", "aten::mm"}),
        (["^nc_exec_running"], {"aten::_copy_from"}),
    ],
)
def test_april_form_types_filter(tmp_path: Path, types: list[str], kept: set[str]) -> None:
    with NeuronProfiler(pytorch_activities=BOTH, neuron_output_dir=str(tmp_path), event_filters={"types": types}) as p:
        run_ops()
    trace = json.loads((tmp_path / "pytorch_trace.json").read_text())
    assert {e["name"] for e in kernels(trace)} == kept
    assert {e.name for events in p.device_events().values() for e in events} == kept


@pytest.mark.parametrize(
    ("filters", "message"),
    [
        ({"nc": ["5-2"]}, "empty"),
        ({"nc": ["x"]}, "neither a NeuronCore id"),
        ({"nc": ["0-100000000000"]}, "names NeuronCore 100000000000"),
        ({"nc": [True]}, "not a NeuronCore id"),
        ({"nc": []}, "give NeuronCore ids"),
        ({"cores": ["0"]}, "unknown key"),
        ({"types": "cc_running"}, "non-empty list"),
        ({"types": ["bogus_event"]}, "unknown event type"),
        ({"types": ["^"]}, "not an event type"),
        (["nc", "0"], "give a dict"),
    ],
)
def test_april_form_rejects_bad_filters(filters: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NeuronProfiler(event_filters=filters)


def test_nrt_event_types_we_never_record_warn_instead_of_failing() -> None:
    with pytest.warns(UserWarning, match="nrt_model_switch.*never records"):
        NeuronProfiler(event_filters={"nc": ["0", "4-7"], "types": ["cc_exec_barrier", "nrt_model_switch"]})
    assert parse_nc_spec(["0", "4-7"]) == {0, 4, 5, 6, 7} == parse_nc_spec("0, 4-7") == parse_nc_spec([0, 4, 5, 6, 7])


# ---------------------------------------------------------------- NeuronConfig + exporter, October-2026 form


def test_exporter_writes_the_documented_layout(tmp_path: Path) -> None:
    config = NeuronConfig(modes=[ProfileMode.DEVICE, ProfileMode.RUNTIME], profile_output_dir=str(tmp_path))
    exporter = NeuronProfiler(config)
    with profile(activities=BOTH, experimental_config=config, on_trace_ready=exporter.export_trace):
        run_ops()
    [session] = session_dirs(tmp_path)
    assert session.parent.name == f"{instance_id()}_pid_{os.getpid()}" and re.fullmatch(STAMP, session.name)
    names = {p.name for p in session.iterdir()}
    assert names == {
        "trace.json",
        "trace_info.json",
        "ntrace.json",
        "profile_nc_0_session_0.json",
        "profile_nc_1_session_0.json",
    }
    trace = json.loads((session / "trace.json").read_text())
    assert_perfetto_readable(trace)
    assert core_tracks(trace) == {0: "neuron:0", 1: "neuron:1"}
    info = json.loads((session / "trace_info.json").read_text())
    assert info["modes"] == ["device", "runtime"] and info["max_events_per_nc"] == 1_000_000
    assert sorted(info["files"]) == sorted(names - {"trace.json"})
    assert exporter.get_pytorch_trace() == str(session / "trace.json")


def test_capture_enabled_for_nc_drops_other_cores(tmp_path: Path) -> None:
    config = NeuronConfig(capture_enabled_for_nc="1", profile_output_dir=str(tmp_path))
    exporter = NeuronProfiler(config)
    with profile(activities=BOTH, experimental_config=config, on_trace_ready=exporter.export_trace):
        run_ops()
    [session] = session_dirs(tmp_path)
    trace = json.loads((session / "trace.json").read_text())
    assert core_tracks(trace) == {1: "neuron:1"} and {e["tid"] for e in kernels(trace)} == {1}
    assert set(device_file_events(session)) == {1}
    assert json.loads((session / "trace_info.json").read_text())["filtered_out"] >= 2  # core 0's add and relu_


def test_max_events_per_nc_keeps_the_newest(tmp_path: Path) -> None:
    config = NeuronConfig(max_events_per_nc=3, profile_output_dir=str(tmp_path))
    exporter = NeuronProfiler(config)
    x = torch.zeros(8, device="neuron:0")
    with profile(activities=BOTH, experimental_config=config, on_trace_ready=exporter.export_trace) as prof:
        for _ in range(10):
            x.add_(1)
    [session] = session_dirs(tmp_path)
    recorded = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1]
    assert len(recorded) == 10  # torch.profiler itself keeps everything; the capture cap is on the files
    data = json.loads((session / "profile_nc_0_session_0.json").read_text())
    assert data["dropped"] == 7 and len(data["events"]) == 3
    trace = json.loads((session / "trace.json").read_text())
    assert len(kernels(trace)) == 3
    launches = sorted(
        e["args"]["External id"] for e in trace["traceEvents"] if e.get("cat") == "cpu_op" and e["name"] == "aten::add_"
    )
    assert len(launches) == 10
    kept = sorted(e["args"]["External id"] for e in kernels(trace))
    assert kept == sorted(e["external_id"] for e in data["events"]) == launches[-3:]  # the newest three
    assert json.loads((session / "trace_info.json").read_text())["dropped_per_nc"] == {"0": 7}


def test_host_modes_write_measured_samples(tmp_path: Path) -> None:
    config = NeuronConfig(modes=[ProfileMode.CPU_UTIL, ProfileMode.HOST_MEMORY], profile_output_dir=str(tmp_path))
    with NeuronProfiler(config) as prof:  # the exporter form as a context manager
        x = torch.randn(256, 256, device="neuron:0")
        for _ in range(20):
            x = x.mm(x).tanh()
    prof.close()
    [session] = session_dirs(tmp_path)
    assert {p.name for p in session.iterdir()} == {"trace.json", "trace_info.json", "cpu_util.json", "host_mem.json"}
    cpu = json.loads((session / "cpu_util.json").read_text())
    assert cpu["samples"]
    for row in cpu["samples"]:
        assert row["interval_s"] > 0 and row["process_pct"] >= 0
        if "total_pct" in row:
            assert 0 <= row["total_pct"] <= 100 and len(row["per_cpu_pct"]) == os.cpu_count()
    mem = json.loads((session / "host_mem.json").read_text())
    assert len(mem["samples"]) >= 2
    for row in mem["samples"]:
        assert row["process_peak_rss_bytes"] > 0
        if "mem_total_bytes" in row:
            assert 0 < row["mem_available_bytes"] <= row["mem_total_bytes"]
            assert 0 < row["process_rss_bytes"] <= row["process_peak_rss_bytes"]


def test_neuron_config_is_an_experimental_config_with_torchneurons_string() -> None:
    config = NeuronConfig(max_events_per_nc=10000, capture_enabled_for_nc="0,1", profile_output_dir="/tmp/traces")
    assert isinstance(config, _ExperimentalConfig)
    assert config.modes == (ProfileMode.DEVICE, ProfileMode.RUNTIME)
    assert "max_events_per_nc:10000;capture_enabled_for_nc:0,1;profile_output_dir:/tmp/traces" in (
        config.custom_profiler_config
    )
    again = NeuronConfig.from_custom_config(config.custom_profiler_config)
    assert again.custom_profiler_config == config.custom_profiler_config
    april = _ExperimentalConfig(
        custom_profiler_config="max_events_per_nc:10000;capture_enabled_for_nc:0,1;profile_output_dir:/tmp/traces"
    )
    exporter = NeuronProfiler(april)  # TorchNeuron's April form of the config
    assert exporter.get_nrt_output_directory() == "/tmp/traces"
    assert NeuronConfig(modes=["device", "CPU_UTIL"]).modes == (ProfileMode.DEVICE, ProfileMode.CPU_UTIL)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"modes": ["bogus"]}, "unknown profile mode"),
        ({"modes": []}, "captures nothing"),
        ({"modes": ProfileMode.DEVICE}, "give a list"),
        ({"capture_enabled_for_nc": "5-2"}, "empty"),
        ({"capture_enabled_for_nc": "0,,1"}, "neither"),
        ({"capture_enabled_for_nc": [0, 1]}, "give a string"),
        ({"max_events_per_nc": 0}, "positive"),
        ({"max_events_per_nc": 1.5}, "positive"),
    ],
)
def test_neuron_config_rejects_bad_settings(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NeuronConfig(**kwargs)


def test_bad_custom_config_and_mixed_forms_fail_clearly() -> None:
    with pytest.raises(ValueError, match="unknown key 'max_events'"):
        NeuronConfig.from_custom_config("max_events:5")
    with pytest.raises(ValueError, match="not 'key:value'"):
        NeuronConfig.from_custom_config("max_events_per_nc")
    with pytest.raises(TypeError, match="takes its settings from the NeuronConfig"):
        NeuronProfiler(NeuronConfig(), record_shapes=True)
    with pytest.raises(TypeError, match="ProfilerActivity"):
        NeuronProfiler(pytorch_activities=["cpu"])  # type: ignore[list-item]


# ---------------------------------------------------------------- misuse


def test_double_start_raises_and_the_session_survives(tmp_path: Path) -> None:
    prof = NeuronProfiler(pytorch_activities=BOTH, neuron_output_dir=str(tmp_path))
    prof.start()
    try:
        with pytest.raises(RuntimeError, match="already active"):
            prof.start()
        with pytest.raises(RuntimeError, match="already active"), prof:  # nested with-block
            pass
        assert prof.is_active()
        run_ops()
    finally:
        prof.stop()
    assert set(prof.device_events()) == {0, 1}
    with pytest.raises(RuntimeError, match="without start"):
        prof.stop()


def test_stop_without_start_raises() -> None:
    with pytest.raises(RuntimeError, match=r"stop\(\) without start"):
        NeuronProfiler().stop()


def test_a_second_profiler_while_torch_profiler_runs_is_refused(tmp_path: Path) -> None:
    with profile(activities=[ProfilerActivity.CPU]), pytest.raises(RuntimeError, match="another torch.profiler"):
        NeuronProfiler(neuron_output_dir=str(tmp_path)).start()


def test_a_region_that_raises_still_stops_and_writes(tmp_path: Path) -> None:
    prof = NeuronProfiler(pytorch_activities=BOTH, neuron_output_dir=str(tmp_path))
    with pytest.raises(ZeroDivisionError), prof:
        torch.ones(4, device="neuron:1").mul_(2)
        _ = 1 / 0
    assert not prof.is_active() and not torch.autograd.profiler._is_profiler_enabled
    trace = json.loads((tmp_path / "pytorch_trace.json").read_text())
    assert {e["name"] for e in kernels(trace)} >= {"aten::mul_.Tensor"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with profile(activities=BOTH):  # the device profiler is free again
            pass


def test_core_ids_are_the_instances_under_visible_cores(tmp_path: Path) -> None:
    """NRT numbers NeuronCores per instance: with NEURON_RT_VISIBLE_CORES=2-3, neuron:1 is NC 3."""
    script = textwrap.dedent(f"""
        import json, torch, torch_neuronx
        from torch_neuronx.profiling import NeuronConfig, NeuronProfiler
        assert torch.neuron.device_count() == 2
        config = NeuronConfig(capture_enabled_for_nc="3", profile_output_dir={str(tmp_path)!r})
        with NeuronProfiler(config) as prof:
            torch.ones(4, device="neuron:0").add_(1)
            torch.ones(4, device="neuron:1").add_(1)
        print(json.dumps({{nc: [(e.name, e.device) for e in ev] for nc, ev in prof.device_events().items()}}))
    """)
    env = {**BASE_ENV, "NEURON_RT_VISIBLE_CORES": "2-3"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    captured = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(captured) == {"3"}  # neuron:0 (NC 2) is not captured
    assert ["aten::add_.Tensor", 1] in captured["3"] and all(device == 1 for _, device in captured["3"])


_CACHED_GRAPHS = textwrap.dedent("""
    import json, torch, torch_neuronx
    from torch.profiler import ProfilerActivity, profile
    from torch_neuronx.compile import metrics
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).to("neuron")
    compiled = torch.compile(model, backend="neuron")
    x = torch.randn(4, 8, device="neuron")
    compiled(x).sum().backward()  # a training graph (forward and backward)
    with torch.no_grad():
        compiled(x)  # an inference graph
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        for _ in range(2):
            compiled(x).sum().backward()
        with torch.no_grad():
            for _ in range(3):
                compiled(x)
    names = [e.name for e in prof.events() if e.name.startswith("neuron::graph")]
    print(json.dumps({"forward": sum(n.endswith("(forward)") for n in names),
                      "backward": sum(n.endswith("(backward)") for n in names),
                      "disk_hits": metrics.snapshot()["cache"]["disk_hits"]}))
""")


def test_graphs_loaded_from_the_compile_cache_are_one_device_event_per_execution(tmp_path: Path) -> None:
    """A second process that loads its graphs from the shared compile cache (training and no_grad graphs)
    records the same device events as the process that compiled them: one per execution."""
    env = {**BASE_ENV, "TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path / "cache"),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", _CACHED_GRAPHS], env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    fresh, cached = runs
    assert fresh["disk_hits"] == 0 and cached["disk_hits"] == 2, runs  # the training and the inference graph
    for run in runs:  # 2 training steps (forward + backward) and 3 no_grad calls
        assert (run["forward"], run["backward"]) == (5, 2), runs
