"""NeuronProfiler: TorchNeuron's profiling entry point, over torch.profiler, in both published forms."""

from __future__ import annotations

import logging
import os
import warnings
import weakref
from pathlib import Path
from typing import Any

import torch
from torch._C._profiler import _ExperimentalConfig
from torch.profiler import ProfilerActivity, profile

from torch_neuronx.profiling.capture import (
    NeuronConfig,
    NRTProfilerError,
    ProfileMode,
    _Capture,
    _TypeFilter,
    parse_nc_spec,
)
from torch_neuronx.profiling.host import _HostSampler
from torch_neuronx.profiling.session import (
    _session_dir,
    _synchronize,
    _timestamp,
    _write_json,
    _write_session,
    instance_id,
)
from torch_neuronx.profiling.trace import DeviceEvent, _export, _process_trace, _Processed

logger = logging.getLogger(__name__)


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
