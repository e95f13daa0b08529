"""The ``neuron`` Dynamo backend: static-shape graphs lowered to fused host code.

``torch.compile(model, backend="neuron")`` hands each graph Dynamo captures to
:func:`neuron_backend`, which lowers forward and backward through AOTAutograd
and Inductor's C++ code generator (registered for the device in
:mod:`torch_neuronx.compile.inductor`), like the Neuron compiler lowers them to
a NEFF. Semantics follow TorchNeuron:

* Shapes are static: each distinct input shape is its own graph. When Dynamo
  has made a dimension symbolic on its own (automatic dynamic shapes, or
  ``torch._dynamo.mark_dynamic``), the graph is specialised per concrete shape
  here, so a new shape still compiles a new static graph.
* ``dynamic=True`` is refused with :class:`NeuronDynamicShapesError`.
* Only mode "default" exists; other modes warn once and compile as default.
* CPU tensor inputs are copied to the device (:mod:`.placement`).
* A graph that fails to compile raises, unless
  ``TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0`` or the compile option
  ``fallback_execution=True``: then it logs the error and runs eagerly.
* Each compiled graph is recorded (:mod:`.metrics`) and, with
  ``TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS=1``, kept (:mod:`.artifacts`).
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from torch_neuronx import metrics as counters
from torch_neuronx.compile import artifacts, cache, device_interface, metrics, placement
from torch_neuronx.compile.metrics import InputDesc
from torch_neuronx.runtime import env

# Dynamo loads this module through the torch_dynamo_backends entry point when
# a compile names backend "neuron", before it traces: the device interface
# (streams, events, devices as Dynamo sees them) is registered by then.
device_interface.register()

BACKEND_NAME = "neuron"
_warned_modes: set[str] = set()


class NeuronDynamicShapesError(ValueError):
    """Raised for ``torch.compile(..., backend="neuron", dynamic=True)``: Neuron graphs have static shapes."""


DYNAMIC_SHAPES_MESSAGE = (
    'torch.compile(backend="neuron") does not support dynamic=True: Neuron graphs have static shapes and '
    "every new input shape compiles a new graph. Use dynamic=False (or leave it unset), and pad inputs to "
    "a few fixed sizes to bound the number of graphs: torch_neuronx.compile.bucketing.pad_batch(..., "
    "pad_to_multiple_of=128) or pad_batch(..., buckets=propose_buckets(lengths, max_graphs=N).buckets)."
)


def check_mode(mode: str | None) -> None:
    """Warn once per mode that is not "default" (TorchNeuron compiles only the default way)."""
    if mode in (None, "default") or mode in _warned_modes:
        return
    _warned_modes.add(mode)
    warnings.warn(
        f'torch.compile(backend="neuron") supports only mode="default"; mode={mode!r} is ignored and '
        "the model compiles as in the default mode.",
        stacklevel=3,
    )


def neuron_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], *, mode: str | None = None,
                   options: dict[str, Any] | None = None) -> Callable[..., Any]:
    """Dynamo backend ``"neuron"``; `mode` and `options` arrive from ``torch.compile``.

    Options are Inductor's config patches, plus TorchNeuron's ``fallback_execution`` (bool).
    """
    import torch._dynamo.config as dynamo_config

    from torch_neuronx.compile import inductor

    inductor.register()
    if not dynamo_config.assume_static_by_default:  # what torch.compile(dynamic=True) sets
        raise NeuronDynamicShapesError(DYNAMIC_SHAPES_MESSAGE)
    check_mode(mode)
    options = dict(options or {})
    function = _current_function()
    compile_id = _compile_id(gm)
    scalars = placement.python_scalar_positions(gm)
    cpu = placement.cpu_positions(example_inputs, scalars)
    if cpu:
        names = input_names(gm)
        placement.check_autocopy(example_inputs, cpu, names)
        back_to = placement.output_device(example_inputs, scalars)
        device = placement.target_device(example_inputs)
        placement.place_graph(gm, device)
        if scalars and not any(isinstance(x, torch.SymInt) for x in example_inputs):
            # Compiled now, inside Dynamo's tracing context: its shape environment knows the Python numbers the
            # graph reads with item().
            moved = [x.to(device) if i in cpu else x for i, x in enumerate(example_inputs)]
            run = compile_graph(gm, moved, function, compile_id, options, names)
        else:
            run = _StaticSpecializer(gm, function, compile_id, options, names, scalars)  # compiles at first call
        return placement.CpuInputs(run, cpu, device, back_to)
    placement.output_device(example_inputs, scalars)  # all on neuron: outputs stay, whatever the mode
    if any(isinstance(x, torch.SymInt) for x in example_inputs):
        return _StaticSpecializer(gm, function, compile_id, options, scalars=scalars)
    return compile_graph(gm, example_inputs, function, compile_id, options)


_log = logging.getLogger("torch_neuronx")


def fallback_execution(options: dict[str, Any]) -> bool:
    """Whether a graph that fails to compile runs eagerly: the option, else TorchNeuron's variable."""
    if "fallback_execution" in options:
        return bool(options["fallback_execution"])
    return not env.get("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION")


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any], function: str, compile_id: str | None,
                  options: dict[str, Any], names: list[str] | None = None, *,
                  read_scalars: bool = False, pinned: dict[int, Any] | None = None) -> Callable[..., Any]:
    """Compile one static graph through the memory and disk caches, and record it.

    `names` are the inputs' Dynamo sources ("" for sizes Dynamo passes as ints);
    by default they are read from the graph, where Dynamo keeps them until it
    finishes compiling. `read_scalars`: compile outside Dynamo's tracing context
    a graph that reads Python numbers from 0-d tensor inputs (:func:`static_fake_inputs`).
    `pinned`: the Python numbers (by input position) that `gm` holds as constants (:func:`pin_scalars`);
    the metrics describe those inputs by value, so that a new value is named as the recompile's reason.
    """
    start = time.perf_counter()
    names = names if names is not None else input_names(gm)  # before Inductor takes over the graph
    inductor_options = {k: v for k, v in options.items() if k != "fallback_execution"}
    node_count = len(gm.graph.nodes)
    collectives = has_collectives(gm)
    timestamp = metrics.new_timestamp()
    graph_type = "training" if torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs) else "inference"
    timing = {"inner": 0.0}
    files = artifacts.start(metrics.get_model_name(), timestamp)
    with cache.compile_lock:  # one compile at a time: it swaps process-wide settings (cache.py)
        key = cache.graph_key(gm, example_inputs, repr(sorted(options.items())))
        passes = time.perf_counter() - start
        preserve = artifacts.enabled()
        compiled = None if preserve else cache.memory_get(key)
        if compiled is not None:
            outcome = "memory"
            metrics.record_cache("memory", hit=True)
        else:
            if cache.enabled() and key is not None and not preserve:
                metrics.record_cache("memory", hit=False)
            try:
                compiled, outcome = _compile(gm, static_fake_inputs(example_inputs) if read_scalars else example_inputs,
                                             inductor_options, files if preserve else None, timing, read_scalars)
            except Exception as exc:
                if not fallback_execution(options):
                    raise
                return _eager_after_failure(gm, function, exc)
            counters.counter("CompilationCache.TotalCompilations")
            if not preserve:
                cache.memory_put(key, compiled)
    total = time.perf_counter() - start
    described = [pinned[i] if pinned and i in pinned else x for i, x in enumerate(example_inputs)]
    metrics.record_graph(function, _describe(names, described), total, outcome, compile_id)
    record = metrics.record_compiled(key or f"uncached_{timestamp}", _frame_id(compile_id), graph_type,
                                     node_count, collectives, timestamp, passes,
                                     max(0.0, total - passes - timing["inner"]), timing["inner"])
    if preserve:
        files.name = record.graph_name  # the index names each graph as get_dynamo_metrics() does
        files.write_index()
    return compiled


def _compile(gm: torch.fx.GraphModule, example_inputs: list[Any], options: dict[str, Any],
             files: artifacts.GraphArtifacts | None, timing: dict[str, float],
             static_fakes: bool = False) -> tuple[Callable[..., Any], str]:
    """Inductor's compile, timed around its inner compile; through the disk cache unless `files` is
    given (preserving artifacts compiles afresh). `static_fakes`: the inputs come from :func:`static_fake_inputs`."""
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    from torch_neuronx.compile import inductor

    patches = {**inductor.BACKEND_CONFIG, **options}
    inner: Callable[..., Any] = compile_fx_inner
    if files is not None:
        files.write("fx_graphs", "dynamo", ".fx.txt", artifacts.graph_text(gm))
        inner, extra = artifacts.inductor_hooks(files)
        patches.update(extra)

    def timed_inner(*args: Any, **kwargs: Any) -> Any:
        begin = time.perf_counter()
        try:
            return _profiled(inner(*args, **kwargs), args[1] if len(args) > 1 else kwargs.get("example_inputs"),
                             kwargs)
        finally:
            timing["inner"] += time.perf_counter() - begin

    if files is not None:
        import torch._functorch.config as functorch_config

        with functorch_config.patch(enable_autograd_cache=False, force_non_lazy_backward_lowering=True):
            return compile_fx(gm, example_inputs, inner_compile=timed_inner, config_patches=patches,
                           ignore_shape_env=static_fakes), "off"
    compiled, disk = cache.compile_with_disk_cache(
        lambda: compile_fx(gm, example_inputs, inner_compile=timed_inner, config_patches=patches,
                           ignore_shape_env=static_fakes))
    if disk.removed_corrupt:
        metrics.record_corrupt(disk.removed_corrupt)
    if disk.result != "off":
        metrics.record_cache("disk", hit=disk.result == "hit")
    return compiled, {"hit": "disk"}.get(disk.result, disk.result)


def _profiled(output: Any, example_inputs: Any, kwargs: dict[str, Any]) -> Any:
    """Make each execution of Inductor's compiled graph one device event for torch.profiler, on the core of its
    inputs, named after the graph; on hardware it is one NEFF execution (the device track shows it, and
    ``key_averages()`` counts it as the NEURON time of the CPU op that runs it). The host kernels the graph calls
    meanwhile record no device events of their own. Costs one C++ call per execution while nothing records."""
    run = getattr(output, "current_callable", None)
    core = next((x.device.index or 0 for x in example_inputs or ()
                 if isinstance(x, torch.Tensor) and x.device.type == "neuron"), None)
    if run is None or core is None:  # another kind of output, or a graph with no neuron input: no device work
        return output
    name = f"neuron::graph {kwargs.get('graph_id', '?')} ({'backward' if kwargs.get('is_backward') else 'forward'})"
    from torch_neuronx import _C

    def on_device(inputs: Any) -> Any:
        if not _C._device_profiling():
            return run(inputs)
        return _C._run_graph(name, core, run, inputs)

    output.current_callable = on_device
    return output


def _eager_after_failure(gm: torch.fx.GraphModule, function: str, exc: Exception) -> Callable[..., Any]:
    """TorchNeuron's fallback execution: log the compile error, run the captured graph eagerly."""
    _log.error("Compilation failed for %s: %s: %s", function, type(exc).__name__, exc)
    warnings.warn(f"torch_neuronx: compiling {function} failed ({type(exc).__name__}: {exc}); falling back to "
                  "eager execution of the original graph (fallback execution is on: "
                  "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0 or the fallback_execution option)", stacklevel=2)
    counters.counter("Compilation.FallbackToEager")
    return gm


_COLLECTIVE_NAMESPACES = ("_c10d_functional", "c10d", "_dtensor")


def has_collectives(gm: torch.fx.GraphModule) -> bool:
    """Whether the graph calls a collective: c10d's functional or in-place ops, or a functional-collectives
    Python function Dynamo kept whole."""
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        packet = getattr(node.target, "_overloadpacket", node.target)
        qualified = getattr(packet, "_qualified_op_name", "")
        if qualified.split("::")[0] in _COLLECTIVE_NAMESPACES:
            return True
        if (getattr(node.target, "__module__", "") or "").startswith("torch.distributed"):
            return True
    return False


def _frame_id(compile_id: str | None) -> str:
    """Dynamo's frame number from its compile id ("3/1" -> "3"), "0" when unknown."""
    if not compile_id:
        return "0"
    head = compile_id.split("/")[0].strip("[]- ")
    return head if head.isdigit() else "0"


class _StaticSpecializer:
    """Runs a graph Dynamo traced with symbolic sizes as one static graph per concrete input shape.

    Compiles happen at the first call with a shape, outside Dynamo's tracing
    context, so Inductor sees concrete sizes. The Python numbers Dynamo passes
    as 0-d tensors (`scalars`, positions) stay runtime inputs: the compile runs
    on fake inputs whose shape environment lets the graph read them with
    ``item()``, so a new value reuses the graph. Like Dynamo, it stops compiling
    after ``torch._dynamo.config.recompile_limit`` graphs and runs the rest eagerly.
    """

    def __init__(self, gm: torch.fx.GraphModule, function: str, compile_id: str | None,
                 options: dict[str, Any], names: list[str] | None = None,
                 scalars: frozenset[int] = frozenset()) -> None:
        self.gm = gm
        self.function = function
        self.compile_id: str | None = compile_id
        self.options = options
        self.names = names if names is not None else input_names(gm)
        self.scalars = scalars
        self.graphs: dict[tuple[Any, ...], Callable[..., Any]] = {}
        self.gave_up = False
        # Inductor's C++ kernels take a number read with item() outside Dynamo's context as a C++ float (an
        # unbacked SymFloat: torch/_inductor/codegen/common.py, KernelArgs.cpp_argdefs): a double-precision graph
        # would compute with it rounded to float32. Such graphs hold the numbers as constants instead, one graph
        # per value, as CPU Inductor specialises them; each new value is a recompile the metrics name.
        self.pin = bool(scalars) and computes_in_double(gm, scalars)

    def __call__(self, *args: Any) -> Any:
        values = {i: args[i].item() for i in self.scalars} if self.pin else {}
        key = tuple((tuple(a.shape), a.stride(), a.dtype, a.device, a.requires_grad, values.get(i))
                    if isinstance(a, torch.Tensor) else a for i, a in enumerate(args))
        compiled = self.graphs.get(key)
        if compiled is None:
            import torch._dynamo.config as dynamo_config

            if len(self.graphs) >= dynamo_config.recompile_limit:
                if not self.gave_up:
                    self.gave_up = True
                    varying = self._varying_values([*self.graphs, key])
                    floats = self.pin and any(self.names.index(n) in self.scalars for n in varying)
                    warnings.warn(limit_message(self.function, dynamo_config.recompile_limit, varying, floats),
                                  stacklevel=2)
                return self.gm(*args)
            if not self.pin:
                try:
                    compiled = compile_graph(self.gm, list(args), self.function, self.compile_id, self.options,
                                             self.names, read_scalars=bool(self.scalars))
                except GuardOnDataDependentSymNode:
                    # An op whose lowering must compare the float (hardtanh(x, -s, s): -s > s) cannot read it at
                    # run time: this graph holds its floats as constants from now on, as float64 graphs do.
                    self.pin = True
                    values = {i: args[i].item() for i in self.scalars}
                    key = tuple((*k[:5], values.get(i)) if i in self.scalars and isinstance(k, tuple) else k
                                for i, k in enumerate(key))
            if self.pin:
                compiled = compile_graph(pin_scalars(self.gm, values), list(args), self.function, self.compile_id,
                                         self.options, self.names, pinned=values)
            self.compile_id = None  # Dynamo's recompile reason belongs to the first specialisation only
            self.graphs[key] = compiled
        return compiled(*args)

    def _varying_values(self, keys: list[tuple[Any, ...]]) -> list[str]:
        """The named int arguments (not sizes), and the Python floats compiled in, whose value differs between
        the specialisations `keys`."""
        def value(key: tuple[Any, ...], i: int) -> Any:
            return key[i][5] if i in self.scalars and isinstance(key[i], tuple) else key[i]

        return [name for i, name in enumerate(self.names)
                if name and i < len(keys[0]) and (isinstance(keys[0][i], int) or (i in self.scalars and self.pin))
                and len({value(k, i) for k in keys}) > 1]


def limit_message(function: str, limit: int, int_arguments: list[str] | None = None,
                  float_arguments: bool = False) -> str:
    """The warning for a graph specialised past Dynamo's recompile limit: on sizes, or on the values of the
    `int_arguments` (Dynamo's sources of int arguments that changed)."""
    head = f"torch_neuronx: {function} reached torch._dynamo.config.recompile_limit ({limit}) graphs"
    if int_arguments:
        kind = "float argument" if float_arguments else "int argument"
        why = "a float compiled in" if float_arguments else "each value is its own Neuron graph"
        return (f"{head} for values of the {kind} {', '.join(int_arguments)} ({why}); new values run eagerly. "
                "Pass a value that changes as a tensor, or keep it constant.")
    return f"{head} for shapes; new shapes run eagerly. Bucket the inputs (torch_neuronx.compile.bucketing)."


_DOUBLE = (torch.float64, torch.complex128)


def computes_in_double(gm: torch.fx.GraphModule, scalars: frozenset[int]) -> bool:
    """Whether a tensor of the graph other than the Python numbers' own 0-d inputs is float64 or complex128
    (Dynamo's example values, which it keeps on every node)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    numbers = {placeholders[i] for i in scalars if i < len(placeholders)}
    for node in gm.graph.nodes:
        value = node.meta.get("example_value")
        if node not in numbers and isinstance(value, torch.Tensor) and value.dtype in _DOUBLE:
            return True
    return False


def pin_scalars(gm: torch.fx.GraphModule, values: dict[int, Any]) -> torch.fx.GraphModule:
    """A copy of `gm` in which each ``item()`` of the Python number at input position i is the constant
    ``values[i]`` (the inputs stay, unread)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    constants: dict[torch.fx.Node, Any] = {}
    for i, value in values.items():
        for user in placeholders[i].users:
            if (user.op == "call_method" and user.target == "item") or \
                    (user.op == "call_function" and user.target in (torch.Tensor.item,
                                                                     torch.ops.aten._local_scalar_dense.default)):
                constants[user] = value
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, Any] = {}
    for node in gm.graph.nodes:
        env[node] = constants[node] if node in constants else graph.node_copy(node, lambda n: env[n])
    return torch.fx.GraphModule(gm, graph)


def static_fake_inputs(args: list[Any]) -> list[Any]:
    """Fake copies of `args` with static shapes, in a fake mode with a shape environment: the graph's ``item()``
    on a Python number's 0-d tensor then traces to a symbolic value read at each run (without one, fake tensors
    raise DataDependentOutputException), as inside Dynamo's tracing context. Ints stay constants."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    fake_mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)
    return [fake_mode.from_tensor(a, static_shapes=True) if isinstance(a, torch.Tensor) else a for a in args]


def _current_function() -> str:
    """The function Dynamo is compiling: "name (file:line)", or "Model.forward" for a compiled module."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
        code, local = (tx.f_code, tx.f_locals) if tx is not None else (None, {})
    except Exception:  # an internal API: degrade to a generic name, never fail a compile
        code, local = None, {}
    if code is None:
        return "<unknown function>"
    target = local.get("fn")
    if code.co_name == "inner" and isinstance(target, torch.nn.Module):
        # torch.compile(module) traces a wrapper shared by every compiled module: name the module.
        return f"{type(target).__name__}.forward (module at {id(target):#x})"
    return f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})"


def _compile_id(gm: torch.fx.GraphModule) -> str | None:
    compile_id = gm.meta.get("dynamo_compile_id") if hasattr(gm, "meta") else None
    return str(compile_id) if compile_id is not None else None


def input_names(gm: torch.fx.GraphModule) -> list[str]:
    """Dynamo's source of each graph input, e.g. "L['x']"; "" for a size Dynamo made symbolic (an int argument
    Dynamo made symbolic keeps its name: it is specialised per value, and the metrics say so)."""
    names = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        grapharg = node.meta.get("grapharg")
        source = getattr(grapharg, "source", None)
        example = node.meta.get("example_value")
        if isinstance(example, torch.SymInt) and (source is None or _is_tensor_property(source)):
            names.append("")
        else:
            names.append(source.name if source is not None else node.name)
    return names


def _is_tensor_property(source: Any) -> bool:
    """Whether a Dynamo source is a size, stride or offset of a tensor input (not a Python int the user passed)."""
    try:
        from torch._dynamo.source import TensorPropertySource
    except ImportError:  # an internal module: read the source's text instead
        TensorPropertySource = ()  # noqa: N806
    if TensorPropertySource and isinstance(source, TensorPropertySource):
        return True
    name = getattr(source, "name", "")
    name = name() if callable(name) else name
    return any(part in str(name) for part in (".size()", ".stride()", ".storage_offset()"))


def _describe(names: list[str], inputs: list[Any]) -> tuple[InputDesc, ...]:
    described = []
    for name, value in zip(names, inputs, strict=False):
        if not name:
            continue  # a symbolic size: the tensor it measures shows the change
        if isinstance(value, torch.Tensor):
            parameter = isinstance(value, torch.nn.Parameter) or "_parameters" in name
            described.append(InputDesc(name, tuple(value.shape), parameter=parameter))
        else:
            described.append(InputDesc(name, None, value if isinstance(value, int | float | bool) else repr(value)))
    return tuple(described)
