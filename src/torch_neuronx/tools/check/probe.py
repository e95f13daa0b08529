"""The checker's eyes inside a job: what each process of a `torch-neuronx check` run did, step by step.

``torch-neuronx check`` launches the user's job with ``TORCH_NEURONX_CHECK_DIR``
set; ``import torch_neuronx`` (autoloaded by ``import torch``) then calls
:func:`install`, and nothing else in the plugin changes. Without the variable
this module is never imported: the job pays nothing.

Each process appends JSON lines to ``<dir>/rank<R>.jsonl``: ``start``, one
``step`` per optimizer step (or per :func:`torch_neuronx.check.step` marker,
which takes over once used), ``record`` (values the job asks to compare),
``save`` (what ``torch.save`` or safetensors wrote, with a digest of every tensor; a buffer's bytes are
kept beside the events so that they can be loaded too), ``rng`` (random draws that could not follow the
CPU's stream, tools/check/rng.py),
``mesh`` (each root DeviceMesh built), ``error`` (an uncaught exception) and
``end`` (with the process's collective totals, read from every neuron process group it created, destroyed
ones included). A step carries the losses (every autograd root: ``backward`` on a scalar, or on
a tensor with its gradient as sum(root x gradient); ``torch.autograd.grad``'s
outputs likewise; or the ``check.step(loss)`` marker's), a digest of the
optimizer's parameters (per-tensor norms; replicas must agree), the top-level
modules' output shapes, tokens and examples fed, device memory of the
process's cores, compilations (with reasons), graph breaks, CPU-fallback ops
and collective bytes, each as the change since the previous step. The
launcher reads the files while the job runs (progress) and after it
(verdicts), so every line is flushed as it is written.
"""

from __future__ import annotations

import atexit
import hashlib
import io
import json
import os
import sys
import threading
import time
import traceback
import weakref
from typing import Any

import torch

from torch_neuronx.runtime import env
from torch_neuronx.tools.check.cpu_loader import flat_tensors, tensor_digest

_probe: Probe | None = None


def active() -> Probe | None:
    return _probe


def step(loss: torch.Tensor | float | None = None) -> None:
    """End a step; `loss` (optional) is the step's loss, else the loss backward started from. Without the
    checker: nothing."""
    if _probe is not None:
        _probe.marker(loss)


def record(name: str, value: Any) -> None:
    """Record a value (tensor, number, nested list) under `name`, to compare with the reference run's. Without
    the checker: nothing."""
    if _probe is None:
        return
    if isinstance(value, torch.Tensor):
        value = value.detach().to("cpu")
        value = value.float().tolist() if value.is_floating_point() else value.tolist()
    _probe.emit("record", name=name, value=value)


def _ref(obj: Any) -> Any:
    """A weak reference to `obj`, or a strong one where it takes no weak references (a wrapper with __slots__)."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


def _shapes(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return list(out.shape)
    if isinstance(out, dict):
        return {str(k): _shapes(v) for k, v in out.items() if _shapes(v) is not None}
    if isinstance(out, (list, tuple)):
        return [_shapes(v) for v in out[:8]]
    if hasattr(out, "to_tuple"):  # transformers' ModelOutput
        return _shapes(dict(out))
    return None


def _first_tensor(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    if isinstance(kwargs.get("input_ids"), torch.Tensor):
        return kwargs["input_ids"]
    for v in (*args, *kwargs.values()):
        if isinstance(v, torch.Tensor):
            return v
    return None


class Probe:
    """Per-process state: the step being measured and the event file."""

    def __init__(self, directory: str) -> None:
        self.rank = int(os.environ.get("RANK", "0") or 0)
        self.world_size = int(os.environ.get("WORLD_SIZE", "1") or 1)
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"rank{self.rank}.jsonl")
        try:  # the rank's first process owns its file; processes it spawns (data workers) write beside it
            self._file = open(path, "x", buffering=1)  # noqa: SIM115
        except FileExistsError:
            self._file = open(path[:-6] + f".{os.getpid()}.jsonl", "a", buffering=1)  # noqa: SIM115
        self._lock = threading.Lock()
        self._depth = 0
        self._step = 0
        self._marker_seen = False
        self._optimizer: Any = None  # a reference to the tracked optimizer (its steps are the job's steps)
        self._losses: list[torch.Tensor] = []
        self._explicit_loss: float | None = None
        self._shapes: list[Any] = []
        self._tokens = 0
        self._examples = 0
        self._first_forward: float | None = None
        self._models: list[weakref.ref[torch.nn.Module]] = []
        self._compile = {"graphs": 0, "recompilations": 0, "seconds": 0.0, "breaks": 0}
        self._comm: dict[str, dict[str, int]] = {}
        self._backends: list[Any] = []  # every neuron process group backend made here: read after their destroy too
        self._fallbacks: dict[str, int] = {}
        self._capacity: dict[int, int] = {}
        self._cores: set[int] = set()
        self._ended = False
        self._optimizer_steps = 0
        self._stepping = 0  # optimizer steps in progress (an outer one's step calls an inner one's)
        self._markers = 0
        self._loss_sources: set[str] = set()
        self._params: dict[str, Any] | None = None
        self._recompiles_seen: dict[str, int] = {}
        self._dynamo_seen: dict[str, str] = {}
        self._buffers = 0
        self._directory = directory
        self._wrappers: list[dict[str, Any]] = []  # described at the step a model first ran: it may be gone at exit
        self._described = 0
        # what the tracked optimizer did to each parameter (tools/check/optimizers.py): id -> [weakref, steps,
        # allowance, lowest lr, highest lr, names, shape]; the allowance a checkpoint's tensor is compared with
        self._trained: dict[int, list[Any]] = {}
        self._optimizer_kind: tuple[str, str] | None = None  # the first optimizer stepped: (class name, family)
        self._kinds: dict[int, tuple[Any, tuple[str, str]]] = {}  # every live optimizer stepped: id -> (ref, family)
        self._families: dict[tuple[str, str], None] = {}  # every optimizer family stepped, in order (several kinds)
        self._tracked_steps = 0  # steps of the tracked optimizer, markers or not: when each checkpoint was saved
        self._dcp_saved: set[tuple[str, int]] = set()
        self._untouched: list[str] = []
        self._stacks_file: Any = None  # where faulthandler writes the stacks the checker asks for (a hang)

    # ------------------------------------------------------------ events
    def emit(self, kind: str, **data: Any) -> None:
        line = json.dumps({"e": kind, "t": time.time(), **data}, default=str)
        with self._lock:
            if not self._file.closed:
                self._file.write(line + "\n")

    # ------------------------------------------------------------ hooks
    def forward_pre(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if torch.compiler.is_compiling():
            return
        if self._depth == 0 and self._first_forward is None:
            self._first_forward = time.time()
            self.emit("first_forward")
        self._depth += 1

    def forward_post(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                     out: Any) -> None:
        if torch.compiler.is_compiling():
            return
        self._depth = max(0, self._depth - 1)
        if self._depth:
            return
        if not any(r() is module for r in self._models):
            self._models.append(weakref.ref(module))
        x = _first_tensor(args, kwargs)
        if x is not None and x.device.type == "neuron" and x.device.index is not None:
            self._cores.add(x.device.index)
        if x is not None and x.dim() >= 1:
            self._examples += int(x.shape[0])
            if not x.is_floating_point() and x.dim() >= 2:
                self._tokens += int(x.numel())
        if len(self._shapes) < 16:
            self._shapes.append({"module": type(module).__name__, "output": _shapes(out)})

    def on_backward(self, roots: Any, gradients: Any, source: str = "backward") -> None:
        """A backward pass or ``autograd.grad`` starts from `roots` (with `gradients`, None for scalars): its loss
        is sum(root x gradient) over the roots, the scalar whose gradient the call computes. Calls made by
        autograd itself (a checkpoint's recomputation) are not losses."""
        if torch.compiler.is_compiling() or torch._C._current_autograd_node() is not None or _tracing():
            return  # Dynamo, AOTAutograd's joint graph (autograd.grad on fake tensors), or autograd itself
        try:
            loss = _weighted_root(roots, gradients)
        except Exception as e:  # a measurement that fails is reported, never raised into the job
            self.emit("probe_error", where=source, message=f"{type(e).__name__}: {e}")
            return
        if loss is not None:
            self._losses.append(loss)
            self._loss_sources.add(source)

    def before_optimizer_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._stepping += 1

    def on_optimizer_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._stepping = max(0, self._stepping - 1)
        if self._stepping:  # an optimizer stepped by another one (ZeRO's per-shard optimizer): the outer one's
            return  # step ends the step, after its own parameter sync
        if self._optimizer is None or self._optimizer() is None:
            # the first optimizer, or the next one once the tracked one is gone (a job that trains one model after
            # another): an object, not its id(), which a new optimizer can reuse once the old one is freed
            self._optimizer = _ref(optimizer)
        first = self._optimizer() is optimizer
        try:  # every optimizer's parameters get its own family's allowance (SGD on a body, Adam on a head)
            self._track(optimizer, first=first)
        except Exception as e:  # never raised into the job
            self.emit("probe_error", where="optimizer", message=f"{type(e).__name__}: {e}")
        if self._marker_seen:
            return
        if first:  # one step per step of the tracked optimizer (GANs have two)
            self._optimizer_steps += 1
            try:
                self._params = _param_digest(p for g in optimizer.param_groups for p in g["params"])
            except Exception as e:
                self._params = {"error": f"{type(e).__name__}: {e}"}
            self.end_step()

    def _track(self, optimizer: torch.optim.Optimizer, first: bool = True) -> None:
        """One step of an optimizer: each parameter it updated (one with a gradient) adds the largest update its
        family can make at that step to its allowance (tools/check/optimizers.py). `first`: the job's first
        optimizer, whose steps are the steps checkpoints are dated by."""
        from torch_neuronx.tools.check import optimizers

        entry = self._kinds.get(id(optimizer))
        if entry is None or entry[0]() is not optimizer:  # new, or a new optimizer at a freed one's address
            entry = self._kinds[id(optimizer)] = (_ref(optimizer), optimizers.family(optimizer))
            self._families[entry[1]] = None
        named = entry[1]
        if self._optimizer_kind is None and first:
            self._optimizer_kind = named
        kind = named[1]
        if first:
            self._tracked_steps += 1
        new = False
        for group in optimizer.param_groups:
            lr = optimizers._number(group.get("lr"), 0.0)
            for p in group["params"]:
                if getattr(p, "grad", None) is None:
                    continue  # not updated at this step (a frozen or unused parameter)
                rec = self._trained.get(id(p))
                if rec is None or rec[0]() is not p:
                    rec = self._trained[id(p)] = [weakref.ref(p), 0, 0.0, lr, lr, None, list(p.shape), named]
                    new = True
                rec[1] += 1
                rec[2] += 2 * optimizers.step_bound(kind, group, rec[1])
                rec[3], rec[4] = min(rec[3], lr), max(rec[4], lr)
        if new:
            self._name_parameters()

    def _name_parameters(self) -> None:
        """The names the models this process ran give each tracked parameter (a checkpoint's keys are matched to
        them), kept so that they outlive the models."""
        names: dict[int, list[str]] = {}
        for model in (r() for r in self._models):
            if model is None:
                continue
            for name, p in model.named_parameters(remove_duplicate=False):
                names.setdefault(id(p), []).append(name)
        for key, rec in self._trained.items():
            if rec[5] is None and key in names and rec[0]() is not None:
                rec[5] = names[key][:4]
        tracked = {key for key, rec in self._trained.items() if rec[0]() is not None}
        untouched = set(self._untouched)  # parameters the optimizer never updated, and buffers: the tight bound
        for model in (r() for r in self._models):
            if model is not None:
                untouched |= {n for n, p in model.named_parameters(remove_duplicate=False) if id(p) not in tracked}
                untouched |= {n for n, _ in model.named_buffers(remove_duplicate=False)}
        self._untouched = sorted(untouched)[:2000]  # kept: the models may be gone when the run ends

    def trained(self) -> dict[str, Any] | None:
        """The tracked optimizer and each parameter it updated: names, shape, steps, lr range and allowance (the
        table a checkpoint's tensors are matched to by name and shape)."""
        if self._optimizer_kind is None:
            return None
        self._name_parameters()
        params = [{"names": rec[5] or [], "shape": rec[6], "steps": rec[1], "allowance": rec[2],
                   "lr": [rec[3], rec[4]], "optimizer": rec[7][0], "family": rec[7][1]}
                  for rec in self._trained.values()]  # kept after the model is gone
        name, kind = self._optimizer_kind
        others = [k for k in self._families if k != self._optimizer_kind]
        if others:  # several optimizers: each tensor's entry says which one trained it
            name = " + ".join([name] + [n for n, _ in others])
            kind = kind if all(k == kind for _, k in others) else "mixed"
        trained_names = {n for rec in self._trained.values() for n in rec[5] or []}
        return {"optimizer": name, "family": kind, "steps": self._tracked_steps, "params": params,
                "untouched": [n for n in self._untouched if n not in trained_names]}

    def end_step(self, final: bool = False) -> None:
        try:
            self._end_step(final)
        except Exception as e:  # a measurement that fails is reported, never raised into the job
            self.emit("probe_error", where="step", message=f"{type(e).__name__}: {e}",
                      traceback=traceback.format_exc()[-3000:])
            self._step += 1

    def on_save(self, obj: Any, f: Any, kind: str = "torch.save") -> None:
        """After torch.save (or safetensors' save_file) wrote `obj` to `f`: a path, a named file object, or a
        buffer, whose bytes are kept beside the events so that the checker can load them too."""
        try:
            self._on_save(obj, f, kind)
        except Exception as e:  # never raised into the job
            self.emit("probe_error", where="save", message=f"{type(e).__name__}: {e}")

    def _on_save(self, obj: Any, f: Any, kind: str) -> None:
        if _distributed_checkpoint_part(f):  # one tensor of a DCP folder: the checker loads the folder whole
            folder = _distributed_checkpoint_folder(f)
            if folder is not None and (folder, self._tracked_steps) not in self._dcp_saved:
                self._dcp_saved.add((folder, self._tracked_steps))  # when it was saved, once per folder and step
                self.emit("save", path=folder, format="dcp", buffer=False, target="folder", tensors={},
                          objects="distributed checkpoint", inode=None, optimizer_steps=self._tracked_steps,
                          trained=self.trained())
            return
        try:
            digests = {k: {"digest": tensor_digest(t), "shape": list(t.shape), "dtype": str(t.dtype),
                           "device": t.device.type} for k, t in flat_tensors(obj).items()}
        except Exception as e:  # a tensor we cannot read is reported, never raised into the job
            digests = {"?": {"error": f"{type(e).__name__}: {e}"}}
        path, buffer = None, False
        if isinstance(f, (str, os.PathLike)):
            path = os.path.abspath(os.fspath(f))
        elif isinstance(getattr(f, "name", None), str) and os.path.isfile(f.name):
            path = os.path.abspath(f.name)
            try:
                f.flush()
            except Exception:
                pass
        elif isinstance(f, io.BytesIO):
            try:
                self._buffers += 1
                folder = os.path.join(self._directory, "buffers")
                os.makedirs(folder, exist_ok=True)
                path = os.path.join(folder, f"rank{self.rank}-{os.getpid()}-{self._buffers}.pt")
                with open(path, "wb") as out:
                    out.write(f.getvalue())
                buffer = True
            except Exception as e:
                self.emit("probe_error", where="save", message=f"{type(e).__name__}: {e}")
                path = None
        inode = None
        if path is not None:  # to follow the file through renames (torch.save(tmp), then os.replace(tmp, final))
            try:
                st = os.stat(path)
                inode = [st.st_dev, st.st_ino]
            except OSError:
                pass
        self.emit("save", path=path, format=kind, buffer=buffer, target=type(f).__name__, tensors=digests,
                  objects=type(obj).__name__, inode=inode, optimizer_steps=self._tracked_steps,
                  trained=self.trained())

    def on_mesh(self, mesh: Any) -> None:
        try:
            if mesh._get_root_mesh() is not mesh:
                return
            coord = mesh.get_coordinate()
            self.emit("mesh", shape=list(mesh.mesh.shape), names=list(mesh.mesh_dim_names or ()),
                      device_type=mesh.device_type, ranks=mesh.mesh.flatten().tolist(),
                      coordinate=list(coord) if coord is not None else None)
        except Exception as e:
            self.emit("mesh", error=f"{type(e).__name__}: {e}")

    # ------------------------------------------------------------ steps
    def marker(self, loss: Any = None) -> None:
        self._marker_seen = True
        self._markers += 1
        if loss is not None:
            if isinstance(loss, torch.Tensor):
                if hasattr(loss, "to_local") and type(loss) is not torch.Tensor:
                    loss = loss.to_local()
                loss = loss.detach().float().sum().item()
            self._explicit_loss = float(loss)
            self._loss_sources.add("marker")
        self.end_step()

    def _end_step(self, final: bool = False) -> None:
        losses = [float(t.float().item()) for t in self._losses]
        if self._explicit_loss is not None:
            losses = [self._explicit_loss]
        loss = sum(losses) / len(losses) if losses else None
        extra: dict[str, Any] = {"final": True} if final else {}
        if self._params is not None:
            extra["params"] = self._params
        from torch_neuronx.tools.check import rng

        if len(self._models) != self._described:
            self._described = len(self._models)
            self._wrappers = self.wrappers()
        unaligned = rng.take_unaligned()
        if unaligned:
            extra["rng_unaligned"] = unaligned
        self.emit("step", i=self._step, loss=loss, losses=losses,
                  finite=all(v == v and abs(v) != float("inf") for v in losses), sources=sorted(self._loss_sources),
                  shapes=self._shapes, tokens=self._tokens, examples=self._examples,
                  memory=self._memory(), world_size=_world_size(), **extra, **self._deltas())
        self._step += 1
        self._losses, self._shapes, self._explicit_loss, self._params = [], [], None, None
        self._loss_sources = set()
        self._tokens = self._examples = 0
        self._depth = 0

    def _memory(self) -> list[dict[str, Any]]:
        """The cores this process works on (its current core and those its models' inputs were on): allocated
        now, peak so far, reserved, capacity. Raw allocator statistics: torch.neuron.memory_stats flattens every
        key (0.6 ms a call)."""
        device = torch.neuron
        if not device.is_initialized():
            return []
        cores = []
        for i in sorted(self._cores | {device.current_device()}):
            stats = torch._C._accelerator_getDeviceStats(i)
            allocated = stats.get("allocated_bytes", {}).get("all", {})
            if allocated.get("peak"):
                if i not in self._capacity:
                    self._capacity[i] = device.get_device_properties(i).total_memory
                cores.append({"device": i, "allocated": allocated["current"], "peak": allocated["peak"],
                              "reserved": stats["reserved_bytes"]["all"]["current"], "capacity": self._capacity[i]})
        return cores

    def _deltas(self) -> dict[str, Any]:
        from torch_neuronx.compile import metrics
        from torch_neuronx.tools import op_tracker

        snap = metrics.snapshot()
        seen = self._compile
        if snap["graphs_compiled"] < seen["graphs"] or snap["recompilations"] < seen["recompilations"]:
            seen = {"graphs": 0, "recompilations": 0, "seconds": 0.0, "breaks": 0}  # the job reset the metrics
        if seen["recompilations"] == 0:
            self._recompiles_seen = {}
        new_recompiles = self._new_recompiles(snap["recompile_reasons"])
        compile_delta = {"graphs": snap["graphs_compiled"] - seen["graphs"],
                         "seconds": round(snap["compile_seconds"] - seen["seconds"], 4),
                         "graph_breaks": snap["graph_breaks"]["count"] - seen["breaks"],
                         "recompiles": new_recompiles}
        self._compile = {"graphs": snap["graphs_compiled"], "recompilations": snap["recompilations"],
                         "seconds": snap["compile_seconds"], "breaks": snap["graph_breaks"]["count"]}
        fallbacks = op_tracker.fallback_ops()
        before = self._fallbacks
        new_fallbacks = {k: n - before.get(k, 0) for k, n in fallbacks.items() if n > before.get(k, 0)}
        self._fallbacks = fallbacks
        comm = _comm_stats(self._backends)
        comm_delta = {k: {"calls": v["calls"] - self._comm.get(k, {}).get("calls", 0),
                          "bytes": v["bytes"] - self._comm.get(k, {}).get("bytes", 0)} for k, v in comm.items()}
        self._comm = comm
        return {"compile": compile_delta, "fallbacks": new_fallbacks,
                "comm": {k: v for k, v in comm_delta.items() if v["calls"]}}

    def _new_recompiles(self, reasons: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The recompilations since the last step, of every function. The metrics list them grouped by function
        (not by time): what is new is each function's entries beyond the count seen before."""
        per_function: dict[str, list[dict[str, Any]]] = {}
        for r in reasons:
            per_function.setdefault(r["function"], []).append(r)
        new = []
        for function, entries in per_function.items():
            seen = self._recompiles_seen.get(function, 0)
            for r in entries[:seen]:
                if r.get("dynamo_reason"):
                    self._dynamo_seen[function] = r["dynamo_reason"]
            for r in entries[seen:]:
                new.append({"function": function, "reason": self._reason(function, r)})
            self._recompiles_seen[function] = len(entries)
        return new

    def _reason(self, function: str, r: dict[str, Any]) -> str:
        """A recompilation's reason in words: the changed dims, Dynamo's failed guard, or (for the graphs the
        backend compiles per value once Dynamo made an input dynamic) which input became dynamic."""
        if r.get("changed"):
            return str(r["reason"])
        dynamo = r.get("dynamo_reason")
        if dynamo:
            self._dynamo_seen[function] = dynamo
            return _guard_words(dynamo)
        previous = self._dynamo_seen.get(function)
        if previous:
            name = _guard_input(previous)
            what = f"`{name}`" if name else "an input"
            return (f"{what} became dynamic after the guard `{_guard_expr(previous)}` failed; the backend compiles "
                    "a static graph for each new value (mark it static, or pass it as a tensor)")
        return str(r.get("reason") or "guard failure")

    # ------------------------------------------------------------ end
    def wrappers(self) -> list[dict[str, Any]]:
        """The models this process ran (top-level modules; a submodule recomputed by activation checkpointing
        during backward is called at the top level too, and is left out)."""
        models = [m for m in (r() for r in self._models) if m is not None]
        inner = {id(sub) for m in models for sub in m.modules() if sub is not m}
        return [describe_wrappers(m) for m in models if id(m) not in inner]

    def finish(self) -> None:
        if self._ended:
            return
        self._ended = True
        if self._losses or self._shapes:  # work after the last optimizer step (evaluation, generation)
            self.end_step(final=True)
        from torch_neuronx.compile import metrics

        try:
            wrappers = self.wrappers() or self._wrappers  # the models may be gone by now: then as last seen
        except Exception as e:
            wrappers = [{"error": f"{type(e).__name__}: {e}"}]
        try:
            snap = metrics.snapshot()
            compiled = {"functions": snap["functions"], "graph_breaks": snap["graph_breaks"],
                        "compile_seconds": snap["compile_seconds"], "graphs": snap["graphs_compiled"]}
        except Exception as e:
            compiled = {"error": f"{type(e).__name__}: {e}"}
        try:  # the process's true totals, those issued after its last step (or with no step at all) included
            comm_total: Any = _comm_stats(self._backends)
        except Exception as e:
            comm_total = {"error": f"{type(e).__name__}: {e}"}
        self._backends.clear()
        try:
            trained = self.trained()
        except Exception as e:
            trained = {"error": f"{type(e).__name__}: {e}"}
        self.emit("end", compile=compiled, wrappers=wrappers, world_size=_world_size(),
                  optimizer_steps=self._optimizer_steps, markers=self._markers, comm=comm_total, trained=trained)
        with self._lock:
            self._file.close()

    def excepthook(self, kind: type[BaseException], value: BaseException, tb: Any) -> None:
        self.emit("error", type=f"{kind.__module__}.{kind.__qualname__}", message=str(value)[:4000],
                  traceback="".join(traceback.format_exception(kind, value, tb))[-6000:])


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (never a collective: the probe must not change the job's communication)."""
    if type(t) is not torch.Tensor and hasattr(t, "to_local"):
        return t.to_local()
    return t


def _tracing() -> bool:
    """Whether a tracer is running (fake, functional or proxy tensors): a compiler's call, not the job's."""
    keys = torch._C._TorchDispatchModeKey
    return any(torch._C._get_dispatch_mode(k) is not None for k in (keys.FAKE, keys.FUNCTIONAL, keys.PROXY))


def _weighted_root(roots: Any, gradients: Any) -> torch.Tensor | None:
    """sum(root x gradient) over a backward call's roots (a scalar root without a gradient: itself)."""
    roots = list(roots) if isinstance(roots, (list, tuple)) else [roots]
    if gradients is None or isinstance(gradients, torch.Tensor):
        gradients = [gradients] * len(roots) if len(roots) == 1 or gradients is None else [gradients]
    total: torch.Tensor | None = None
    for root, grad in zip(roots, list(gradients) + [None] * (len(roots) - len(gradients)), strict=False):
        if not isinstance(root, torch.Tensor) or not (root.is_floating_point() or root.is_complex()):
            continue
        if type(root).__name__ in ("FakeTensor", "FunctionalTensor"):
            return None
        value = _local(root).detach()
        if isinstance(grad, torch.Tensor):
            value = (value.float() * _local(grad).detach().float()).sum()
        elif value.numel() != 1:
            continue  # autograd refuses a non-scalar root without a gradient: the job's error, not a loss
        value = value.reshape(())
        total = value if total is None else total + value.to(total.device)
    return total


def _param_digest(params: Any) -> dict[str, Any]:
    """Per-tensor L2 norms of the parameters (their local shards), as one norm and a hash of all of them:
    replicas hold bit-identical parameters, so their hashes agree; the norm is compared with tolerance."""
    tensors, sharded = [], False
    for p in params:
        if type(p) is not torch.nn.Parameter and type(p) is not torch.Tensor:
            if not isinstance(p, torch.Tensor):
                continue
            if hasattr(p, "to_local"):
                sharded = True
                p = p.to_local()
        if p.is_floating_point() and p.numel():
            tensors.append(p)  # no detach: read under no_grad
    if not tensors:
        return {"n": 0, "norm": 0.0, "digest": "", "sharded": sharded}
    with torch.no_grad():
        try:  # one kernel for all, one copy back
            norms = torch.stack(torch._foreach_norm(tensors, 2, dtype=torch.float32)).cpu().tolist()
        except RuntimeError:  # tensors on several devices or of kinds foreach refuses: one at a time
            norms = [float(t.float().norm().cpu()) for t in tensors]
    digest = hashlib.sha256(json.dumps(norms).encode()).hexdigest()[:16]
    shapes = json.dumps([[list(t.shape), str(t.dtype)] for t in tensors])  # replicas share it; pipeline stages do not
    return {"n": len(tensors), "norm": sum(v * v for v in norms) ** 0.5, "digest": digest, "sharded": sharded,
            "structure": hashlib.sha256(shapes.encode()).hexdigest()[:16]}


def _guard_expr(dynamo_reason: str) -> str:
    """`0/0: n == 2   # return x * n  # file:5 in f\nUser stack trace: ...` -> `n == 2`."""
    first = dynamo_reason.strip().splitlines()[0] if dynamo_reason.strip() else ""
    if ": " in first and first.split(": ", 1)[0].replace("/", "").isdigit():
        first = first.split(": ", 1)[1]
    return first.split("#", 1)[0].strip()


def _guard_input(dynamo_reason: str) -> str | None:
    import re

    m = re.match(r"(?:L\[')?([A-Za-z_][A-Za-z0-9_]*)", _guard_expr(dynamo_reason))
    m2 = re.search(r"tensor '([^']+)'", dynamo_reason)
    return (m2 or m)[1] if (m2 or m) else None


def _guard_words(dynamo_reason: str) -> str:
    expr = _guard_expr(dynamo_reason)
    name = _guard_input(dynamo_reason)
    if "tensor '" in expr:
        return expr
    return f"`{name}` changed (guard `{expr}` failed)" if name else f"guard `{expr}` failed"


def _distributed_checkpoint_part(f: Any) -> bool:
    """Whether torch.save is writing one item of a torch.distributed.checkpoint (DCP) folder: its writer saves
    each tensor into a stream of its own (a ``.distcp`` file, or a wrapper of it from DCP's module)."""
    if type(f).__module__.startswith("torch.distributed.checkpoint"):
        return True
    name = f if isinstance(f, (str, os.PathLike)) else getattr(f, "name", None)
    return isinstance(name, (str, os.PathLike)) and os.fspath(name).endswith(".distcp")


def _distributed_checkpoint_folder(f: Any) -> str | None:
    """The folder of the DCP file a part is written to (DCP's writer wraps the file in NoCloseWriter: its ``raw``)."""
    for candidate in (f, getattr(f, "raw", None)):
        name = candidate if isinstance(candidate, (str, os.PathLike)) else getattr(candidate, "name", None)
        if isinstance(name, (str, os.PathLike)):
            return os.path.dirname(os.path.abspath(os.fspath(name)))
    return None


def _comm_stats(known: list[Any]) -> dict[str, dict[str, int]]:
    """Collectives of every neuron process group of this process (the world and each mesh dimension's), summed:
    the backends seen made (`known`, still counted after destroy_process_group) and those of the live groups."""
    backends = list(known)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        from torch.distributed import distributed_c10d

        from torch_neuronx import distributed

        for group in list(distributed_c10d._world.pg_map):
            try:
                backend = distributed._neuron_backend(group)
            except Exception:  # not a neuron group (gloo on a CPU reference run)
                continue
            if not any(backend is b for b in backends):
                backends.append(backend)
    total: dict[str, dict[str, int]] = {}
    for backend in backends:
        for name, (calls, nbytes) in backend.comm_stats().items():
            t = total.setdefault(name, {"calls": 0, "bytes": 0})
            t["calls"] += calls
            t["bytes"] += nbytes
    return total


def _world_size() -> int | None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return None


def describe_wrappers(model: torch.nn.Module) -> dict[str, Any]:
    """How `model` is wrapped for distribution: DDP, FSDP (1 and 2), DTensor parameters, and wrapping twice."""
    from torch.nn.parallel import DistributedDataParallel

    ddp, fsdp1, fsdp2, double, hooks = [], [], [], [], []
    fsdp2_cls = fsdp1_cls = None
    if torch.distributed.is_available():
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

        fsdp2_cls, fsdp1_cls = FSDPModule, FullyShardedDataParallel
    for name, m in model.named_modules():
        kinds = []
        if isinstance(m, DistributedDataParallel):
            ddp.append(name or "<root>")
            kinds.append("DDP")
            # the communication hooks (register_comm_hook): post_localSGD_hook lets replicas differ between averages
            hooks += [getattr(h, "__qualname__", type(h).__name__) for h, _ in getattr(m, "_comm_hooks", [])]
        if fsdp1_cls is not None and isinstance(m, fsdp1_cls):
            fsdp1.append(name or "<root>")
            kinds.append("FSDP")
        if fsdp2_cls is not None and isinstance(m, fsdp2_cls):
            fsdp2.append(name or "<root>")
            kinds.append("fully_shard")
        inner = getattr(m, "module", None)
        if kinds and isinstance(inner, torch.nn.Module) and inner is not m:
            for inner_kind, cls in (("DDP", DistributedDataParallel), ("FSDP", fsdp1_cls), ("fully_shard", fsdp2_cls)):
                if cls is not None and isinstance(inner, cls):
                    double.append(f"{'+'.join(kinds)} at {name or '<root>'} wraps {inner_kind} at "
                                  f"{name + '.module' if name else 'module'}")
        if fsdp2_cls is not None and "DDP" in kinds and any(isinstance(s, fsdp2_cls) for s in m.modules()):
            double.append(f"DDP at {name or '<root>'} wraps a module sharded with fully_shard")
    dtensors, meshes = 0, set()
    for p in model.parameters():
        mesh = getattr(p, "device_mesh", None)
        if mesh is not None:
            dtensors += 1
            root = mesh._get_root_mesh()
            meshes.add((tuple(root.mesh.shape), tuple(root.mesh_dim_names or ())))
    return {"model": type(model).__name__, "ddp": ddp, "fsdp": fsdp1, "fully_shard": fsdp2, "comm_hooks": hooks,
            "dtensor_parameters": dtensors, "parameters": sum(1 for _ in model.parameters()),
            "parameter_meshes": [{"shape": list(s), "names": list(n)} for s, n in sorted(meshes)],
            "double_wrapped": sorted(set(double))}


def _reference_backend(probe: Probe) -> None:
    """In the reference run, ``backend="neuron"`` compiles a graph whose inputs are all on the CPU with Inductor
    for the CPU, so that the same script runs unchanged on both sides (on neuron, the backend's CPU autocopy
    would hand CPU code neuron outputs). Registered under the backend's name through Dynamo's public
    ``register_backend``, before the entry point is looked up, in the reference's processes only."""
    try:
        import torch._dynamo

        from torch_neuronx.compile.backend import neuron_backend

        def reference_backend(gm: Any, example_inputs: list[Any], **kwargs: Any) -> Any:
            if any(isinstance(x, torch.Tensor) and x.device.type == "neuron" for x in example_inputs):
                return neuron_backend(gm, example_inputs, **kwargs)
            from torch._inductor.compile_fx import compile_fx

            return compile_fx(gm, example_inputs, config_patches=kwargs.get("options") or None)

        torch._dynamo.register_backend(reference_backend, name="neuron")
    except Exception as e:  # the reference then runs the device's backend, as before; said in the events
        probe.emit("probe_error", where="reference_backend", message=f"{type(e).__name__}: {e}")



def _reference_default_mesh(probe: Probe) -> None:
    """In the reference run, FSDP2's default mesh (``fully_shard`` without ``mesh=``) is built on the CPU when the
    job's process group has no backend for the accelerator's device type (``gloo`` on the CPU side): on a host
    without Trainium ``torch._C._get_accelerator()`` is the CPU, but with the plugin loaded it is neuron, and the
    reference's parameters would move to neuron and fail in the first collective ("No backend type associated
    with device type neuron"). torch 2.13: torch/distributed/fsdp/_fully_shard/_fsdp_init.py, _init_default_mesh,
    looked up by name in _fully_shard.py. A group that has a neuron backend keeps PyTorch's own default."""
    try:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp._fully_shard import _fully_shard

        default_mesh = _fully_shard._init_default_mesh

        def reference_default_mesh(mesh_dim_names: tuple[str, ...] | None = None) -> Any:
            if not dist.is_initialized():
                dist.init_process_group()
            group = dist.distributed_c10d._get_default_group()
            try:
                group._get_backend(torch.device(torch._C._get_accelerator().type))
            except RuntimeError:  # no backend for that device type: a CPU group, a CPU mesh (as on a CPU host)
                return init_device_mesh("cpu", (group.size(),), mesh_dim_names=mesh_dim_names)
            return default_mesh(mesh_dim_names)

        _fully_shard._init_default_mesh = reference_default_mesh
    except Exception as e:  # FSDP2 missing or changed: the reference keeps PyTorch's default; said in the events
        probe.emit("probe_error", where="reference_default_mesh", message=f"{type(e).__name__}: {e}")


def _stacks_on_request(probe: Probe) -> None:
    """Write every thread's Python stack to <dir>/stacks.rank<R>.<pid>.txt when the checker sends
    results.STACK_SIGNAL (before it kills a hung job): the report then says which rank was stuck in its own code
    and which waited in a collective. faulthandler writes from the signal handler itself, so a rank blocked in
    C++ (a collective's wait) or in time.sleep answers too."""
    from torch_neuronx.tools.check.results import STACK_SIGNAL

    if STACK_SIGNAL is None:
        return
    try:
        import faulthandler

        path = os.path.join(probe._directory, f"stacks.rank{probe.rank}.{os.getpid()}.txt")
        probe._stacks_file = open(path, "w")  # noqa: SIM115  (kept open: the handler writes to its descriptor)
        faulthandler.register(STACK_SIGNAL, file=probe._stacks_file, all_threads=True, chain=False)
    except Exception as e:  # no stacks then; said in the events
        probe.emit("probe_error", where="stacks", message=f"{type(e).__name__}: {e}")


def install() -> Probe | None:
    """Start watching this process (called by ``import torch_neuronx`` when TORCH_NEURONX_CHECK_DIR is set)."""
    global _probe
    directory = env.get("TORCH_NEURONX_CHECK_DIR")
    if _probe is not None or not directory:
        return _probe
    if env.get("TORCH_NEURONX_CHECK_RANKS_ONLY") and "RANK" not in os.environ:
        return None  # torchrun's agent: it runs no step
    from torch_neuronx import patches

    probe = _probe = Probe(os.path.expanduser(directory))
    _stacks_on_request(probe)
    try:
        launched: float | None = float(env.get("TORCH_NEURONX_CHECK_LAUNCH_TIME"))
    except ValueError:  # unset or not a time: no startup figure
        launched = None
    probe.emit("start", pid=os.getpid(), world_size=probe.world_size, argv=sys.argv, launched=launched,
               local_rank=int(os.environ.get("LOCAL_RANK", "0") or 0))
    torch.nn.modules.module.register_module_forward_pre_hook(probe.forward_pre)
    torch.nn.modules.module.register_module_forward_hook(probe.forward_post, with_kwargs=True)
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(probe.before_optimizer_step)
    register_optimizer_step_post_hook(probe.on_optimizer_step)
    if torch.distributed.is_available():
        from torch_neuronx import distributed

        distributed._backend_listeners.append(probe._backends.append)
    patches.patch_for_check(probe.on_backward, probe.on_save, probe.on_mesh)
    from torch_neuronx.tools.check import rng

    rng.install(probe)
    if env.get("TORCH_NEURONX_CHECK_SIDE") == "reference":
        _reference_backend(probe)
        _reference_default_mesh(probe)
    try:  # compiled random ops call the eager ones, so that they draw as eager code does (aligned by rng.py)
        import torch._inductor.config as inductor_config

        inductor_config.fallback_random = True
    except Exception as e:
        probe.emit("probe_error", where="fallback_random", message=f"{type(e).__name__}: {e}")
    previous = sys.excepthook

    def excepthook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        probe.excepthook(kind, value, tb)
        previous(kind, value, tb)

    sys.excepthook = excepthook
    atexit.register(probe.finish)
    return probe
