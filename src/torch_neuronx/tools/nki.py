"""TorchNeuron's NKI entry points, ``torch_neuronx.nki_op`` and ``torch_neuronx.wrap_nki``, launching for real.

NKI kernels run on the host interpreter (:mod:`torch_neuronx.nki`), on the
``neuron`` tensors' own memory, with Trainium's rules checked per instruction.

* :func:`nki_op` registers a function as a PyTorch custom op
  (``torch.library.custom_op``): it shows in ``torch.ops``, takes
  ``register_autograd``, and traces under ``torch.compile`` as one opaque op
  with no graph break — its fake implementation is the function itself, whose
  kernel launches then run in shapes-only mode on fake tensors (the rules are
  checked at trace time, as the Neuron compiler would).
* :func:`wrap_nki` returns a caller that takes a launch grid
  (``wrap_nki(kernel)[grid](*args)``). Eagerly it launches the kernel; inside
  a compiled region it calls the generic custom op
  ``torch.ops.torch_neuronx_nki.launch``, which declares every tensor argument
  as mutated (so outputs written into arguments survive functionalization);
  there the kernel writes its outputs into tensors passed as arguments
  (TorchNeuron's operand/output aliasing), and a kernel that allocates its
  outputs is called from an :func:`nki_op` function instead.

Launches on ``neuron`` tensors show in ``torch.profiler`` (``nki::<kernel>``)
and in ``torch_neuronx.get_executed_ops()`` as ``nki::<kernel>``. Importing
this module does not import the interpreter.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

_launches: Counter[str] = Counter()
_lock = threading.Lock()


class NKIUnavailableError(NotImplementedError):
    """Kept for scripts that caught it: no launch raises it any more (kernels run on the host interpreter)."""


def _record_launch(report: Any) -> None:
    """Called by the interpreter after each launch on neuron tensors."""
    with _lock:
        _launches[f"nki::{report.kernel}"] += 1


def launch_counts() -> dict[str, int]:
    """``nki::<kernel>`` -> launches on neuron tensors since the last op-tracking reset."""
    with _lock:
        return dict(_launches)


def reset_launch_counts() -> None:
    with _lock:
        _launches.clear()


# --------------------------------------------------------------------------------------------- wrap_nki

_kernels: dict[str, Any] = {}


def _kernel_key(kernel: Any) -> str:
    key = f"{getattr(kernel, '__module__', '?')}.{getattr(kernel, '__qualname__', repr(kernel))}@{id(kernel):x}"
    _kernels[key] = kernel
    return key


def _as_kernel(kernel: Any) -> Any:
    from torch_neuronx.nki import Kernel, jit

    return kernel if isinstance(kernel, Kernel) else jit(kernel)


class NKICaller:
    """What :func:`wrap_nki` returns: ``caller[grid](*args)`` (or ``caller(*args)``) launches the kernel."""

    def __init__(self, kernel: Callable[..., Any], grid: tuple[int, ...] = (), key: str | None = None,
                 **options: Any) -> None:
        self.kernel = kernel
        self.grid = grid
        self.options = options
        if key is None:  # made outside compiled code (wrap_nki): register the kernel and the launch op now
            key = _kernel_key(kernel)
            _launch_op()
        self.key = key

    def __getitem__(self, grid: int | tuple[int, ...]) -> NKICaller:
        grid = (grid,) if isinstance(grid, int) else tuple(grid)
        if not grid or not all(isinstance(g, int) and not isinstance(g, bool) and g > 0 for g in grid):
            raise ValueError(f"an NKI launch grid is a tuple of positive ints, got {grid!r}")
        return NKICaller(self.kernel, grid, self.key, **self.options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        if torch.compiler.is_compiling():
            tensors: list[Any] = []
            spec = "(" + _encode(list(args), tensors) + ", " + _encode(kwargs, tensors) + ")"
            _launch_op()(self.key, list(self.grid), spec, tensors)
            return None
        return self.launch(*args, **kwargs)

    def launch(self, *args: Any, **kwargs: Any) -> Any:
        """Run the kernel now on the host interpreter (fake tensors: shapes and rules only)."""
        kernel = _as_kernel(self.kernel)
        if self.options:
            from torch_neuronx.nki import jit

            kernel = jit(kernel, **self.options)
        if self.grid:
            kernel = kernel[self.grid]
        return kernel(*args, **kwargs)


def _encode(value: Any, tensors: list[Any]) -> str:
    """A Python literal for a kernel's arguments under torch.compile: tensors by position, constants as themselves.

    Built by string concatenation (which Dynamo folds at trace time) and read back with ``ast.literal_eval``.
    """
    import torch

    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return "('__tensor__', " + str(len(tensors) - 1) + ")"
    if isinstance(value, torch.dtype):
        return "('__dtype__', '" + str(value).removeprefix("torch.") + "')"
    if isinstance(value, tuple):
        return "('__tuple__', [" + ", ".join(_encode(v, tensors) for v in value) + "])"
    if isinstance(value, list):
        return "[" + ", ".join(_encode(v, tensors) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(repr(str(k)) + ": " + _encode(v, tensors) for k, v in value.items()) + "}"
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, float):
        finite = value == value and value not in (float("inf"), float("-inf"))
        return repr(value) if finite else "('__float__', '" + repr(value) + "')"
    raise TypeError(f"wrap_nki under torch.compile passes tensors and Python constants to a kernel, not "
                    f"{type(value).__name__}: wrap the launch in a torch_neuronx.nki_op function instead")


def _decode(value: Any, tensors: list[Any]) -> Any:
    import torch

    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    if isinstance(value, dict):
        return {k: _decode(v, tensors) for k, v in value.items()}
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "__tensor__":
        return tensors[value[1]]
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "__dtype__":
        return getattr(torch, value[1])
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "__float__":
        return float(value[1])
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "__tuple__":
        return tuple(_decode(v, tensors) for v in value[1])
    return value


def _flatten(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _flatten(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _flatten(v)]
    return []


def _run(key: str, grid: list[int], spec: str, tensors: list[Any]) -> None:
    kernel = _kernels.get(key)
    if kernel is None:
        raise RuntimeError(f"NKI kernel {key} is not registered in this process: create its wrap_nki caller "
                           "before compiling")
    import ast

    encoded_args, encoded_kwargs = ast.literal_eval(spec)
    args, kwargs = _decode(encoded_args, tensors), _decode(encoded_kwargs, tensors)
    caller = NKICaller(kernel, tuple(grid), key)
    ids = {id(t) for t in tensors}
    fresh = [t for t in _flatten(caller.launch(*args, **kwargs)) if id(t) not in ids]
    if fresh:
        raise RuntimeError(
            f"NKI kernel {getattr(kernel, '__name__', key)} allocates its outputs; under torch.compile a "
            "wrap_nki launch writes into output tensors passed as arguments (wrap_nki(kernel)[grid](x, out)). "
            "Call a kernel that returns new tensors inside a torch_neuronx.nki_op function instead.")


_op: list[Any] = []


def _launch_op() -> Any:
    """``torch.ops.torch_neuronx_nki.launch``, registered on first use."""
    if _op:
        return _op[0]
    import torch

    schema = "(str key, int[] grid, str spec, Tensor(a!)[] tensors) -> ()"

    @torch.library.custom_op("torch_neuronx_nki::launch", mutates_args=("tensors",), schema=schema)
    def launch(key, grid, spec, tensors):  # type: ignore[no-untyped-def]
        return _run(key, grid, spec, tensors)

    @launch.register_fake
    def _(key, grid, spec, tensors):  # type: ignore[no-untyped-def]
        return _run(key, grid, spec, tensors)  # fake tensors: the interpreter traces shapes and checks rules

    _op.append(launch)
    return launch


def wrap_nki(kernel: Callable[..., Any], **options: Any) -> NKICaller:
    """Wrap an NKI kernel for calls from PyTorch code (TorchNeuron's API): ``wrap_nki(kernel)[grid](*tensors)``."""
    if not callable(kernel):
        raise TypeError(f"wrap_nki takes an NKI kernel (a function or an @nki.jit kernel), got {kernel!r}")
    return NKICaller(kernel, **options)


def nki_op(name: str, fn: Callable[..., Any] | None = None,
           mutates_args: str | Iterable[str] = ()) -> Any:
    """Register `fn` as the custom op `name` ("namespace::op"), as TorchNeuron's decorator does.

    Usable as ``@nki_op("mylib::add", mutates_args={})`` or ``nki_op("mylib::add", fn)``. `fn` launches NKI
    kernels (directly or through :func:`wrap_nki`); it is also the op's fake implementation, where the launches
    run on fake tensors and only compute shapes. Add a backward with ``op.register_autograd(backward,
    setup_context=...)``.
    """
    import torch

    if not isinstance(name, str) or "::" not in name:
        raise ValueError(f'nki_op takes a qualified op name like "mylib::add", got {name!r}')

    def register(function: Callable[..., Any]) -> Any:
        op = torch.library.custom_op(name, function, mutates_args=mutates_args)
        op.register_fake(function)
        return op

    return register(fn) if fn is not None else register


def provider() -> dict[str, str]:
    """Which ``nki`` a plain ``import nki`` gives here, found without importing it: {"provider", "location"}.

    "aws" when AWS's package is on the path (it always wins), "torch_neuronx" when only this project's router
    (``src/nki.py``) is, "none" when neither is.
    """
    import importlib.machinery
    import os
    import sys

    router = None
    for entry in sys.path:
        try:
            spec = importlib.machinery.PathFinder.find_spec("nki", [entry or os.getcwd()])
        except (ImportError, OSError, ValueError):
            continue
        if spec is None or spec.origin is None:
            continue
        is_router = os.path.basename(spec.origin) == "nki.py" and "torch_neuronx.nki._importer" in _read(spec.origin)
        if not is_router:
            return {"provider": "aws", "location": os.path.dirname(spec.origin)}
        router = router or spec.origin
    if router is not None:
        return {"provider": "torch_neuronx", "location": router}
    return {"provider": "none", "location": ""}


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(4096)
    except OSError:
        return ""
