"""Under the checker, random ops on neuron draw from the CPU's default generator, in program order, so that a job
with dropout (or any random op on the device) draws the same numbers as its CPU reference.

Why: the device has generators of its own (one per core, CUDA-style, device/random.py). In the neuron run a
job's CPU draws (data, initialisation on the CPU) come from the CPU generator and its device draws (dropout
masks) from the core's; in the CPU reference all of them come from the CPU generator, one stream. After the
first CPU draw the two runs' masks differ, and a correct job fails the loss comparison (28.354 vs 28.027 at
step 0, issue 21). The numbers of a neuron generator come from the same CPU engine, so merging the streams is
enough: each random op on neuron with no explicit generator runs on a CPU tensor of the same shape and
strides, drawing from ``torch.default_generator`` as the reference's op does, and the result is copied to the
device.

An explicit neuron ``generator=`` draws through a CPU generator seeded as it was (the reference passes its
own CPU generator, seeded alike), one per generator object, and its offset advances as the device's kernels
advance it; ops whose schema takes the generator by position (poisson, binomial, ...) are given it the same way.
What cannot follow the reference is counted per step as ``rng_unaligned`` and named in the evidence when losses
differ: a generator set to a saved state at an offset, DTensor's RNG tracker (it places each shard at its
own offset of the device stream). Random ops inside ``torch.compile``d graphs reach these kernels too: the
probe sets Inductor's ``fallback_random`` in both runs, so compiled graphs call the eager ops. Only processes
the checker launched are changed; the kernels are registered at
``PrivateUse1`` for the samplers every random op ends in (``randn`` is ``normal_``, dropout is
``bernoulli_``), and for those that sample without one: ``normal`` with tensor means or deviations, the
factories ``randperm`` and ``normal(mean, std, size)``, whose device comes as ``device=``, and the out=
overloads of these that have kernels of their own (``normal(..., out=t)``, ``randperm(n, out=t)``,
``bernoulli(p, out=t)``, ``multinomial(..., out=t)``).
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

_library: torch.library.Library | None = None
_unaligned: dict[str, int] = {}
_lock = threading.Lock()

# in-place samplers: (overload, whether its first argument is the tensor drawn into)
INPLACE = ("bernoulli_.float", "bernoulli_.Tensor", "uniform_", "normal_", "random_", "random_.from",
           "random_.to", "exponential_", "geometric_", "log_normal_", "cauchy_")
FUNCTIONAL = ("bernoulli", "bernoulli.p", "multinomial", "normal.Tensor_Tensor", "normal.Tensor_float",
              "normal.float_Tensor",
              # samplers without an in-place form (torch.poisson, torch.binomial, torch.distributions' Gamma, Beta,
              # Dirichlet): their out= overloads are composite, they end here
              "poisson", "binomial", "_standard_gamma", "_sample_dirichlet")
# factories: no tensor argument, the device comes as `device=` (rv29c defect 7: randperm, normal(mean, std, size))
FACTORY = ("randperm", "randperm.generator", "normal.float_float")
# out= overloads with a kernel of their own (rv29d: `torch.normal(m, s, out=t)`, `torch.randperm(n, out=t)` on
# neuron): the device is the out tensor's. The other out= overloads of these ops and of the in-place samplers
# (bernoulli.float_out, normal.float_float_out, randperm.out, rand.out, randn.out, randint.out, uniform.out, ...)
# are composite in PyTorch: they end in one of the kernels registered here (tests/tools/test_check.py).
OUT = ("bernoulli.out", "multinomial.out", "normal.Tensor_Tensor_out", "normal.Tensor_float_out",
       "normal.float_Tensor_out", "randperm.generator_out")


def take_unaligned() -> dict[str, int]:
    """The random ops since the last call that drew from a device generator (op -> calls), and reset."""
    global _unaligned
    if not _unaligned:
        return {}
    with _lock:
        out, _unaligned = _unaligned, {}
    return out


def _note(op: str, why: str) -> None:
    with _lock:
        key = f"{op} ({why})"
        _unaligned[key] = _unaligned.get(key, 0) + 1


def _dtensor_tracker() -> bool:
    random = sys.modules.get("torch.distributed.tensor._random")
    return random is not None and getattr(random, "_rng_tracker", None) is not None


def _cpu(value: Any) -> Any:
    return value.to("cpu") if isinstance(value, torch.Tensor) and value.device.type == "neuron" else value


# a neuron generator -> its CPU generator and the (seed, offset) the neuron one stood at after their last draw: a
# neuron generator's numbers are those of the CPU engine seeded alike. Keyed by the generator object (rv29e defect 2:
# keyed by (seed, offset), two generators seeded alike shared one CPU copy, and the second drew the first's next
# numbers). The object a kernel receives is the Python wrapper PyTorch makes for the C++ generator
# (torch/csrc/Generator.cpp, THPGenerator_Wrap), a new one unless one is alive: kept here, it is the one every later
# call receives, so it identifies the generator. At most SHADOWS_KEPT are kept (the oldest dropped: its next draw is
# then counted as not aligned, never silently wrong).
SHADOWS_KEPT = 1024
_shadows: dict[int, tuple[torch.Generator, torch.Generator, tuple[int, int]]] = {}


def _shadow(gen: torch.Generator) -> tuple[torch.Generator, bool]:
    """The CPU generator for a neuron generator's next draws, and whether its numbers are exactly the device's
    (a state restored at an offset is reached on the device by a walk this cannot repeat)."""
    point = (gen.initial_seed(), gen.get_offset())
    with _lock:
        kept = _shadows.get(id(gen))
    if kept is not None and kept[0] is gen and kept[2] == point:  # where this generator's last draw left it
        return kept[1], True
    cpu = torch.Generator()
    cpu.manual_seed(point[0])  # seeded again (manual_seed) or set to another state since: start over
    return cpu, point[1] == 0


def _advance(gen: torch.Generator, cpu: torch.Generator, drawn: int) -> None:
    """Move the neuron generator on as its own kernels would, and remember where its shadow stands."""
    offset = gen.get_offset() + (drawn + 3) // 4 * 4
    gen.set_offset(offset)
    with _lock:
        _shadows.pop(id(gen), None)
        while len(_shadows) >= SHADOWS_KEPT:
            _shadows.pop(next(iter(_shadows)))
        _shadows[id(gen)] = (gen, cpu, (gen.initial_seed(), offset))


Pair = tuple[torch.Generator, torch.Generator]  # a neuron generator and the CPU generator it draws through


def _positional_generator(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...],
                                                                                            dict[str, Any]]:
    """`args` and `kwargs` with a generator passed by position moved to ``generator=``: in the schemas of poisson,
    binomial, _standard_gamma and _sample_dirichlet it is positional (``poisson(Tensor self, Generator?
    generator=None)``, aten/src/ATen/native/native_functions.yaml), so the dispatcher passes it in `args`
    (rv29e defect 1: it reached the CPU op unchanged, "Expected a 'cpu' device type for generator")."""
    names = [a.name for a in op._schema.arguments if not a.kwarg_only]
    if "generator" not in names or len(args) <= names.index("generator"):
        return args, kwargs
    i = names.index("generator")
    return args[:i] + args[i + 1:], {**kwargs, "generator": args[i]}


def _generator(name: str, kwargs: dict[str, Any]) -> tuple[dict[str, Any], Pair | None]:
    """The keyword arguments for the CPU op: the CPU default generator, or an explicit one's shadow."""
    gen = kwargs.get("generator")
    if gen is None and not _dtensor_tracker():
        return kwargs, None
    if gen is None:  # DTensor's tracker placed the default generator at a shard's offset: not reproducible here
        from torch_neuronx.device import random

        gen = random.default_generators[torch.neuron.current_device()]
        _note(name, "DTensor RNG tracker")
    cpu, exact = _shadow(gen)
    if not exact:
        _note(name, "generator state restored to an offset")
    return {**kwargs, "generator": cpu}, (gen, cpu)


def _inplace(name: str, op: Any) -> Callable[..., Any]:
    def kernel(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        kwargs, gen = _generator(name, kwargs)
        cpu = torch.empty_strided(self.size(), self.stride(), dtype=self.dtype)
        op(cpu, *(_cpu(a) for a in args), **kwargs)  # draws from the CPU's generator, as the reference does
        self.copy_(cpu)
        if gen is not None:
            _advance(*gen, self.numel())
        return self

    return kernel


def _functional(name: str, op: Any) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> torch.Tensor:
        args, kwargs = _positional_generator(op, args, kwargs)
        kwargs, gen = _generator(name, kwargs)
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        out = op(*(_cpu(a) for a in args), **kwargs)
        if gen is not None:
            _advance(*gen, out.numel())
        return out.to(device)

    return kernel


def _factory(name: str, op: Any) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> torch.Tensor:
        device = kwargs.get("device")
        kwargs, gen = _generator(name, {**kwargs, "device": torch.device("cpu"), "pin_memory": False})
        out = op(*args, **kwargs)
        if gen is not None:
            _advance(*gen, out.numel())
        return out.to(device)

    return kernel


def _out(name: str, op: Any) -> Callable[..., Any]:
    def kernel(*args: Any, out: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        kwargs, gen = _generator(name, kwargs)
        cpu = torch.empty_strided(out.size(), out.stride(), dtype=out.dtype)  # as the reference's out tensor
        op(*(_cpu(a) for a in args), **kwargs, out=cpu)  # resized there as the reference's is
        if cpu.size() != out.size() or cpu.stride() != out.stride():
            out.resize_(cpu.size())
        out.copy_(cpu)
        if gen is not None:
            _advance(*gen, cpu.numel())
        return out

    return kernel


def install(probe: Any = None) -> bool:
    """Register the kernels (once per process); False when this torch refuses them (the job runs unchanged)."""
    global _library
    if _library is not None:
        return True
    try:
        lib = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
            for name in INPLACE:
                packet, _, overload = name.partition(".")
                op = getattr(getattr(torch.ops.aten, packet), overload or "default")
                lib.impl(name, _inplace(name, op), "PrivateUse1")
            for names, wrap in ((FUNCTIONAL, _functional), (FACTORY, _factory), (OUT, _out)):
                for name in names:
                    packet, _, overload = name.partition(".")
                    op = getattr(getattr(torch.ops.aten, packet), overload or "default")
                    lib.impl(name, wrap(name, op), "PrivateUse1")
    except Exception as e:  # never stop the job: its random ops keep the device's stream, and the report says so
        if probe is not None:
            probe.emit("probe_error", where="rng", message=f"{type(e).__name__}: {e}")
        return False
    _library = lib
    return True
