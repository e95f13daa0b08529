"""A differential fuzzer: random programs of PyTorch ops, run on neuron and on CPU, must agree.

Each program starts from a few random tensors (random shapes, zero sizes
included, every dtype the device takes) and applies random steps to a pool
of tensors: views (slices, transposes, expands, ``as_strided``, ``unfold``,
diagonals, ``view_as_real``/``view_as_complex``), in-place and ``out=`` ops
whose arguments may alias or overlap, dtype promotion, reductions, and random
numbers with state saved and restored (as checkpointing does). CPU and
neuron run the same program step by step; after every step both must have
raised the same error or produced the same tensor (dtype, shape, strides,
bits), and at the end every tensor of both pools must still be equal, which
catches writes that went through the wrong alias.

Driven by hypothesis, so a failure shrinks to a short program:

    python -m torch_neuronx.testing.fuzz --examples 20000 --seed 7

The test suite runs a fixed-seed slice (tests/testing/test_fuzz.py).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.uint8, torch.bool,
          torch.complex64)
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
MAX_POOL = 8

# Where the device knowingly differs from the CPU: a reduced-precision op the
# host lacks runs widened on neuron (CPU raises). Both sides then drop it.
_WIDENED = re.compile(r"not implemented for '(Half|BFloat16|ComplexHalf)'")


@dataclass
class Outcome:
    """What one step did on one device: a result (tensors, or None) or an error."""

    tensors: list[torch.Tensor] | None = None
    error: str | None = None


@dataclass
class Machine:
    """One device's side of a program: its pool of tensors and its saved RNG states."""

    device: str
    pool: list[torch.Tensor | None] = field(default_factory=list)
    states: list[torch.Tensor] = field(default_factory=list)

    def seed(self, s: int) -> None:
        if self.device == "cpu":
            torch.manual_seed(s)
        else:
            torch.neuron.manual_seed_all(s)  # type: ignore[attr-defined]

    def get_state(self) -> torch.Tensor:
        return torch.get_rng_state() if self.device == "cpu" else torch.neuron.get_rng_state()  # type: ignore[attr-defined]

    def set_state(self, state: torch.Tensor) -> None:
        if self.device == "cpu":
            torch.set_rng_state(state)
        else:
            torch.neuron.set_rng_state(state)  # type: ignore[attr-defined]


Step = Callable[[Machine], Any]


class Mismatch(AssertionError):
    """CPU and neuron disagreed; the message holds the program so far."""


def _normalise(message: str) -> str:
    first = message.strip().split("\n")[0]
    return re.sub(r"neuron(:\d+)?|cpu|CPU|PrivateUse1|privateuseone", "<dev>", first)


def _run(step: Step, machine: Machine) -> Outcome:
    try:
        result = step(machine)
    except (RuntimeError, ValueError, TypeError, IndexError, NotImplementedError) as exc:
        return Outcome(error=f"{type(exc).__name__}: {_normalise(str(exc))}")
    if result is None:
        return Outcome(tensors=[])
    if isinstance(result, torch.Tensor):
        return Outcome(tensors=[result])
    return Outcome(tensors=[t for t in result if isinstance(t, torch.Tensor)])


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> str | None:
    """Why CPU tensor `a` and neuron tensor `b` differ, or None."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"{a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
    if a.numel() > 1 and a.stride() != b.stride():
        return f"strides {a.stride()} vs {b.stride()}"
    if b.device.type != "neuron":
        return f"result on {b.device}, not on neuron"
    b = b.cpu()
    if a.is_complex():
        a, b = torch.view_as_real(a.resolve_conj().resolve_neg()), torch.view_as_real(b.resolve_conj().resolve_neg())
    if a.dtype == torch.bool:
        return None if torch.equal(a, b) else f"values differ: {a} vs {b}"
    a, b = a.resolve_neg(), b.resolve_neg()
    equal = (a == b) | (a.isnan() & b.isnan()) if a.is_floating_point() else a == b
    return None if bool(equal.all()) else f"values differ: {a} vs {b}"


class Program:
    """CPU and neuron side by side; :meth:`step` runs one step on both and compares."""

    def __init__(self) -> None:
        self.cpu = Machine("cpu")
        self.dev = Machine("neuron")
        self.log: list[str] = []

    def add_input(self, t: torch.Tensor, description: str) -> None:
        self.cpu.pool.append(t)
        self.dev.pool.append(t.to("neuron"))
        self.log.append(f"t{len(self.cpu.pool) - 1} = {description}")

    def step(self, description: str, step: Step) -> None:
        self.log.append(description)
        shapes = [None if t is None else t.shape for t in self.cpu.pool]
        a, b = _run(step, self.cpu), _run(step, self.dev)
        if a.error is not None and b.error is None and _WIDENED.search(a.error):
            a, b = Outcome(tensors=[None] * len(b.tensors or [])), Outcome(tensors=[None] * len(b.tensors or []))
        if (a.error is None) != (b.error is None):
            self.fail(f"cpu: {a.error or 'ok'}; neuron: {b.error or 'ok'}")
        if a.error is not None:
            if a.error != b.error:
                self.fail(f"different errors: cpu {a.error!r}; neuron {b.error!r}")
            self._clear_resized(shapes)
            return
        assert a.tensors is not None and b.tensors is not None
        if len(a.tensors) != len(b.tensors):
            self.fail(f"{len(a.tensors)} results on cpu, {len(b.tensors)} on neuron")
        for x, y in zip(a.tensors, b.tensors, strict=True):
            if x is not None and (why := same_tensor(x, y)) is not None:
                self.fail(why)
            self.cpu.pool.append(x)
            self.dev.pool.append(y)
        for m in (self.cpu, self.dev):
            del m.pool[:-MAX_POOL]
        self.check_pools()

    def _clear_resized(self, shapes: list[torch.Size | None]) -> None:
        # A kernel may resize its out= tensor and then raise: the grown part
        # holds whatever the allocator gave, on either device. Same shapes
        # are required; the contents are zeroed on both sides.
        for i, (x, y, before) in enumerate(zip(self.cpu.pool, self.dev.pool, shapes, strict=True)):
            if x is None or y is None or x.shape == before:
                continue
            if x.shape != y.shape or x.stride() != y.stride():
                self.fail(f"pool tensor {i} resized differently by a failing op: {x.shape} vs {y.shape}")
            x.zero_()
            y.zero_()

    def check_pools(self) -> None:
        for i, (x, y) in enumerate(zip(self.cpu.pool, self.dev.pool, strict=True)):
            if x is not None and (why := same_tensor(x, y)) is not None:
                self.fail(f"pool tensor {i} changed differently: {why}")

    def fail(self, why: str) -> None:
        raise Mismatch(why + "\nprogram:\n  " + "\n  ".join(self.log))


# ---------------------------------------------------------------- the programs


def _draw_tensor(data: Any, st: Any) -> tuple[torch.Tensor, str]:
    dtype = data.draw(st.sampled_from(DTYPES))
    shape = tuple(data.draw(st.lists(st.integers(0, 4), min_size=0, max_size=3)))
    seed = data.draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        t = torch.rand(shape, generator=g) > 0.5
    elif dtype.is_floating_point:
        t = (torch.randn(shape, generator=g) * 3).to(dtype)
    elif dtype.is_complex:
        t = torch.randn(shape, generator=g, dtype=dtype)
    else:
        low = 0 if dtype == torch.uint8 else -8
        t = torch.randint(low, 9, shape, generator=g, dtype=dtype)
    return t, f"random {dtype} {list(shape)} (seed {seed})"


def _pick(data: Any, st: Any, machine_pool: list[torch.Tensor | None]) -> int:
    live = [i for i, t in enumerate(machine_pool) if t is not None]
    return data.draw(st.sampled_from(live))


def _dim(data: Any, st: Any, t: torch.Tensor) -> int:
    return data.draw(st.integers(-t.dim(), t.dim() - 1)) if t.dim() else 0


def _view_step(data: Any, st: Any, t: torch.Tensor, i: int) -> tuple[str, Step] | None:
    kind = data.draw(st.sampled_from(["slice", "transpose", "expand", "as_strided", "unfold", "diagonal", "select",
                                      "view", "real", "complex", "t", "unsqueeze", "flip_stride"]))
    if t.dim() == 0 and kind not in ("unsqueeze", "view", "expand", "as_strided"):
        kind = "unsqueeze"
    if kind == "slice":
        d = _dim(data, st, t)
        start, stop = data.draw(st.integers(-5, 5)), data.draw(st.integers(-5, 5))
        step = data.draw(st.integers(1, 3))
        index = (slice(None),) * (d % t.dim()) + (slice(start, stop, step),)
        return f"t{i}[{index}]", lambda m: m.pool[i][index]
    if kind == "transpose":
        a, b = _dim(data, st, t), _dim(data, st, t)
        return f"t{i}.transpose({a}, {b})", lambda m: m.pool[i].transpose(a, b)
    if kind == "expand":
        sizes = [data.draw(st.integers(0, 3)) if s == 1 else s for s in t.shape]
        lead = data.draw(st.lists(st.integers(0, 3), max_size=1))
        shape = lead + sizes
        return f"t{i}.expand({shape})", lambda m: m.pool[i].expand(shape)
    if kind == "as_strided":
        n = t.untyped_storage().nbytes() // t.element_size()
        size = data.draw(st.lists(st.integers(0, 3), max_size=2))
        stride = data.draw(st.lists(st.integers(0, 3), min_size=len(size), max_size=len(size)))
        offset = data.draw(st.integers(0, max(n - 1, 0)))
        return f"t{i}.as_strided({size}, {stride}, {offset})", lambda m: m.pool[i].as_strided(size, stride, offset)
    if kind == "unfold":
        d = _dim(data, st, t)
        size, step = data.draw(st.integers(0, 3)), data.draw(st.integers(1, 2))
        return f"t{i}.unfold({d}, {size}, {step})", lambda m: m.pool[i].unfold(d, size, step)
    if kind == "diagonal":
        off = data.draw(st.integers(-2, 2))
        return f"t{i}.diagonal({off})", lambda m: m.pool[i].diagonal(off)
    if kind == "select":
        d = _dim(data, st, t)
        k = data.draw(st.integers(-3, 3))
        return f"t{i}.select({d}, {k})", lambda m: m.pool[i].select(d, k)
    if kind == "view":
        return f"t{i}.view(-1)", lambda m: m.pool[i].view(-1)
    if kind == "real":
        return f"torch.view_as_real(t{i})", lambda m: torch.view_as_real(m.pool[i])
    if kind == "complex":
        return f"torch.view_as_complex(t{i})", lambda m: torch.view_as_complex(m.pool[i])
    if kind == "t":
        return f"t{i}.t()", lambda m: m.pool[i].t()
    if kind == "flip_stride":
        return f"t{i}[..., ::-1] via flip", lambda m: m.pool[i].flip(-1)
    d = data.draw(st.integers(-t.dim() - 1, t.dim()))
    return f"t{i}.unsqueeze({d})", lambda m: m.pool[i].unsqueeze(d)


_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "maximum": torch.maximum,
    "pow": torch.pow, "remainder": torch.remainder, "floor_divide": torch.floor_divide, "eq": torch.eq,
    "lt": torch.lt, "bitwise_and": torch.bitwise_and, "logical_or": torch.logical_or, "atan2": torch.atan2,
}
_UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "sqrt": torch.sqrt, "sin": torch.sin,
    "sigmoid": torch.sigmoid, "sign": torch.sign, "clone": torch.clone, "contiguous": lambda t: t.contiguous(),
    "cumsum": lambda t: torch.cumsum(t, -1), "sum": torch.sum, "amax": lambda t: torch.amax(t, -1),
    "argmax": torch.argmax, "sort": lambda t: torch.sort(t, -1), "flip": lambda t: t.flip(0),
    "nonzero": torch.nonzero, "tril": torch.tril, "softmax": lambda t: torch.softmax(t, -1),
    "mean": torch.mean, "isnan": torch.isnan, "to_float": lambda t: t.float(), "to_int": lambda t: t.int(),
    "to_half": lambda t: t.half(), "to_bool": lambda t: t.bool(), "to_complex": lambda t: t.to(torch.complex64),
}
_IN_PLACE = ["add_", "sub_", "mul_", "div_", "copy_", "clamp_", "fill_", "zero_", "neg_", "abs_", "addcmul_",
             "lerp_", "masked_fill_", "index_put_", "exp_", "floor_divide_", "bitwise_or_"]
_OUT = {"add": torch.add, "mul": torch.mul, "sub": torch.sub, "maximum": torch.maximum, "exp": torch.exp,
        "neg": torch.neg, "cumsum": lambda a, out: torch.cumsum(a, -1, out=out), "where": None,
        "sum": lambda a, out: torch.sum(a, -1, out=out), "cat": None, "mm": torch.mm}


def _in_place_step(data: Any, st: Any, i: int, j: int, k: int) -> tuple[str, Step]:
    op = data.draw(st.sampled_from(_IN_PLACE))
    scalar = data.draw(st.sampled_from([2, -1, 0.5, True]))
    if op in ("add_", "sub_", "mul_", "div_", "copy_", "floor_divide_", "bitwise_or_"):
        other = data.draw(st.booleans())
        if other:
            return f"t{i}.{op}(t{j})", lambda m: getattr(m.pool[i], op)(m.pool[j])
        if op == "copy_":
            return f"t{i}.copy_(t{i}.flip(-1))", lambda m: m.pool[i].copy_(m.pool[i].flip(-1) if m.pool[i].dim()
                                                                              else m.pool[i])
        return f"t{i}.{op}({scalar})", lambda m: getattr(m.pool[i], op)(scalar)
    if op == "clamp_":
        return f"t{i}.clamp_(-1, 2)", lambda m: m.pool[i].clamp_(-1, 2)
    if op == "fill_":
        return f"t{i}.fill_({scalar})", lambda m: m.pool[i].fill_(scalar)
    if op in ("zero_", "neg_", "abs_", "exp_"):
        return f"t{i}.{op}()", lambda m: getattr(m.pool[i], op)()
    if op == "addcmul_":
        return f"t{i}.addcmul_(t{j}, t{k})", lambda m: m.pool[i].addcmul_(m.pool[j], m.pool[k])
    if op == "lerp_":
        return f"t{i}.lerp_(t{j}, 0.25)", lambda m: m.pool[i].lerp_(m.pool[j], 0.25)
    if op == "masked_fill_":
        return f"t{i}.masked_fill_(t{j} > 0, {scalar})", lambda m: m.pool[i].masked_fill_(m.pool[j] > 0, scalar)
    index = data.draw(st.lists(st.integers(-3, 3), min_size=1, max_size=3))
    return (f"t{i}.index_put_(({index},), t{j}, accumulate)",
            lambda m: m.pool[i].index_put_((torch.tensor(index, device=m.device),), m.pool[j],
                                           accumulate=True))


def _out_step(data: Any, st: Any, i: int, j: int, k: int) -> tuple[str, Step]:
    op = data.draw(st.sampled_from(sorted(_OUT)))
    if op == "where":
        return (f"torch.where(t{i} > 0, t{j}, t{k}, out=t{k})",
                lambda m: torch.where(m.pool[i] > 0, m.pool[j], m.pool[k], out=m.pool[k]))
    if op == "cat":
        return f"torch.cat([t{i}, t{j}], out=t{k})", lambda m: torch.cat([m.pool[i], m.pool[j]], out=m.pool[k])
    fn = _OUT[op]
    if op in ("exp", "neg", "cumsum", "sum"):
        return f"{op}(t{i}, out=t{k})", lambda m: fn(m.pool[i], out=m.pool[k])
    return f"{op}(t{i}, t{j}, out=t{k})", lambda m: fn(m.pool[i], m.pool[j], out=m.pool[k])


def _rng_step(data: Any, st: Any, i: int) -> tuple[str, Step]:
    kind = data.draw(st.sampled_from(["seed", "save", "restore", "rand", "randn", "bernoulli_", "dropout",
                                      "randperm", "normal_"]))
    if kind == "seed":
        s = data.draw(st.integers(0, 2**20))
        return f"seed({s})", lambda m: m.seed(s)
    if kind == "save":
        return "states.append(get_rng_state())", lambda m: m.states.append(m.get_state())
    if kind == "restore":
        k = data.draw(st.integers(0, 30))
        return f"set_rng_state(states[{k} % len])", lambda m: m.set_state(m.states[k % len(m.states)]) \
            if m.states else None
    shape = tuple(data.draw(st.lists(st.integers(0, 4), max_size=2)))
    if kind == "rand":
        return f"torch.rand({shape})", lambda m: torch.rand(shape, device=m.device)
    if kind == "randn":
        return f"torch.randn({shape})", lambda m: torch.randn(shape, device=m.device)
    if kind == "randperm":
        n = data.draw(st.integers(0, 6))
        return f"torch.randperm({n})", lambda m: torch.randperm(n, device=m.device)
    if kind == "bernoulli_":
        return f"t{i}.bernoulli_(0.3)", lambda m: m.pool[i].bernoulli_(0.3)
    if kind == "normal_":
        return f"t{i}.normal_()", lambda m: m.pool[i].normal_()
    return f"dropout(t{i}, 0.5)", lambda m: torch.nn.functional.dropout(m.pool[i], 0.5, training=True)


def run_program(data: Any, max_steps: int = 10) -> Program:
    """Draw and run one program (inside a hypothesis test taking ``st.data()``); raises :class:`Mismatch`."""
    import hypothesis.strategies as st

    program = Program()
    for _ in range(data.draw(st.integers(1, 3))):
        program.add_input(*_draw_tensor(data, st))
    seed = data.draw(st.integers(0, 2**20))
    program.step(f"seed({seed})", lambda m: m.seed(seed))
    for _ in range(data.draw(st.integers(1, max_steps))):
        i, j, k = (_pick(data, st, program.cpu.pool) for _ in range(3))
        t = program.cpu.pool[i]
        assert t is not None
        family = data.draw(st.sampled_from(["view", "view", "unary", "binary", "in_place", "in_place", "out", "rng",
                                            "input"]))
        if family == "input":
            program.add_input(*_draw_tensor(data, st))
            continue
        if family == "view":
            step = _view_step(data, st, t, i)
        elif family == "unary":
            name = data.draw(st.sampled_from(sorted(_UNARY)))
            fn = _UNARY[name]
            step = (f"{name}(t{i})", lambda m, fn=fn, i=i: fn(m.pool[i]))
        elif family == "binary":
            name = data.draw(st.sampled_from(sorted(_BINARY)))
            fn = _BINARY[name]
            step = (f"{name}(t{i}, t{j})", lambda m, fn=fn, i=i, j=j: fn(m.pool[i], m.pool[j]))
        elif family == "in_place":
            step = _in_place_step(data, st, i, j, k)
        elif family == "out":
            step = _out_step(data, st, i, j, k)
        else:
            step = _rng_step(data, st, i)
        if step is not None:
            program.step(*step)
    program.check_pools()
    return program


def main(argv: list[str] | None = None) -> int:
    """Run many more examples than CI does: ``python -m torch_neuronx.testing.fuzz --examples N``."""
    from hypothesis import HealthCheck, given, seed, settings
    from hypothesis import strategies as st

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=12)
    args = parser.parse_args(argv)

    @seed(args.seed)
    @settings(max_examples=args.examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def fuzz(data: Any) -> None:
        run_program(data, args.max_steps)

    fuzz()
    print(f"{args.examples} programs: neuron and CPU agreed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
