"""Preserved compilation artifacts: what each compiled graph became, kept for inspection.

With ``TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS=1`` every graph the
``neuron`` backend compiles leaves, under ``TORCH_NEURONX_DEBUG_DIR``
(TorchNeuron's layout: one folder per kind, ``proc_{rank}`` per process,
``{model}_{timestamp}`` per graph)::

    fx_graphs/proc_0/model_default_20261203_101500_123456.fx.txt            the graph Dynamo captured
    fx_graphs/proc_0/model_default_20261203_101500_123456.forward.fx.txt    AOTAutograd's forward
    fx_graphs/proc_0/model_default_20261203_101500_123456.backward.fx.txt   ... and backward
    stablehlo/proc_0/model_default_20261203_101500_123456.forward.post_grad.txt   Inductor's IR graph
    neff/proc_0/model_default_20261203_101500_123456.forward.py             the generated code (with its C++ kernels)
    proc_0/index.json                                                       which graph is which

On Trainium ``stablehlo/`` holds the StableHLO module and ``neff/`` the
compiled NEFF; here the post-grad graph Inductor lowers and the code it
generates stand in for them. ``proc_{rank}/index.json`` lists each graph:
its name (as ``get_dynamo_metrics()`` gives it), timestamp and files. Preserving
compiles every graph afresh (no cache), so that every graph has its files.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any

from torch_neuronx.runtime import env

KINDS = ("fx_graphs", "stablehlo", "neff")
_lock = threading.Lock()


class ArtifactsDirectoryError(OSError):
    """TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS is on, but TORCH_NEURONX_DEBUG_DIR cannot be written."""


_directory_error: ArtifactsDirectoryError | None = None
_directory_checked: str | None = None


def enabled() -> bool:
    """Whether compiled graphs keep their artifacts; when they do, the debug directory must be writable: checked
    once per directory, and an unwritable one raises (the same error at every compile) naming both variables."""
    global _directory_error, _directory_checked
    if not env.get("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS"):
        return False
    directory = os.path.abspath(env.get("TORCH_NEURONX_DEBUG_DIR"))
    if _directory_checked != directory:
        _directory_checked, _directory_error = directory, None
        try:
            os.makedirs(directory, exist_ok=True)
            with tempfile.TemporaryFile(dir=directory):
                pass
        except OSError as exc:
            _directory_error = ArtifactsDirectoryError(
                f"TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS=1 keeps compilation artifacts under "
                f"TORCH_NEURONX_DEBUG_DIR={directory!r}, which cannot be written ({exc.strerror or exc}). Set "
                "TORCH_NEURONX_DEBUG_DIR to a writable directory, or unset "
                "TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS.")
    if _directory_error is not None:
        raise _directory_error
    return True


def rank() -> int:
    """torch.distributed's rank when initialised, else the current neuron device (TorchNeuron's rule)."""
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return torch.neuron.current_device()  # type: ignore[attr-defined]


def proc_dir(kind: str) -> str:
    return os.path.join(os.path.abspath(env.get("TORCH_NEURONX_DEBUG_DIR")), kind, f"proc_{rank()}")


@dataclass
class GraphArtifacts:
    """The files of one compiled graph; written as they are produced, indexed once named."""

    stem: str  # "{model}_{timestamp}"
    timestamp: str
    files: dict[str, str] = field(default_factory=dict)  # what -> path
    name: str = ""

    def write(self, kind: str, what: str, suffix: str, text: str) -> None:
        directory = proc_dir(kind)
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"{self.stem}{suffix}")
        with open(path, "w") as f:
            f.write(text)
        self.files[what] = path
        self.write_index()

    def write_index(self) -> None:
        """Rewrite this process's index.json with this graph's current entry (atomic replace)."""
        directory = os.path.join(os.path.abspath(env.get("TORCH_NEURONX_DEBUG_DIR")), f"proc_{rank()}")
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, "index.json")
        with _lock:
            try:
                with open(path) as f:
                    entries: list[dict[str, Any]] = json.load(f)
            except (OSError, ValueError):
                entries = []
            entries = [e for e in entries if e.get("timestamp") != self.timestamp]
            entries.append({"graph_name": self.name, "timestamp": self.timestamp, "files": dict(self.files)})
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(entries, f, indent=1)
            os.replace(tmp, path)


def start(model_name: str, timestamp: str) -> GraphArtifacts:
    return GraphArtifacts(f"{model_name.lower()}_{timestamp}", timestamp)


def graph_text(gm: Any) -> str:
    """A graph's readable code (with shapes where the nodes carry them)."""
    try:
        return gm.print_readable(print_output=False, include_stride=True, include_device=True)
    except Exception:  # a graph print_readable cannot render: the plain graph still says what it is
        return str(gm.graph)


def inductor_hooks(artifacts: GraphArtifacts) -> tuple[Any, dict[str, Any]]:
    """An ``inner_compile`` for ``compile_fx`` and config patches that write each AOT graph, its post-grad
    graph and its generated code into `artifacts`."""
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.custom_graph_pass import CustomGraphPass

    current = {"part": "forward"}

    class _KeepPostGrad(CustomGraphPass):
        def __call__(self, graph: Any) -> None:
            artifacts.write("stablehlo", f"{current['part']}.post_grad", f".{current['part']}.post_grad.txt",
                            str(graph))

        def uuid(self) -> Any:
            return None  # never cached: preserving compiles afresh

    def inner_compile(gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
        part = "backward" if kwargs.get("is_backward") else ("inference" if kwargs.get("is_inference")
                                                              else "forward")
        current["part"] = part
        artifacts.write("fx_graphs", part, f".{part}.fx.txt", graph_text(gm))
        compiled = compile_fx_inner(gm, example_inputs, **kwargs)
        source = getattr(compiled, "source_code", None)
        if source:
            artifacts.write("neff", f"{part}.code", f".{part}.py", source)
        return compiled

    return inner_compile, {"post_grad_custom_post_pass": _KeepPostGrad(), "fx_graph_cache": False}
