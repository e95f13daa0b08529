"""TorchNeuron's profiling API: :class:`NeuronProfiler`, :class:`NeuronConfig` and :class:`ProfileMode`.

Device activity reaches ``torch.profiler`` through the C++ core's Kineto
PrivateUse1 activity profiler (``csrc/runtime/profiler.cpp``): with
``ProfilerActivity.PrivateUse1``, every op a NeuronCore runs, every copy and
every collective of the ``neuron`` process group becomes a device event on a
per-core track. This module is what TorchNeuron puts on top, in both of its
published forms, so that user code written for either runs unchanged:

* the April-2026 context manager (TorchNeuron's ``torch_neuronx/profiling.py``):
  ``with NeuronProfiler(pytorch_activities=[...], neuron_output_dir=...,
  event_filters={"nc": [...], "types": [...]})``; it writes the PyTorch trace
  to ``pytorch_trace_file`` and the "Neuron Runtime" output (here: the device
  events) under ``neuron_output_dir``;
* the October-2026 exporter (Neuron docs, ``how-to-profile-pytorch``):
  ``profile(..., experimental_config=NeuronConfig(...),
  on_trace_ready=NeuronProfiler(config).export_trace)``, which writes
  ``<profile_output_dir>/<instance-id>_pid_<pid>/<timestamp>/`` with
  ``trace.json`` and the device files.

There is no Neuron Runtime here, so its files are replaced by JSON files of
the same role (see :data:`OUTPUT_FILES`); the capture settings
(``capture_enabled_for_nc``, ``max_events_per_nc``, the ``nc`` and ``types``
filters) are applied to the device events of every file written, the
framework trace included. docs/profiling.md has the details and the sources.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import re
import resource
import socket
import tempfile
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from torch._C._profiler import _ExperimentalConfig
from torch.profiler import ProfilerActivity, profile

__all__ = [
    "EVENT_TYPES",
    "OUTPUT_FILES",
    "DeviceEvent",
    "NRTProfilerError",
    "NeuronConfig",
    "NeuronProfiler",
    "ProfileMode",
    "event_type",
    "parse_nc_spec",
]

logger = logging.getLogger(__name__)

# NRT's default ring-buffer size per NeuronCore (NEURON_RT_INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC, Neuron docs).
DEFAULT_MAX_EVENTS_PER_NC = 1_000_000
# How often CPU_UTIL / HOST_MEMORY sample the host.
SAMPLE_INTERVAL_S = 0.1


class NRTProfilerError(Exception):
    """A profiling session could not be started, stopped or written (TorchNeuron's name for it)."""


class ProfileMode(enum.Enum):
    """What a :class:`NeuronConfig` captures; each mode adds files to the session directory (:data:`OUTPUT_FILES`)."""

    DEVICE = "device"
    RUNTIME = "runtime"
    CPU_UTIL = "cpu_util"
    HOST_MEMORY = "host_memory"


# The files each mode writes into a session directory, with what they hold here (on hardware: .ntff/.neff,
# ntrace.pb + trace_info.pb, cpu_util.pb, host_mem.pb). trace_info.json is written by every session.
OUTPUT_FILES: dict[ProfileMode, str] = {
    ProfileMode.DEVICE: "profile_nc_<nc>_session_0.json: the device events of one NeuronCore",
    ProfileMode.RUNTIME: "ntrace.json: every captured device event as a Chrome trace, one track per NeuronCore",
    ProfileMode.CPU_UTIL: "cpu_util.json: host CPU utilization sampled from /proc/stat",
    ProfileMode.HOST_MEMORY: "host_mem.json: host and process memory sampled from /proc/meminfo",
}

# The NRT system-trace event types the emulated device records, and their group (Neuron docs: "hardware" is
# nc_exec_running, cc_running, cc_exec_barrier, numerical_err, nrt_model_switch, timestamp_sync_point,
# hw_notify; "software" all others). tensor_copy is ours: NRT records host<->device transfers as the runtime
# calls tensor_write / tensor_read, but the C++ copy event does not say which way it went.
EVENT_TYPES: dict[str, str] = {
    "nc_exec_running": "hardware",  # an op (fallback kernel, convolution) run on a NeuronCore
    "cc_running": "hardware",  # a collective of the neuron process group
    "cc_exec_barrier": "hardware",  # c10d barrier
    "tensor_copy": "software",  # aten::_copy_from: host<->device or core<->core
}
# NRT names the emulator never records: a filter naming one is legal and warns that it selects nothing.
_NRT_ONLY_TYPES = frozenset(
    {
        "numerical_err",
        "nrt_model_switch",
        "timestamp_sync_point",
        "hw_notify",
        "model_load",
        "nrt_load",
        "nrt_execute",
        "runtime_execute",
        "tensor_read",
        "tensor_write",
    }
)
_GROUPS = frozenset({"hardware", "software"})


def event_type(name: str) -> str:
    """The NRT event type of a device event, from its name (see :data:`EVENT_TYPES`)."""
    if name == "c10d::barrier":
        return "cc_exec_barrier"
    if name.startswith("c10d::"):
        return "cc_running"
    if name == "aten::_copy_from":
        return "tensor_copy"
    return "nc_exec_running"


# ---------------------------------------------------------------- capture settings


def _instance_cores() -> int:
    from torch_neuronx import runtime

    return runtime.machine().logical_cores


def parse_nc_spec(spec: str | int | Sequence[str | int], what: str = "capture_enabled_for_nc") -> frozenset[int]:
    """NeuronCore ids from ``"0,1,2-5"``, ``["0", "4-7"]`` or ``[0, 4]`` (ranges inclusive, as NRT reads them).

    Ids are the instance's logical NeuronCore ids (what NRT numbers), checked against the emulated instance.
    """
    parts: list[str] = []
    items = [spec] if isinstance(spec, str | int) else spec
    if not isinstance(items, Sequence) or not items:
        raise ValueError(f"{what}={spec!r}: give NeuronCore ids or ranges, e.g. \"0,1,2-5\" or ['0', '4-7']")
    for item in items:
        if isinstance(item, bool) or not isinstance(item, str | int):
            raise ValueError(f"{what}={spec!r}: {item!r} is not a NeuronCore id; use ints or strings like '4-7'")
        parts.extend(str(item).split(",") if isinstance(item, str) else [str(item)])
    limit = _instance_cores()
    cores: set[int] = set()
    for raw in parts:
        part = raw.strip()
        match = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
        if not match:
            raise ValueError(f"{what}={spec!r}: {raw!r} is neither a NeuronCore id nor a range like '2-5'")
        lo = int(match.group(1))
        hi = int(match.group(2)) if match.group(2) is not None else lo
        if hi < lo:
            raise ValueError(f"{what}={spec!r}: range {part!r} is empty; write the lower id first ('{hi}-{lo}')")
        if hi >= limit:  # checked before expanding: '0-99999999999' must not exhaust memory
            raise ValueError(
                f"{what}={spec!r} names NeuronCore {hi}, but the emulated instance has {limit} "
                f"logical NeuronCores (0-{limit - 1})"
            )
        cores.update(range(lo, hi + 1))
    return frozenset(cores)


@dataclass(frozen=True)
class _TypeFilter:
    """event_filters['types']: NRT event types, the groups 'hardware' / 'software', device-event names such as
    'aten::mm' or 'c10d::all_reduce' (an emulator extension), and '^x' to exclude x (NRT's syntax)."""

    include: frozenset[str]
    exclude: frozenset[str]

    @staticmethod
    def parse(types: Sequence[str]) -> _TypeFilter:
        if isinstance(types, str) or not isinstance(types, Sequence) or not types:
            raise ValueError(
                f"event_filters['types']={types!r}: give a non-empty list of event types, e.g. "
                "['cc_exec_barrier', 'nc_exec_running'], 'hardware', or '^cc_running' to exclude one"
            )
        include, exclude = set(), set()
        for entry in types:
            if not isinstance(entry, str) or not entry.strip().lstrip("^").strip():
                raise ValueError(
                    f"event_filters['types']: {entry!r} is not an event type name "
                    f"(known here: {', '.join(sorted(EVENT_TYPES))}, 'hardware', 'software')"
                )
            name = entry.strip()
            negated = name.startswith("^")
            name = name.lstrip("^").strip()
            if name in _NRT_ONLY_TYPES:
                warnings.warn(
                    f"event_filters['types']: {name!r} is an NRT event the emulated device never records "
                    f"(it records {', '.join(sorted(EVENT_TYPES))}); it selects nothing here",
                    UserWarning,
                    stacklevel=4,
                )
            elif name not in EVENT_TYPES and name not in _GROUPS and "::" not in name:
                raise ValueError(
                    f"event_filters['types']: unknown event type {name!r}; use an NRT type "
                    f"({', '.join(sorted(EVENT_TYPES | dict.fromkeys(_NRT_ONLY_TYPES)))}), a group "
                    "('hardware', 'software') or a device event name such as 'aten::mm'"
                )
            (exclude if negated else include).add(name)
        return _TypeFilter(frozenset(include), frozenset(exclude))

    def keeps(self, name: str, kind: str) -> bool:
        keys = {name, kind, EVENT_TYPES.get(kind, "software")}
        if self.include and not keys & self.include:
            return False
        return not keys & self.exclude


@dataclass(frozen=True)
class _Capture:
    """What a session keeps: which NeuronCores, which event types, how many events per core, which files."""

    modes: frozenset[ProfileMode]
    nc: frozenset[int] | None = None
    types: _TypeFilter | None = None
    max_events_per_nc: int = DEFAULT_MAX_EVENTS_PER_NC


def _parse_modes(modes: Iterable[ProfileMode | str] | None) -> tuple[ProfileMode, ...]:
    if modes is None:
        return (ProfileMode.DEVICE, ProfileMode.RUNTIME)
    if isinstance(modes, str | ProfileMode) or not isinstance(modes, Iterable):
        raise ValueError(f"modes={modes!r}: give a list, e.g. [ProfileMode.DEVICE, ProfileMode.RUNTIME]")
    out: list[ProfileMode] = []
    for mode in modes:
        if isinstance(mode, ProfileMode):
            found: ProfileMode | None = mode
        elif isinstance(mode, str):
            found = next((m for m in ProfileMode if mode.strip().lower() in (m.value, m.name.lower())), None)
        else:
            found = None
        if found is None:
            raise ValueError(
                f"unknown profile mode {mode!r}: use ProfileMode.{', ProfileMode.'.join(m.name for m in ProfileMode)}"
            )
        if found not in out:
            out.append(found)
    if not out:
        raise ValueError("modes=[] captures nothing: leave modes out for [DEVICE, RUNTIME], or name the modes wanted")
    return tuple(out)


def _check_max_events(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"max_events_per_nc={value!r}: give a positive number of events per NeuronCore "
            f"(NRT's default is {DEFAULT_MAX_EVENTS_PER_NC:,})"
        )
    return value


class NeuronConfig(_ExperimentalConfig):
    """Neuron capture settings, passed to ``torch.profiler.profile`` as ``experimental_config``.

    ``modes`` (default ``[DEVICE, RUNTIME]``) choose the files written; ``capture_enabled_for_nc``
    (``"0,1,2-5"``) keeps only those NeuronCores' device events; ``max_events_per_nc`` keeps at most that many
    per core, the newest (NRT's ring buffer overwrites the oldest); ``profile_output_dir`` is where
    :meth:`NeuronProfiler.export_trace` writes. ``neff_cache_dir`` and ``precache_node_info`` are accepted and
    recorded in trace_info.json: eager ops here run no NEFF, so there is nothing to copy or precache.

    It is a real ``_ExperimentalConfig`` whose ``custom_profiler_config`` is TorchNeuron's
    ``"key:value;..."`` string, so torch.profiler takes it as is.
    """

    def __init__(
        self,
        modes: Sequence[ProfileMode | str] | None = None,
        max_events_per_nc: int | None = None,
        capture_enabled_for_nc: str | None = None,
        profile_output_dir: str | os.PathLike[str] = "./output",
        neff_cache_dir: str | os.PathLike[str] | None = None,
        precache_node_info: bool = True,
    ) -> None:
        parsed_modes = _parse_modes(modes)
        max_events = _check_max_events(max_events_per_nc)
        cores = None
        if capture_enabled_for_nc is not None:
            if not isinstance(capture_enabled_for_nc, str):
                raise ValueError(f'capture_enabled_for_nc={capture_enabled_for_nc!r}: give a string such as "0,1,2-5"')
            cores = parse_nc_spec(capture_enabled_for_nc)
        if not isinstance(profile_output_dir, str | os.PathLike) or not str(profile_output_dir):
            raise ValueError(f"profile_output_dir={profile_output_dir!r}: give a directory path")
        if neff_cache_dir is not None and not isinstance(neff_cache_dir, str | os.PathLike):
            raise ValueError(f"neff_cache_dir={neff_cache_dir!r}: give a directory path or None")
        if not isinstance(precache_node_info, bool):
            raise ValueError(f"precache_node_info={precache_node_info!r}: give True or False")
        pairs = [("modes", ",".join(m.value for m in parsed_modes))]
        if max_events is not None:
            pairs.append(("max_events_per_nc", str(max_events)))
        if capture_enabled_for_nc is not None:
            pairs.append(("capture_enabled_for_nc", capture_enabled_for_nc.replace(" ", "")))
        pairs.append(("profile_output_dir", os.fspath(profile_output_dir)))
        if neff_cache_dir is not None:
            pairs.append(("neff_cache_dir", os.fspath(neff_cache_dir)))
        pairs.append(("precache_node_info", str(precache_node_info).lower()))
        super().__init__(custom_profiler_config=";".join(f"{k}:{v}" for k, v in pairs))
        self.modes = parsed_modes
        self.max_events_per_nc = max_events
        self.capture_enabled_for_nc = capture_enabled_for_nc
        self.profile_output_dir = os.fspath(profile_output_dir)
        self.neff_cache_dir = None if neff_cache_dir is None else os.fspath(neff_cache_dir)
        self.precache_node_info = precache_node_info
        self._cores = cores

    @classmethod
    def from_custom_config(cls, text: str) -> NeuronConfig:
        """Read TorchNeuron's ``custom_profiler_config`` string (``"max_events_per_nc:10000;
        capture_enabled_for_nc:0,1;profile_output_dir:/tmp/traces"``, the April-2026 form)."""
        kwargs: dict[str, Any] = {}
        for item in filter(None, (p.strip() for p in text.split(";"))):
            key, sep, value = item.partition(":")
            key, value = key.strip(), value.strip()
            if not sep:
                raise ValueError(f"custom_profiler_config {text!r}: {item!r} is not 'key:value'")
            if key == "max_events_per_nc":
                if not value.isdigit():
                    raise ValueError(f"custom_profiler_config: max_events_per_nc:{value} is not a number")
                kwargs[key] = int(value)
            elif key in ("capture_enabled_for_nc", "profile_output_dir", "neff_cache_dir"):
                kwargs[key] = value
            elif key == "precache_node_info":
                if value.lower() not in ("true", "false"):
                    raise ValueError(f"custom_profiler_config: precache_node_info:{value} is not true or false")
                kwargs[key] = value.lower() == "true"
            elif key == "modes":
                kwargs[key] = [m for m in value.split(",") if m]
            else:
                raise ValueError(
                    f"custom_profiler_config {text!r}: unknown key {key!r} (known: max_events_per_nc, "
                    "capture_enabled_for_nc, profile_output_dir, neff_cache_dir, precache_node_info, "
                    "modes)"
                )
        return cls(**kwargs)

    def _capture(self) -> _Capture:
        return _Capture(frozenset(self.modes), self._cores, None, self.max_events_per_nc or DEFAULT_MAX_EVENTS_PER_NC)

    def __repr__(self) -> str:
        return f"NeuronConfig({self.custom_profiler_config!r})"


# ---------------------------------------------------------------- device events out of a Chrome trace


@dataclass
class DeviceEvent:
    """One device event of a session: what ran, on which NeuronCore, when (epoch ns), and what launched it."""

    name: str
    type: str
    nc: int  # the instance's NeuronCore id (NRT's numbering)
    device: int  # the process's device index (neuron:<device>)
    ts_ns: int
    dur_ns: int
    external_id: int | None = None  # the launching CPU op's correlation id ("External id" in the trace)
    framework_op: str | None = None  # that CPU op's name
    bytes: int | None = None  # collectives: bytes moved

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class _Processed:
    trace: dict[str, Any]
    events: dict[int, list[DeviceEvent]]  # by NeuronCore, oldest first
    dropped: dict[int, int]  # by NeuronCore: events past max_events_per_nc
    filtered: int  # events outside the captured cores or types
    window: tuple[int, int]  # the session, epoch ns


def _core_map() -> tuple[int, ...]:
    from torch_neuronx import runtime

    return runtime.machine().visible_cores


def _process_trace(trace: dict[str, Any], capture: _Capture, keep_device_events: bool = True) -> _Processed:
    """Applies `capture` to the device events of a Chrome trace exported by torch.profiler."""
    events = trace.get("traceEvents", [])
    base = int(trace.get("baseTimeNanoseconds", 0))
    device_pids = {
        e.get("pid")
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name" and e.get("args", {}).get("name") == "neuron"
    }
    cpu_ops = {
        e["args"]["External id"]: e["name"]
        for e in events
        if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})
    }
    visible = _core_map()
    per_core: dict[int, list[tuple[DeviceEvent, dict[str, Any]]]] = {}
    others: list[dict[str, Any]] = []
    filtered = 0
    starts, ends = [], []
    for e in events:
        if e.get("ph") == "X" and "ts" in e:
            starts.append(float(e["ts"]))
            ends.append(float(e["ts"]) + float(e.get("dur", 0)))
        if e.get("pid") not in device_pids or e.get("ph") != "X":
            others.append(e)
            continue
        args = e.get("args", {})
        label = str(args.get("device", ""))
        device = int(label.split(":", 1)[1]) if label.startswith("neuron:") else int(e.get("tid", 0))
        nc = visible[device] if device < len(visible) else device
        kind = event_type(e["name"])
        if (capture.nc is not None and nc not in capture.nc) or (
            capture.types and not capture.types.keeps(e["name"], kind)
        ):
            filtered += 1
            continue
        ext = args.get("External id")
        nbytes = args.get("bytes")
        event = DeviceEvent(
            e["name"],
            kind,
            nc,
            device,
            base + round(float(e["ts"]) * 1000),
            round(float(e.get("dur", 0)) * 1000),
            ext,
            cpu_ops.get(ext) if ext is not None else None,
            int(nbytes) if nbytes is not None else None,
        )
        per_core.setdefault(nc, []).append((event, e))
    kept: dict[int, list[DeviceEvent]] = {}
    dropped: dict[int, int] = {}
    kept_trace: list[dict[str, Any]] = []
    for nc, pairs in per_core.items():
        pairs.sort(key=lambda p: p[0].ts_ns)
        if len(pairs) > capture.max_events_per_nc:  # NRT's ring buffer: the oldest are overwritten
            dropped[nc] = len(pairs) - capture.max_events_per_nc
            pairs = pairs[-capture.max_events_per_nc :]
        kept[nc] = [p[0] for p in pairs]
        for event, raw in pairs:
            kept_trace.append({**raw, "args": {**raw.get("args", {}), "nc": nc, "type": event.type}})
    live_tracks = {(e["pid"], e.get("tid")) for e in kept_trace} if keep_device_events else set()
    out = []
    for e in others:
        if e.get("pid") in device_pids:
            if not keep_device_events or not live_tracks:
                continue  # the device process has nothing left to show
            if e.get("name", "").startswith("thread_") and (e["pid"], e.get("tid")) not in live_tracks:
                continue  # a core whose events were all filtered out: no empty track
        out.append(e)
    if keep_device_events:
        out.extend(kept_trace)
    window = (base + round(min(starts) * 1000), base + round(max(ends) * 1000)) if starts else (0, 0)
    return _Processed({**trace, "traceEvents": out}, kept, dropped, filtered, window)


def _export(prof: profile) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="neuron_trace_") as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return json.loads(path.read_text())


# ---------------------------------------------------------------- host sampling (CPU_UTIL, HOST_MEMORY)


def _read_host() -> dict[str, Any]:
    """One sample of what the host can tell without psutil: /proc on Linux, getrusage elsewhere."""
    sample: dict[str, Any] = {"ts_ns": time.time_ns()}
    usage = resource.getrusage(resource.RUSAGE_SELF)
    sample["process_cpu_s"] = usage.ru_utime + usage.ru_stime
    try:
        with open("/proc/stat") as f:
            cpus = []
            for line in f:
                if not line.startswith("cpu"):
                    break
                fields = [int(x) for x in line.split()[1:]]
                idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
                cpus.append((sum(fields[:8]), idle))  # guest time is already counted in user
            sample["cpu"] = cpus  # [total, cpu0, cpu1, ...]
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.split()[1:2]}
        sample["mem_total_bytes"] = info.get("MemTotal")
        sample["mem_available_bytes"] = info.get("MemAvailable")
        with open("/proc/self/status") as f:
            status = {
                line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.startswith(("VmRSS", "VmHWM"))
            }
        sample["process_rss_bytes"] = status.get("VmRSS")
        sample["process_peak_rss_bytes"] = status.get("VmHWM")
    except (OSError, ValueError, IndexError):
        scale = 1 if os.uname().sysname == "Darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
        sample["process_peak_rss_bytes"] = usage.ru_maxrss * scale
    return sample


class _HostSampler:
    """Samples the host every SAMPLE_INTERVAL_S in a daemon thread, keeping the last hour."""

    def __init__(self) -> None:
        self.samples: deque[dict[str, Any]] = deque(maxlen=int(3600 / SAMPLE_INTERVAL_S))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.sample()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="neuron-profiler-host-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            self.sample()

    def sample(self) -> None:
        s = _read_host()
        with self._lock:
            self.samples.append(s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None

    def window(self, start_ns: int, end_ns: int) -> list[dict[str, Any]]:
        """The samples of [start_ns, end_ns], with the last one before start_ns as the baseline."""
        with self._lock:
            samples = list(self.samples)
        before = [s for s in samples if s["ts_ns"] < start_ns]
        inside = [s for s in samples if start_ns <= s["ts_ns"] <= end_ns]
        return before[-1:] + inside


def _cpu_util(samples: list[dict[str, Any]]) -> dict[str, Any]:
    rows = []
    for prev, cur in zip(samples, samples[1:], strict=False):
        wall = (cur["ts_ns"] - prev["ts_ns"]) / 1e9
        row: dict[str, Any] = {"ts_ns": cur["ts_ns"], "interval_s": round(wall, 6)}
        if wall > 0:
            row["process_pct"] = round(100 * (cur["process_cpu_s"] - prev["process_cpu_s"]) / wall, 2)
        if "cpu" in cur and "cpu" in prev:
            pcts = []
            for (t0, i0), (t1, i1) in zip(prev["cpu"], cur["cpu"], strict=False):
                pcts.append(round(100 * (1 - (i1 - i0) / (t1 - t0)), 2) if t1 > t0 else 0.0)
            row["total_pct"], row["per_cpu_pct"] = pcts[0], pcts[1:]
        rows.append(row)
    source = "/proc/stat" if samples and "cpu" in samples[-1] else "getrusage (no /proc: process only)"
    return {"source": source, "cpus": os.cpu_count(), "sample_interval_s": SAMPLE_INTERVAL_S, "samples": rows}


def _host_mem(samples: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("mem_total_bytes", "mem_available_bytes", "process_rss_bytes", "process_peak_rss_bytes")
    rows = [{"ts_ns": s["ts_ns"], **{k: s[k] for k in keys if s.get(k) is not None}} for s in samples]
    source = "/proc/meminfo" if samples and "mem_total_bytes" in samples[-1] else "getrusage (no /proc: peak RSS)"
    return {"source": source, "sample_interval_s": SAMPLE_INTERVAL_S, "samples": rows}


# ---------------------------------------------------------------- writing a session


def instance_id() -> str:
    """The ``<instance-id>`` of output directories: this host's name (on EC2, NRT writes the instance id)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "localhost"


def _timestamp() -> str:
    now = datetime.now()  # NRT's format: YYYYMMDD_HHMMSS_mmm
    return now.strftime("%Y%m%d_%H%M%S") + f"_{now.microsecond // 1000:03d}"


def _session_dir(root: str | os.PathLike[str]) -> Path:
    parent = Path(root) / f"{instance_id()}_pid_{os.getpid()}"
    parent.mkdir(parents=True, exist_ok=True)
    stamp = _timestamp()
    for n in range(1000):
        path = parent / (stamp if n == 0 else f"{stamp}_{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise NRTProfilerError(f"could not create a session directory under {parent}: remove old sessions")


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data))


def _ntrace(processed: _Processed) -> dict[str, Any]:
    pid, host = os.getpid(), instance_id()
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"{host}/PID:{pid}/neuron_hw"}}
    ]
    for nc in sorted(processed.events):
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": nc, "args": {"name": f"{host}/NC:{nc}"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": nc, "args": {"sort_index": nc}})
        for e in processed.events[nc]:
            args = {k: v for k, v in e.to_json().items() if k not in ("name", "ts_ns", "dur_ns", "nc")}
            events.append(
                {
                    "ph": "X",
                    "cat": e.type,
                    "name": e.name,
                    "pid": pid,
                    "tid": nc,
                    "ts": e.ts_ns / 1000,
                    "dur": e.dur_ns / 1000,
                    "args": args,
                }
            )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _write_session(
    directory: Path, processed: _Processed, capture: _Capture, sampler: _HostSampler | None, extra: dict[str, Any]
) -> list[str]:
    """Writes the device files of one session into `directory`; returns their names."""
    from torch_neuronx import runtime

    written = []
    if ProfileMode.DEVICE in capture.modes:
        for nc, events in sorted(processed.events.items()):
            name = f"profile_nc_{nc}_session_0.json"
            _write_json(
                directory / name,
                {
                    "nc": nc,
                    "device": f"neuron:{events[0].device}",
                    "instance": instance_id(),
                    "pid": os.getpid(),
                    "max_events_per_nc": capture.max_events_per_nc,
                    "dropped": processed.dropped.get(nc, 0),
                    "events": [e.to_json() for e in events],
                },
            )
            written.append(name)
    if ProfileMode.RUNTIME in capture.modes:
        _write_json(directory / "ntrace.json", _ntrace(processed))
        written.append("ntrace.json")
    wants_host = {ProfileMode.CPU_UTIL, ProfileMode.HOST_MEMORY} & capture.modes
    if wants_host and sampler is not None:
        sampler.sample()  # the session ends now: its last interval runs up to this sample
        start = processed.window[0] or time.time_ns()
        samples = sampler.window(start, time.time_ns())
        if ProfileMode.CPU_UTIL in capture.modes:
            _write_json(directory / "cpu_util.json", _cpu_util(samples))
            written.append("cpu_util.json")
        if ProfileMode.HOST_MEMORY in capture.modes:
            _write_json(directory / "host_mem.json", _host_mem(samples))
            written.append("host_mem.json")
    machine = runtime.machine()
    info = {
        "instance": instance_id(),
        "pid": os.getpid(),
        "emulated": machine.describe(),
        "visible_cores": list(machine.visible_cores),
        "modes": sorted(m.value for m in capture.modes),
        "capture_enabled_for_nc": None if capture.nc is None else sorted(capture.nc),
        "event_types": None
        if capture.types is None
        else {"include": sorted(capture.types.include), "exclude": sorted(capture.types.exclude)},
        "max_events_per_nc": capture.max_events_per_nc,
        "session_ns": list(processed.window),
        "events_per_nc": {str(nc): len(ev) for nc, ev in sorted(processed.events.items())},
        "dropped_per_nc": {str(nc): n for nc, n in sorted(processed.dropped.items())},
        "filtered_out": processed.filtered,
        **extra,
    }
    info["files"] = [*written, "trace_info.json"]
    _write_json(directory / "trace_info.json", info)
    return info["files"]


def _synchronize() -> None:
    import torch_neuronx

    if torch_neuronx.is_neuron_runtime_initialized():
        torch_neuronx.synchronize()


# ---------------------------------------------------------------- NeuronProfiler


class NeuronProfiler:
    """TorchNeuron's profiler, in both published forms.

    **April 2026** (a context manager, keyword arguments)::

        with NeuronProfiler(pytorch_activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                            neuron_output_dir="./my_profiles",
                            event_filters={"nc": ["0", "4-7"], "types": ["cc_exec_barrier"]}) as prof:
            model(x)

    Device ("Neuron Runtime") profiling is always on: its files go to
    ``<neuron_output_dir>/<instance-id>_pid_<pid>/<timestamp>/``. With ``pytorch_activities`` (default
    none, as TorchNeuron's source has it), the PyTorch trace is written to ``pytorch_trace_file``
    (default ``<neuron_output_dir>/pytorch_trace.json``; a relative name is joined under
    ``neuron_output_dir``), and the device events are mapped to the CPU ops that launched them in
    ``<neuron_output_dir>/framework_mapping_<YYYYMMDD_HHMMSS_mmm>.json``. The trace has device tracks
    only when ``ProfilerActivity.PrivateUse1`` is among ``pytorch_activities``.

    **October 2026** (an exporter for ``torch.profiler.profile``)::

        config = NeuronConfig(modes=[ProfileMode.DEVICE, ProfileMode.RUNTIME], profile_output_dir="./out")
        exporter = NeuronProfiler(config)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                     experimental_config=config, on_trace_ready=exporter.export_trace):
            model(x)

    ``export_trace`` writes ``<profile_output_dir>/<instance-id>_pid_<pid>/<timestamp>/trace.json`` and the
    files of the config's modes. ``NeuronProfiler(config)`` also works as a context manager, profiling CPU
    and PrivateUse1 with that config.
    """

    def __init__(
        self,
        pytorch_activities: list[ProfilerActivity] | NeuronConfig | _ExperimentalConfig | None = None,
        record_shapes: bool = False,
        pytorch_trace_file: str | None = None,
        neuron_output_dir: str = "./output",
        event_filters: dict[str, list[str] | list[int]] | None = None,
    ) -> None:
        self._config: NeuronConfig | None = None
        if isinstance(pytorch_activities, _ExperimentalConfig):
            if record_shapes or pytorch_trace_file is not None or neuron_output_dir != "./output" or event_filters:
                raise TypeError(
                    "NeuronProfiler(neuron_config) takes its settings from the NeuronConfig; the "
                    "April-2026 keyword arguments (record_shapes, pytorch_trace_file, "
                    "neuron_output_dir, event_filters) go without one"
                )
            config = pytorch_activities
            if not isinstance(config, NeuronConfig):  # TorchNeuron's April form: a bare _ExperimentalConfig
                config = NeuronConfig.from_custom_config(config.custom_profiler_config)
            self._config = config
            self.pytorch_activities: list[ProfilerActivity] = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
            self.neuron_output_dir = config.profile_output_dir
            self.pytorch_trace_file: str | None = None
            self.record_shapes = False
            self.event_filters = None
            self._capture = config._capture()
        else:
            activities = list(pytorch_activities or [])
            for a in activities:
                if not isinstance(a, ProfilerActivity):
                    raise TypeError(
                        f"pytorch_activities: {a!r} is not a torch.profiler.ProfilerActivity; "
                        "use e.g. [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]"
                    )
            self.pytorch_activities = activities
            self.record_shapes = record_shapes
            self.neuron_output_dir = os.fspath(neuron_output_dir)
            if activities:
                name = pytorch_trace_file or "pytorch_trace.json"
                self.pytorch_trace_file = os.path.join(self.neuron_output_dir, name)
            else:
                self.pytorch_trace_file = None
            self.event_filters = event_filters
            self._capture = _Capture(frozenset(ProfileMode), *self._parse_filters(event_filters))
        self._active = False
        self._profiler: profile | None = None
        self._processed: _Processed | None = None
        self._session: Path | None = None
        self._sampler: _HostSampler | None = None
        if self._config is not None and {ProfileMode.CPU_UTIL, ProfileMode.HOST_MEMORY} & self._capture.modes:
            # The exporter is not told when torch.profiler starts: it samples from now on and keeps the samples
            # of each exported session's window.
            self._sampler = _HostSampler()
            self._sampler.start()
            weakref.finalize(self, self._sampler.stop)

    @staticmethod
    def _parse_filters(filters: object) -> tuple[frozenset[int] | None, _TypeFilter | None]:
        if filters is None:
            return None, None
        if not isinstance(filters, dict):
            raise ValueError(
                f"event_filters={filters!r}: give a dict such as {{'nc': ['0', '4-7'], 'types': ['cc_exec_barrier']}}"
            )
        unknown = set(filters) - {"nc", "types"}
        if unknown:
            raise ValueError(f"event_filters: unknown key(s) {sorted(unknown)}; the keys are 'nc' and 'types'")
        cores = parse_nc_spec(filters["nc"], "event_filters['nc']") if "nc" in filters else None
        types = _TypeFilter.parse(filters["types"]) if "types" in filters else None
        return cores, types

    # -- the context manager

    def start(self) -> None:
        """Start profiling (device events always; PyTorch ops too with ``pytorch_activities``)."""
        if self._active:
            raise RuntimeError(
                "NeuronProfiler is already active: stop() it (or leave its with-block) before "
                "starting it again; use a second NeuronProfiler only after this one stops"
            )
        if torch.autograd.profiler._is_profiler_enabled:
            raise RuntimeError(
                "another torch.profiler session is running, and Kineto records one session per "
                "process: stop it before starting a NeuronProfiler"
            )
        activities = list(dict.fromkeys([*self.pytorch_activities, ProfilerActivity.PrivateUse1]))
        if self._config is not None:
            prof = profile(activities=activities, experimental_config=self._config, on_trace_ready=self.export_trace)
        else:
            prof = profile(activities=activities, record_shapes=self.record_shapes)
            if {ProfileMode.CPU_UTIL, ProfileMode.HOST_MEMORY} & self._capture.modes:
                self._sampler = _HostSampler()
                self._sampler.start()
        self._processed = None
        self._session = None
        try:
            prof.start()
        except Exception as err:
            if self._sampler is not None and self._config is None:
                self._sampler.stop()
            raise NRTProfilerError(f"could not start profiling: {err}") from err
        self._profiler = prof
        self._active = True

    def stop(self) -> None:
        """Stop profiling and write the session's files."""
        if not self._active or self._profiler is None:
            raise RuntimeError("NeuronProfiler.stop() without start(): start() it (or use it as a with-block) first")
        try:
            _synchronize()  # collectives record their device events when they complete
        finally:
            self._active = False
            try:
                self._profiler.stop()  # the exporter form writes its files here, through on_trace_ready
            finally:
                if self._config is None and self._sampler is not None:
                    self._sampler.sample()
                    self._sampler.stop()
        if self._config is None:
            self._write_april()

    def _write_april(self) -> None:
        assert self._profiler is not None
        trace = _export(self._profiler)
        wants_device_tracks = ProfilerActivity.PrivateUse1 in self.pytorch_activities
        processed = _process_trace(trace, self._capture, keep_device_events=wants_device_tracks)
        self._processed = processed
        root = Path(self.neuron_output_dir)
        self._session = _session_dir(root)
        _write_session(self._session, processed, self._capture, self._sampler, {})
        if self.pytorch_trace_file is not None:
            path = Path(self.pytorch_trace_file)
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_json(path, processed.trace)
            mapping = [
                {
                    "framework_op": e.framework_op,
                    "external_id": e.external_id,
                    "device_event": e.name,
                    "type": e.type,
                    "nc": e.nc,
                    "ts_ns": e.ts_ns,
                    "dur_ns": e.dur_ns,
                }
                for events in processed.events.values()
                for e in events
                if e.framework_op is not None
            ]
            if mapping:  # as TorchNeuron: written only when there is something to map
                mapping.sort(key=lambda m: m["ts_ns"])
                _write_json(
                    root / f"framework_mapping_{_timestamp()}.json",
                    {"instance": instance_id(), "pid": os.getpid(), "data": mapping},
                )

    def __enter__(self) -> NeuronProfiler:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if exc_type is None:
            self.stop()
            return False
        try:  # the region raised: stop anyway, and let its exception through
            self.stop()
        except Exception as err:
            warnings.warn(
                f"NeuronProfiler could not stop cleanly after the profiled code raised: {err}",
                UserWarning,
                stacklevel=2,
            )
        return False

    def close(self) -> None:
        """Stop host sampling (the exporter form samples from construction until closed or collected)."""
        if self._sampler is not None:
            self._sampler.stop()

    # -- the exporter

    def export_trace(self, prof: profile) -> None:
        """``on_trace_ready`` handler: writes trace.json and the device files of one session.

        The session directory is ``<profile_output_dir>/<instance-id>_pid_<pid>/<timestamp>/``.
        """
        if not hasattr(prof, "export_chrome_trace"):
            raise TypeError(
                f"export_trace expects the torch.profiler.profile it is the on_trace_ready of, "
                f"got {type(prof).__name__}"
            )
        config = getattr(prof, "experimental_config", None)
        if self._config is not None and config is not self._config:
            warnings.warn(
                "export_trace: the profile was not started with this NeuronProfiler's NeuronConfig "
                "(pass the same object as experimental_config); writing with this one's settings",
                UserWarning,
                stacklevel=2,
            )
        capture = self._capture
        processed = _process_trace(_export(prof), capture)
        activities = getattr(prof, "activities", None)
        if activities is not None and ProfilerActivity.PrivateUse1 not in activities:
            warnings.warn(
                "export_trace: the profile has no ProfilerActivity.PrivateUse1, so it recorded no "
                "device events; add it to activities",
                UserWarning,
                stacklevel=2,
            )
        self._processed = processed
        root = self._config.profile_output_dir if self._config is not None else self.neuron_output_dir
        self._session = _session_dir(root)
        _write_json(self._session / "trace.json", processed.trace)
        extra: dict[str, Any] = {}
        if self._config is not None:
            extra = {
                "neff_cache_dir": self._config.neff_cache_dir,
                "precache_node_info": self._config.precache_node_info,
                "note": "eager ops run no NEFF here: neff_cache_dir and precache_node_info have no effect",
            }
        files = _write_session(self._session, processed, capture, self._sampler, extra)
        logger.info("neuron profile written to %s (%s)", self._session, ", ".join(["trace.json", *files]))

    # -- status and results

    def is_active(self) -> bool:
        """Whether profiling is running."""
        return self._active

    def has_pytorch_profiling(self) -> bool:
        """Whether PyTorch ops are profiled too (``pytorch_activities`` given, or the exporter form)."""
        return bool(self.pytorch_activities)

    @property
    def pytorch_profiler(self) -> profile | None:
        """The underlying ``torch.profiler.profile`` (for ``key_averages()``), once started."""
        return self._profiler

    def get_pytorch_trace(self) -> str | None:
        """The path of the PyTorch trace written at stop(), or None (not stopped yet, or no PyTorch profiling)."""
        if self._active or self._processed is None:
            return None
        if self._config is not None:
            return str(self._session / "trace.json") if self._session else None
        return self.pytorch_trace_file

    def get_nrt_output_directory(self) -> str:
        """The directory the device ("Neuron Runtime") files go under."""
        return self.neuron_output_dir

    def get_session_directory(self) -> str | None:
        """The ``<instance-id>_pid_<pid>/<timestamp>`` directory of the last session written."""
        return None if self._session is None else str(self._session)

    def device_events(self) -> dict[int, list[DeviceEvent]]:
        """The last session's captured device events, by NeuronCore (after filters and caps)."""
        return {} if self._processed is None else {nc: list(ev) for nc, ev in self._processed.events.items()}

    def export_pytorch_trace(self, filename: str) -> None:
        """Write the (filtered) PyTorch trace of the last session to `filename`."""
        if self._profiler is None or not self.pytorch_activities:
            raise ValueError("no PyTorch trace: give NeuronProfiler pytorch_activities and run a session first")
        if self._active:
            raise ValueError("cannot export the PyTorch trace while profiling: stop() first")
        assert self._processed is not None
        _write_json(Path(filename), self._processed.trace)
