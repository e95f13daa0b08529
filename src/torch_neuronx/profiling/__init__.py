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

from torch_neuronx.profiling.capture import (
    DEFAULT_MAX_EVENTS_PER_NC,
    EVENT_TYPES,
    OUTPUT_FILES,
    NeuronConfig,
    NRTProfilerError,
    ProfileMode,
    event_type,
    parse_nc_spec,
)
from torch_neuronx.profiling.profiler import NeuronProfiler
from torch_neuronx.profiling.session import instance_id
from torch_neuronx.profiling.trace import DeviceEvent

__all__ = [
    "DEFAULT_MAX_EVENTS_PER_NC",
    "EVENT_TYPES",
    "OUTPUT_FILES",
    "DeviceEvent",
    "NRTProfilerError",
    "NeuronConfig",
    "NeuronProfiler",
    "ProfileMode",
    "event_type",
    "instance_id",
    "parse_nc_spec",
]
