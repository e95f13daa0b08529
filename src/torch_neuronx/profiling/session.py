"""Writing a session directory: trace_info, the per-core device files, ntrace, host samples."""

from __future__ import annotations

import json
import os
import re
import socket
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from torch_neuronx.profiling.capture import NRTProfilerError, ProfileMode, _Capture
from torch_neuronx.profiling.host import _cpu_util, _host_mem, _HostSampler
from torch_neuronx.profiling.trace import _Processed


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
