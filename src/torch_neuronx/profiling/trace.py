"""Device events out of a Chrome trace: the per-core events a session keeps, filtered by its capture settings."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.profiler import profile

from torch_neuronx.profiling.capture import _Capture, event_type


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


def _first_index() -> int:
    """The device index of this process's first visible core: 0, or LOCAL_RANK under a process group."""
    from torch_neuronx.device import _index

    local = _index.local_devices()
    return local.local_rank if local is not None else 0


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
    first = _first_index()
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
        slot = device - first  # under a process group this process's one core is neuron:LOCAL_RANK
        nc = visible[slot] if 0 <= slot < len(visible) else device
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
