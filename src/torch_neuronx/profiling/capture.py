"""Capture settings: what a profiling session records (NeuronConfig, ProfileMode, the ``nc`` and ``types`` filters,
NRT's event types)."""

from __future__ import annotations

import enum
import os
import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from torch._C._profiler import _ExperimentalConfig

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
