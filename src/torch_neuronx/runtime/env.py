"""TorchNeuron's environment variables: each one's name, default, meaning and where it is read.

One table (:data:`VARIABLES`) that the code reads through :func:`get` and the
docs are written from (docs/torchneuron.md). A value that does not parse
warns once, naming the variable and what it takes, and the default applies:
a typo in the environment must never stop ``import torch``.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, NamedTuple


class Variable(NamedTuple):
    name: str
    kind: str  # "bool", "int", "str", "path", "list"
    default: Any
    meaning: str
    emulation: str = ""  # how the emulator honours it, where that differs from the hardware
    low: int = 0  # "int" variables: the smallest valid value
    high: int | None = None  # ... and the largest (None: no bound)


VARIABLES: dict[str, Variable] = {v.name: v for v in (
    # -- the machine (runtime/config.py reads these when the device initialises)
    Variable("TORCH_NEURONX_INSTANCE_TYPE", "str", "trn2.48xlarge", "the instance to emulate"),
    Variable("NEURON_LOGICAL_NC_CONFIG", "int", 2, "physical NeuronCores per logical core on Trn2 (1 or 2)"),
    Variable("NEURON_RT_VISIBLE_CORES", "str", "", "the logical cores this process sees: 3, 0-3, 0,2,5"),
    Variable("TORCH_NEURONX_HBM_PER_CORE", "str", "", "override the HBM capacity of each core: 256MiB, 2GiB",
             "an emulator extension: rehearse a smaller core"),
    # -- eager execution
    Variable("TORCH_NEURONX_FORBID_CPU_FALLBACK", "bool", False,
             "1: an eager op that TorchNeuron would run on the CPU (get_fallback_ops) raises instead",
             "an emulator extension: a CI guard that a model stays on the NeuronCores"),
    Variable("TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS", "bool", False,
             "1: fall back to the CPU only for ops with no NeuronCore implementation, never after a NeuronCore "
             "implementation fails",
             "read and validated when the device initialises; every fallback here is of an op with no NeuronCore "
             "implementation, so 1 changes nothing"),
    Variable("NEURON_LAUNCH_BLOCKING", "bool", False,
             "1: each op completes (and raises its error) before the call returns",
             "read and validated when the device initialises (torch.neuron.launch_blocking()); the emulated device "
             "always completes an op before the call returns, so 0 and 1 both behave as 1 does on the hardware"),
    Variable("TORCH_NEURONX_ENABLE_STACK_TRACE", "bool", False,
             "1: record the Python stack of the op calls that matter (here: the first call of each CPU fallback)"),
    Variable("TORCH_NEURONX_LOG_LEVEL", "str", "", "logging of the torch_neuronx logger: DEBUG, INFO, WARNING, "
             "ERROR, OFF (or TorchNeuron's 0-3)"),
    Variable("TORCH_NEURONX_LOG_FILE", "path", "", "append the torch_neuronx log to this file instead of stderr"),
    Variable("TORCH_NEURONX_OOM_SNAPSHOT", "path", "", "write a memory snapshot here when the device runs out of "
             "memory", "an emulator extension"),
    # -- torch.compile
    Variable("TORCH_NEURONX_NEFF_CACHE_DIR", "path", "~/.cache/torch_neuronx/neff", "the compile cache directory"),
    Variable("TORCH_NEURONX_DISABLE_NEFF_CACHE", "bool", False, "1: compile every graph from scratch"),
    Variable("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "bool", True,
             "1: a graph that fails to compile raises; 0: the error is logged and the graph runs eagerly (the "
             "compile option fallback_execution overrides it)"),
    Variable("TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY", "bool", False,
             "1: a CPU tensor given to a compiled graph is an error naming the argument (by default it is copied "
             "to the device)"),
    Variable("TORCH_NEURONX_RETAIN_DEVICE_MODE", "bool", False,
             "1: a compiled graph's outputs go back to the device its inputs came from (CPU inputs give CPU "
             "outputs; mixing input devices is an error); by default outputs stay on neuron"),
    Variable("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS", "bool", False,
             "1: keep every compiled graph's artifacts under TORCH_NEURONX_DEBUG_DIR",
             "fx_graphs/ (Dynamo's graph, the forward and backward graphs), stablehlo/ (Inductor's post-grad "
             "graph), neff/ (the generated code: Python wrapper and C++ kernels), each with proc_<rank>/, and "
             "an index.json per process"),
    Variable("TORCH_NEURONX_DEBUG_DIR", "path", "/tmp/neuron_backend", "where preserved compilation artifacts go"),
    Variable("TORCH_NEURONX_RECOMPILE_WARN_THRESHOLD", "int", 4,
             "warn when one function recompiles more often than this", "an emulator extension"),
    # -- metrics
    Variable("TORCH_NEURONX_METRICS_ENABLED", "bool", False, "1: collect torch_neuronx.metrics counters"),
    Variable("TORCH_NEURONX_ENABLED_METRIC_TABLES", "list", "",
             "metric tables written as CSV at exit; the one table is graph_stats"),
    Variable("TORCH_NEURONX_METRICS_DIR", "path", "/tmp", "where the metric tables are written"),
    # -- torch-neuronx check (set by the checker in the processes it launches)
    Variable("TORCH_NEURONX_CHECK_DIR", "path", "", "where a process launched by `torch-neuronx check` writes "
             "its measurements; set, `import torch_neuronx` installs the checker's probe",
             "an emulator extension (docs/check.md)"),
    Variable("TORCH_NEURONX_CHECK_SIDE", "str", "", "set by `torch-neuronx check`: `neuron` or `reference`, the "
             "run this process belongs to (the reference compiles `backend=\"neuron\"` for the CPU)",
             "an emulator extension (docs/check.md)"),
    Variable("TORCH_NEURONX_REMOVE_ON_STARTER_EXIT", "str", "", "set by `torch-neuronx plan --measure` for the "
             "process guardian: the temporary folder it removes when the planner dies without cleaning up",
             "an emulator extension (docs/plan.md)"),
    Variable("TORCH_NEURONX_PLAN_STACKS_AFTER_S", "str", "", "set by `torch-neuronx plan --measure` in its "
             "ranks: after this many seconds a rank still running writes every thread's Python stack to its log",
             "an emulator extension (docs/plan.md)"),
    Variable("TORCH_NEURONX_CHECK_RANKS_ONLY", "bool", False, "1: the checker's probe watches only processes with "
             "RANK set (the job runs under torchrun; its agent is not watched)",
             "an emulator extension (docs/check.md)"),
    Variable("TORCH_NEURONX_CHECK_LAUNCH_TIME", "str", "", "the Unix time `torch-neuronx check` launched the job "
             "(for the startup time)", "an emulator extension (docs/check.md)"),
    # -- distributed
    Variable("COLLECTIVE_BUCKETSIZE_IN_MB", "int", 512,
             "the bucket size of large collectives: all-gathers and reduce-scatters over it run in pieces of it",
             "read and validated when a neuron process group is created (1 to 1048576); all_gather_into_tensor and "
             "reduce_scatter_tensor over it run in bucket-sized pieces with unchanged results, counted in "
             "comm_stats() as <collective>_pieces", low=1, high=1 << 20),
    Variable("NEURON_USE_SPLIT_ALLGATHER", "bool", True, "1: split all-gathers larger than the bucket size",
             "as COLLECTIVE_BUCKETSIZE_IN_MB"),
    Variable("NEURON_USE_SPLIT_REDUCE_SCATTER", "bool", True, "1: split reduce-scatters larger than the bucket size",
             "as COLLECTIVE_BUCKETSIZE_IN_MB"),
    # -- NKI kernels (torch_neuronx.nki, docs/nki.md)
    Variable("NEURON_PLATFORM_TARGET_OVERRIDE", "str", "", "the NeuronCore generation NKI kernels target: trn1/inf2/"
             "gen2, trn2/gen3, trn3/gen4", "read at each kernel launch; unset: the emulated instance's chip"),
    Variable("TORCH_NEURONX_NKI_CAPACITY", "str", "warn", "what an NKI launch does when its live SBUF/PSUM goes "
             "over the target's budget: warn, strict (an error) or off", "an emulator extension (docs/nki.md)"),
)}

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")
_warned: set[str] = set()


def _bad(name: str, text: str, wanted: str) -> None:
    if name not in _warned:
        _warned.add(name)
        warnings.warn(f"{name}={text!r} is not {wanted}; using the default, {VARIABLES[name].default!r}",
                      stacklevel=3)


def get(name: str, env: dict[str, str] | None = None) -> Any:
    """The variable's value from `env` (default: os.environ), parsed; the default if unset or invalid."""
    var = VARIABLES[name]
    text = (os.environ if env is None else env).get(name)
    if text is None:
        return var.default
    text = text.strip()
    if var.kind == "bool":
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False if text else var.default
        _bad(name, text, "1 or 0")
        return var.default
    if var.kind == "int":
        try:
            value = int(text)
            if value >= var.low and (var.high is None or value <= var.high):
                return value
        except ValueError:
            pass
        wanted = (f"an integer from {var.low} to {var.high}" if var.high is not None
                  else "a non-negative integer" if var.low == 0 else f"an integer of at least {var.low}")
        _bad(name, text, wanted)
        return var.default
    if var.kind == "list":
        return [item.strip() for item in text.split(",") if item.strip()]
    if var.kind == "path":
        return os.path.expanduser(text) if text else var.default
    return text
