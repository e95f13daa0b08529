"""Differential conformance of the neuron device against CPU over PyTorch's OpInfo database.

The device is emulated on the host and runs ATen's CPU kernels, so for every
OpInfo sample the neuron result should match the CPU result, usually bit for
bit. Each sample is generated once on CPU, then run on private copies on CPU
(the reference) and on neuron; outputs, mutated inputs and, for
differentiable floating dtypes, input gradients are compared.

Accounting, per sample:
  * ``cpu_fail``: the CPU reference raised; the sample is not in the denominator.
  * ``skip_*``: not comparable (too slow on CPU, nothing placed on the
    device, a non-strided layout).
  * ``random``: a random op whose seeded results still differ: reported, not a failure.
  * ``pass`` / ``fail``.
The pass rate is ``pass / (pass + fail)``, i.e. neuron passes over comparable
CPU passes.

Two ways to run: in-process (:func:`run_in_process`), or in worker
subprocesses (:func:`run_in_subprocesses`) so that a crash of the C++ core
costs one sample, recorded as a ``crash`` failure, and the run goes on.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import os
import re
import signal
import sys
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from torch_neuronx.testing.workers import WorkerPool, serve

EXPECTED_FAILURES = Path(__file__).resolve().with_name("conformance_expected.json")

# The dtypes Trainium computes on a core. float64/complex128 tensors live on
# the device but every op on them is a CPU fallback (TorchNeuron's rule), the
# CPU kernel itself: as op dtypes they would only compare the CPU with itself.
# They are still exercised wherever a sample or an op's composite makes them.
DEVICE_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.int64,
    torch.int32,
    torch.bool,
    torch.complex64,
)
DTYPE_NAMES: dict[str, torch.dtype] = {str(d).removeprefix("torch."): d for d in DEVICE_DTYPES}

CPU_SLOW_S = 2.0  # a sample slower than this on CPU is skipped, with the rest of its op/dtype
CPU_HARD_LIMIT_S = 30.0  # interrupts a CPU run that never returns to Python in time
DEVICE_LIMIT_S = 60.0  # the device runs the same kernels: far beyond the CPU time is a hang
UNIT_BUDGET_S = 90.0  # one op/dtype: later samples are skipped as slow
STALL_TIMEOUT_S = 180.0  # a worker with no progress for this long is killed
GRAD_SEED = 20240917
SAMPLE_SEED = 1234
OP_SEED = 4321

# A representative slice of op_db that runs in a few minutes on two cores:
# one or more ops of every kind of kernel a model leans on.
CI_SUBSET: tuple[str, ...] = (
    # elementwise unary
    "abs", "exp", "sin", "sqrt", "sigmoid", "neg", "nn.functional.gelu", "nn.functional.relu",
    # elementwise binary
    "add", "mul", "sub", "div.no_rounding_mode", "pow", "maximum", "atan2", "eq", "bitwise_and", "remainder",
    # reductions
    "sum", "mean", "amax", "prod", "var", "argmax", "logsumexp", "any",
    # matmul family
    "matmul", "mm", "bmm", "addmm", "baddbmm", "einsum", "linalg.vector_norm",
    # indexing, scatter, gather
    "index_select", "gather", "scatter", "scatter_add", "index_put", "index_add", "__getitem__", "nonzero",
    # views and reshapes
    "view", "reshape", "permute", "transpose", "expand", "squeeze", "narrow", "as_strided", "split",
    # joining
    "cat", "stack",
    # normalisation, convolution, embedding, losses
    "softmax", "log_softmax", "nn.functional.layer_norm", "nn.functional.conv1d", "nn.functional.conv2d",
    "nn.functional.embedding", "nn.functional.cross_entropy", "nn.functional.nll_loss",
    # sorting, scans, selection, masks
    "sort", "topk", "cumsum", "where", "masked_fill", "masked_select", "masked.sum",
    # complex
    "view_as_real", "view_as_complex", "complex", "angle",
    # random
    "bernoulli", "nn.functional.dropout", "normal", "uniform", "multinomial", "randn_like",
)


# An error saying that an argument must be a CPU tensor (as on CUDA).
_WANTS_CPU_ARG = re.compile(r"\bon cpu\b|\bcpu tensor|device cpu", re.IGNORECASE)

# Seeded on both sides; if they still differ the op is nondeterministic by
# nature (or draws differently), which is reported apart from failures.
_RANDOM_RE = re.compile(
    r"(^|[._])(rand\w*|normal|bernoulli|multinomial|uniform|exponential|geometric|cauchy|log_normal"
    r"|poisson|\w*dropout\w*|rrelu|gumbel_softmax|fractional_max_pool\w*|svd_lowrank|pca_lowrank"
    r"|multi_head_attention_forward)($|[._])"
)


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------

PASS, FAIL, RANDOM, CPU_FAIL = "pass", "fail", "random", "cpu_fail"
SKIP_SLOW, SKIP_NO_DEVICE, SKIP_LAYOUT = "skip_slow", "skip_no_device", "skip_layout"
STATUSES = (PASS, FAIL, RANDOM, CPU_FAIL, SKIP_SLOW, SKIP_NO_DEVICE, SKIP_LAYOUT)


@dataclasses.dataclass
class Outcome:
    """What happened to one sample."""

    op: str  # OpInfo full name: name[.variant]
    dtype: str
    index: int
    status: str
    phase: str = ""  # forward | inputs | backward | sample | worker
    category: str = ""
    exc_type: str = ""
    message: str = ""
    max_abs_diff: float | None = None
    grad_checked: bool = False

    @property
    def key(self) -> str:
        return f"{self.op}/{self.dtype}"

    def describe(self) -> str:
        where = f"{self.op} [{self.dtype}] sample {self.index}"
        what = f"{self.exc_type}: {self.message}" if self.exc_type else self.message
        if self.max_abs_diff is not None:
            what += f" (max abs diff {self.max_abs_diff:.3g})"
        return f"{where}: {self.phase} {self.category}: {what}"


@dataclasses.dataclass
class Report:
    """Aggregated outcomes of a run."""

    counts: Counter[str] = dataclasses.field(default_factory=Counter)
    failures: list[Outcome] = dataclasses.field(default_factory=list)
    randoms: list[Outcome] = dataclasses.field(default_factory=list)
    units: int = 0
    grads_checked: int = 0
    seconds: float = 0.0
    notes: list[str] = dataclasses.field(default_factory=list)

    def add(self, o: Outcome) -> None:
        self.counts[o.status] += 1
        self.grads_checked += o.grad_checked
        if o.status == FAIL:
            self.failures.append(o)
        elif o.status == RANDOM:
            self.randoms.append(o)

    def merge(self, other: Report) -> None:
        self.counts.update(other.counts)
        self.failures += other.failures
        self.randoms += other.randoms
        self.units += other.units
        self.grads_checked += other.grads_checked
        self.notes += other.notes

    @property
    def attempted(self) -> int:
        return sum(self.counts.values())

    @property
    def cpu_pass(self) -> int:
        return self.attempted - self.counts[CPU_FAIL]

    @property
    def compared(self) -> int:
        return self.counts[PASS] + self.counts[FAIL]

    @property
    def pass_rate(self) -> float:
        return self.counts[PASS] / self.compared if self.compared else 1.0

    def summary(self) -> dict[str, Any]:
        return {
            "units": self.units,
            "samples_attempted": self.attempted,
            "samples_cpu_pass": self.cpu_pass,
            "samples_compared": self.compared,
            "samples_neuron_pass": self.counts[PASS],
            "samples_failed": self.counts[FAIL],
            "samples_random_differ": self.counts[RANDOM],
            "skipped": {s: self.counts[s] for s in STATUSES if s.startswith("skip")},
            "gradients_checked": self.grads_checked,
            "pass_rate": self.pass_rate,
            "seconds": round(self.seconds, 1),
        }


# --------------------------------------------------------------------------------------------
# Expected failures and regressions
# --------------------------------------------------------------------------------------------


def load_expected(path: str | os.PathLike[str] | None) -> dict[str, str]:
    """``{"op[.variant]/dtype": reason}``; ``op/*`` covers every dtype of an op."""
    if path is None or not Path(path).exists():
        return {}
    data = json.loads(Path(path).read_text())
    return {k: str(v) for k, v in data.items() if not k.startswith("_")}


def expected_reason(o: Outcome, expected: dict[str, str]) -> str | None:
    return expected.get(o.key) or expected.get(f"{o.op}/*")


@dataclasses.dataclass
class Verdict:
    regressions: list[Outcome]
    explained: list[tuple[Outcome, str]]
    stale: list[str]  # expected failures of ops that ran and did not fail
    rate_ok: bool

    @property
    def ok(self) -> bool:
        return not self.regressions and self.rate_ok


def judge(report: Report, expected: dict[str, str], min_pass_rate: float, ran: Iterable[str] = ()) -> Verdict:
    regressions: list[Outcome] = []
    explained: list[tuple[Outcome, str]] = []
    for f in report.failures:
        reason = expected_reason(f, expected)
        if reason is None:
            regressions.append(f)
        else:
            explained.append((f, reason))
    failed_keys = {f.key for f in report.failures} | {f"{f.op}/*" for f in report.failures}
    ran_keys = set(ran) | {f"{k.split('/')[0]}/*" for k in ran}
    stale = sorted(k for k in expected if k in ran_keys and k not in failed_keys)
    return Verdict(regressions, explained, stale, report.pass_rate >= min_pass_rate)


# --------------------------------------------------------------------------------------------
# Device import and the op table
# --------------------------------------------------------------------------------------------


def import_device() -> None:
    """Registers the neuron device (a no-op where ``import torch`` autoloaded it)."""
    import torch_neuronx  # noqa: F401


def op_table() -> dict[str, Any]:
    """OpInfos by full name (``name[.variant]``), in op_db order."""
    from torch.testing._internal.common_methods_invocations import op_db

    return {op.full_name: op for op in op_db}


def device_dtypes(op: Any, wanted: Sequence[torch.dtype] = DEVICE_DTYPES) -> list[torch.dtype]:
    supported = op.supported_dtypes("cpu")
    return [d for d in wanted if d in supported]


def is_random(op: Any) -> bool:
    return bool(_RANDOM_RE.search(op.full_name))


def units_for(
    ops: Iterable[Any], dtypes: Sequence[torch.dtype] = DEVICE_DTYPES
) -> list[tuple[str, str]]:
    return [(op.full_name, str(d).removeprefix("torch.")) for op in ops for d in device_dtypes(op, dtypes)]


# --------------------------------------------------------------------------------------------
# Copying samples
# --------------------------------------------------------------------------------------------


class _NotCopyable(Exception):
    def __init__(self, status: str, why: str) -> None:
        super().__init__(why)
        self.status = status


class _Replicator:
    """Copies a sample's tensors to one device with their exact memory layout.

    Storages are copied whole and each tensor rebuilt with as_strided, so that
    strides, storage offsets, overlap and aliasing between arguments are the
    same on both sides; tensors that require grad become leaves, so that the
    gradients of both sides can be read off the same positions.
    """

    def __init__(self, device: str, keep_cpu_indices: bool = False) -> None:
        self.device = device
        self.keep_cpu_indices = keep_cpu_indices
        self.storages: dict[tuple[str, int, int, torch.dtype], torch.Tensor] = {}
        self.tensors: dict[int, torch.Tensor] = {}
        self.on_device = False  # whether anything ended up on a non-CPU device
        self.leaves: list[torch.Tensor] = []

    def tensor(self, t: torch.Tensor, device: str) -> torch.Tensor:
        hit = self.tensors.get(id(t))
        if hit is not None:
            return hit
        if t.layout != torch.strided:
            raise _NotCopyable(SKIP_LAYOUT, f"layout {t.layout}")
        out = self._rebuild(t.detach(), device)
        if t.requires_grad:
            out.requires_grad_(True)
            self.leaves.append(out)
        self.tensors[id(t)] = out
        self.on_device |= device != "cpu"
        return out

    def _rebuild(self, t: torch.Tensor, device: str) -> torch.Tensor:
        if t.is_conj():
            return self._rebuild(t.conj(), device).conj()
        if t.is_neg():
            return self._rebuild(t._neg_view(), device)._neg_view()
        storage = t.untyped_storage()
        itemsize = t.element_size()
        if storage.nbytes() % itemsize or t.numel() == 0:
            return t.clone().to(device)
        key = (device, storage.data_ptr(), storage.nbytes(), t.dtype)
        flat = self.storages.get(key)
        if flat is None:
            raw = torch.empty(0, dtype=torch.uint8).set_(storage)
            flat = raw.view(t.dtype).clone().to(device)
            self.storages[key] = flat
        return flat.as_strided(t.size(), t.stride(), t.storage_offset())

    def value(self, v: Any, is_arg: bool = False) -> Any:
        if isinstance(v, torch.Tensor):
            # Some ops take index-like arguments on CPU only, on CUDA too
            # (tensor_split's sections); OpInfo builds those on CPU whatever
            # the device. Retried that way when the device run says so.
            keep = self.keep_cpu_indices and is_arg and not (v.is_floating_point() or v.is_complex())
            return self.tensor(v, "cpu" if keep else self.device)
        if isinstance(v, torch.device) and v.type == "cpu":
            self.on_device |= self.device != "cpu"
            return torch.device(self.device)
        if isinstance(v, str) and v in ("cpu", "cpu:0"):
            # factory ops take their device as a string ("to", "new_*", ...)
            self.on_device |= self.device != "cpu"
            return self.device
        if isinstance(v, torch.Generator):
            # a fresh generator from the same seed on each side: same numbers
            g = torch.Generator(device=self.device)
            g.manual_seed(v.initial_seed())
            return g
        if isinstance(v, tuple) and hasattr(v, "_fields"):  # namedtuple
            return type(v)(*(self.value(x, is_arg) for x in v))
        if isinstance(v, list | tuple):
            return type(v)(self.value(x, is_arg) for x in v)
        if isinstance(v, dict):
            return {k: self.value(x, is_arg) for k, x in v.items()}
        return v


@dataclasses.dataclass
class _Call:
    input: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    leaves: list[torch.Tensor]
    on_device: bool


def _copy_sample(sample: Any, device: str, keep_cpu_indices: bool = False) -> _Call:
    r = _Replicator(device, keep_cpu_indices)
    inp = r.value(sample.input)
    args = tuple(r.value(a, True) for a in sample.args)
    kwargs = {k: r.value(v, True) for k, v in sample.kwargs.items()}
    return _Call(inp, args, kwargs, r.leaves, r.on_device)


# --------------------------------------------------------------------------------------------
# Comparing
# --------------------------------------------------------------------------------------------


class _Mismatch(Exception):
    def __init__(self, message: str, max_abs_diff: float | None = None, category: str = "mismatch") -> None:
        super().__init__(message)
        self.max_abs_diff = max_abs_diff
        self.category = category


def _tensors(v: Any) -> Iterator[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        yield v
    elif isinstance(v, list | tuple):
        for x in v:
            yield from _tensors(x)
    elif isinstance(v, dict):
        for x in v.values():
            yield from _tensors(x)


def tolerances(op: Any, dtype: torch.dtype) -> tuple[float, float] | None:
    """The largest (atol, rtol) any of the OpInfo's toleranceOverride decorators gives the dtype."""
    from torch.testing._internal.common_device_type import toleranceOverride

    found: list[tuple[float, float]] = []
    for info in getattr(op, "decorators", ()) or ():
        decorators = getattr(info, "decorators", [info])
        if getattr(info, "device_type", None) not in (None, "cpu"):
            continue
        for dec in decorators:
            if isinstance(dec, toleranceOverride) and dtype in dec.d:
                found.append((dec.d[dtype].atol, dec.d[dtype].rtol))
    if not found:
        return None
    return max(a for a, _ in found), max(r for _, r in found)


def _max_abs_diff(actual: torch.Tensor, expected: torch.Tensor) -> float | None:
    if actual.shape != expected.shape:
        return None
    try:
        wide = torch.complex64 if (actual.is_complex() or expected.is_complex()) else torch.float32
        diff = (actual.to(wide) - expected.to(wide)).abs()
        both_nan = actual.to(wide).isnan() & expected.to(wide).isnan()
        diff = diff.masked_fill(both_nan, 0).nan_to_num(nan=math.inf)
        return float(diff.max()) if diff.numel() else 0.0
    except Exception:
        return None


def compare(
    expected: Any,
    actual: Any,
    tol: tuple[float, float] | None,
    *,
    values: bool = True,
    path: str = "out",
    on_device: bool = True,
    tensors_only: bool = False,
) -> None:
    """Raises _Mismatch where the neuron result differs from the CPU reference.

    `on_device`: tensors must be neuron tensors; `tensors_only`: other values
    are not compared (the arguments, where devices were swapped on purpose).
    """
    kw = {"values": values, "on_device": on_device, "tensors_only": tensors_only}
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            raise _Mismatch(f"{path}: expected a tensor, got {type(actual).__name__}")
        if on_device and actual.device.type != "neuron":
            raise _Mismatch(f"{path}: result on {actual.device}, not on neuron", category="device")
        got = actual.detach().cpu()
        want = expected.detach()
        if not values:
            if got.shape != want.shape or got.dtype != want.dtype:
                raise _Mismatch(f"{path}: {got.dtype}{list(got.shape)} vs {want.dtype}{list(want.shape)}")
            return
        atol, rtol = tol if tol is not None else (None, None)
        try:
            torch.testing.assert_close(got, want, atol=atol, rtol=rtol, equal_nan=True, check_device=False)
        except AssertionError as e:
            first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "values differ")
            raise _Mismatch(f"{path}: {first}", _max_abs_diff(got, want)) from None
        return
    if isinstance(expected, list | tuple):
        if not isinstance(actual, list | tuple) or len(actual) != len(expected):
            raise _Mismatch(f"{path}: expected a sequence of {len(expected)}, got {type(actual).__name__}")
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            compare(e, a, tol, path=f"{path}[{i}]", **kw)
        return
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            raise _Mismatch(f"{path}: dict keys differ")
        for k in expected:
            compare(expected[k], actual[k], tol, path=f"{path}[{k!r}]", **kw)
        return
    if isinstance(expected, float) and isinstance(actual, float) and math.isnan(expected) and math.isnan(actual):
        return
    if not values or tensors_only:
        return
    try:
        same = bool(expected == actual)
    except Exception as e:  # an object whose == is not a plain truth value
        raise _Mismatch(f"{path}: cannot compare {type(expected).__name__}: {e}") from None
    if not same:
        raise _Mismatch(f"{path}: {expected!r} != {actual!r}")


# --------------------------------------------------------------------------------------------
# Running one sample
# --------------------------------------------------------------------------------------------


class _Deadline(Exception):
    pass


# Set by a worker process: told before each stage of a sample that may crash
# the process, so that the parent can say where it died.
_stage_hook: Callable[[int, str], None] | None = None


def _stage(index: int, name: str) -> None:
    if _stage_hook is not None:
        _stage_hook(index, name)


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Interrupts Python code (not a C++ kernel) after `seconds`; main thread only."""
    if seconds <= 0 or not hasattr(signal, "setitimer") or _in_worker_thread():
        yield
        return

    def _raise(signum: int, frame: Any) -> None:
        raise _Deadline(f"no result after {seconds:.0f}s")

    previous = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _in_worker_thread() -> bool:
    import threading

    return threading.current_thread() is not threading.main_thread()


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    line = text.splitlines()[0] if text else ""
    return line[:300]


def _grad_outputs(out: Any) -> list[torch.Tensor]:
    return [t for t in _tensors(out) if t.requires_grad and (t.is_floating_point() or t.is_complex())]


def _weighted_loss(outs: list[torch.Tensor], seed: int) -> torch.Tensor:
    """One scalar from all differentiable outputs, weighted by fixed CPU-drawn noise.

    A plain sum would hide a gradient that is wrong by a permutation or a
    constant; per-element weights drawn from a seeded CPU generator are the
    same on both sides, whatever device the outputs are on.
    """
    gen = torch.Generator().manual_seed(seed)
    total: torch.Tensor | None = None
    for o in outs:
        wdtype = torch.complex64 if o.is_complex() else torch.float32
        w = torch.randn(o.shape, generator=gen, dtype=wdtype).to(o.device)
        term = (o.to(wdtype) * w).real.sum() if o.is_complex() else (o.to(wdtype) * w).sum()
        total = term if total is None else total + term
    assert total is not None
    return total


@dataclasses.dataclass
class _Run:
    out: Any = None
    call: _Call | None = None
    error: BaseException | None = None
    seconds: float = 0.0
    grads: list[torch.Tensor | None] | None = None
    grad_error: BaseException | None = None


def _run_side(
    op: Any, sample: Any, device: str, seed: int, limit: float, with_grad: bool, grad_seed: int, index: int,
    keep_cpu_indices: bool = False,
) -> _Run:
    run = _Run()
    _stage(index, f"{device} forward")
    try:
        call = _copy_sample(sample, device, keep_cpu_indices)
    except _NotCopyable:
        raise
    except Exception as e:  # copying to the device is part of what is tested
        run.error = e
        return run
    run.call = call
    torch.manual_seed(seed)
    start = time.perf_counter()
    try:
        with _deadline(limit):
            run.out = op(call.input, *call.args, **call.kwargs)
    except Exception as e:
        run.error = e
        return run
    finally:
        run.seconds = time.perf_counter() - start
    if with_grad and call.leaves:
        try:
            processed = sample.output_process_fn_grad(run.out)
            outs = _grad_outputs(processed)
            if outs:
                _stage(index, f"{device} backward")
                with _deadline(limit):
                    loss = _weighted_loss(outs, grad_seed)
                    run.grads = list(torch.autograd.grad(loss, call.leaves, allow_unused=True))
        except Exception as e:
            run.grad_error = e
    return run


def resolve_per_device_choices(sample: Any, dtype: torch.dtype, device: str = "neuron") -> Any:
    """The sample with the choices upstream makes per device type made for `device`, for both sides.

    ``F.linear_cross_entropy``'s chunked path resolves its ``"auto"`` options
    by device type (``LinearCrossEntropyOptions._adjust``): CPU gets the
    "accurate" policy with float32 accumulation, any other device (CUDA
    aside) "compact" in the input dtype and another chunk size. Run as is,
    CPU and neuron would compute different things in bf16/fp16, and the
    difference (0.001 and more) would say nothing about the device. Both
    sides therefore get the options resolved as for `device` (what a script
    gets on TorchNeuron); with the same options neuron matches CPU bit for
    bit. Other samples are returned unchanged.
    """
    options = sample.kwargs.get("options") if isinstance(getattr(sample, "kwargs", None), dict) else None
    if options is None or type(options).__name__ != "LinearCrossEntropyOptions":
        return sample
    from torch.nn.modules import linear_cross_entropy_options as lce

    target = torch.device(device)
    auto = lce._AUTO_DEFAULTS.get((target.type, dtype), lce._AUTO_FALLBACK)
    changes: dict[str, Any] = {}
    if options.acc_policy == "auto":
        changes["acc_policy"] = auto.acc_policy
        if options.acc_dtype is None:
            changes["acc_dtype"] = lce.LinearCrossEntropyOptions._resolve_auto_acc_dtype(dtype, target) or dtype
    if options.chunking_method == "auto" and options.batch_chunk_size is None:
        changes["chunking_method"] = auto.chunking_method
    if not changes:
        return sample
    resolved = copy.copy(sample)
    resolved.kwargs = {**sample.kwargs, "options": dataclasses.replace(options, **changes)}
    return resolved


def run_sample(
    op: Any,
    sample: Any,
    dtype: torch.dtype,
    index: int,
    *,
    with_grad: bool,
    tol: tuple[float, float] | None,
) -> Outcome:
    """Runs one sample on CPU and on neuron and compares them."""
    name, dname = op.full_name, str(dtype).removeprefix("torch.")

    def outcome(status: str, **kw: Any) -> Outcome:
        return Outcome(name, dname, index, status, **kw)

    seed = OP_SEED + index
    grad_seed = GRAD_SEED + index
    sample = resolve_per_device_choices(sample, dtype)
    try:
        ref = _run_side(op, sample, "cpu", seed, CPU_HARD_LIMIT_S, with_grad, grad_seed, index)
    except _NotCopyable as e:
        return outcome(e.status, message=str(e))
    if ref.error is not None:
        if isinstance(ref.error, _Deadline):
            return outcome(SKIP_SLOW, message=str(ref.error))
        return outcome(CPU_FAIL, exc_type=type(ref.error).__name__, message=_first_line(ref.error))
    if ref.seconds > CPU_SLOW_S:
        return outcome(SKIP_SLOW, message=f"{ref.seconds:.1f}s on CPU")

    limit = max(DEVICE_LIMIT_S, 20 * ref.seconds)
    dev_grad = with_grad and ref.grads is not None
    try:
        dev = _run_side(op, sample, "neuron", seed, limit, dev_grad, grad_seed, index)
        if dev.error is not None and _WANTS_CPU_ARG.search(str(dev.error)):
            retry = _run_side(op, sample, "neuron", seed, limit, dev_grad, grad_seed, index, True)
            dev = retry if retry.error is None else dev
    except _NotCopyable as e:
        return outcome(e.status, message=str(e))
    assert dev.call is not None or dev.error is not None
    if dev.call is not None and not dev.call.on_device:
        return outcome(SKIP_NO_DEVICE, message="nothing in the sample goes to the device")

    random = is_random(op)

    def failure(phase: str, err: BaseException) -> Outcome:
        if isinstance(err, _Mismatch):
            status = RANDOM if random else FAIL
            return outcome(status, phase=phase, category=err.category if phase != "backward" else
                           "grad-" + err.category, message=str(err)[:300], max_abs_diff=err.max_abs_diff)
        if isinstance(err, _Deadline):
            return outcome(FAIL, phase=phase, category="timeout", exc_type="Timeout", message=str(err))
        category = "exception" if phase != "backward" else "grad-exception"
        msg = _first_line(err)
        return outcome(FAIL, phase=phase, category=category, exc_type=type(err).__name__, message=msg)

    if dev.error is not None:
        return failure("forward", dev.error)
    uninitialized = bool(getattr(op, "has_nondeterministic_output", False))
    _stage(index, "neuron compare outputs")
    try:
        compare(ref.out, dev.out, tol, values=not uninitialized)
    except _Mismatch as m:
        return failure("forward", m)
    except Exception as e:  # comparing must not take the harness down
        return failure("forward", e)
    # in-place and out= style ops: the mutated inputs must agree too
    assert ref.call is not None and dev.call is not None
    _stage(index, "neuron compare inputs")
    try:
        compare((ref.call.input, ref.call.args, ref.call.kwargs),
                (dev.call.input, dev.call.args, dev.call.kwargs), tol, values=not uninitialized, path="inputs",
                on_device=False, tensors_only=True)
    except _Mismatch as m:
        m.category = "input-" + m.category
        return failure("inputs", m)
    except Exception as e:
        return failure("inputs", e)

    grad_checked = False
    if ref.grads is not None:
        if dev.grad_error is not None:
            return failure("backward", dev.grad_error)
        if dev.grads is None:
            return failure("backward", _Mismatch("no gradient on neuron"))
        _stage(index, "neuron compare gradients")
        try:
            compare(ref.grads, dev.grads, tol, path="grad")
        except _Mismatch as m:
            return failure("backward", m)
        except Exception as e:
            return failure("backward", e)
        grad_checked = True
    return outcome(PASS, grad_checked=grad_checked)


# --------------------------------------------------------------------------------------------
# Running an op/dtype unit
# --------------------------------------------------------------------------------------------


def run_unit(
    op: Any, dtype: torch.dtype, emit: Callable[[Outcome], None], start: int = 0,
    budget_s: float = UNIT_BUDGET_S,
) -> None:
    """All samples of one OpInfo at one dtype, from sample `start` on; never raises."""
    name, dname = op.full_name, str(dtype).removeprefix("torch.")
    with_grad = bool(op.supports_autograd) and dtype in op.supported_backward_dtypes("cpu")
    tol = tolerances(op, dtype)
    began = time.perf_counter()
    try:
        torch.manual_seed(SAMPLE_SEED)
        with _deadline(CPU_HARD_LIMIT_S * 2):
            samples = list(op.sample_inputs("cpu", dtype, requires_grad=with_grad))
    except Exception as e:
        # a sample generator that fails on CPU: nothing to compare
        emit(Outcome(name, dname, -1, CPU_FAIL, phase="sample", exc_type=type(e).__name__,
                     message=_first_line(e)))
        return
    slow: str | None = None
    for i, sample in enumerate(samples):
        if i < start:
            continue
        if slow is None and time.perf_counter() - began > budget_s:
            slow = f"op/dtype over its {budget_s:.0f}s budget"
        if slow is not None:
            emit(Outcome(name, dname, i, SKIP_SLOW, message=slow))
            continue
        try:
            o = run_sample(op, sample, dtype, i, with_grad=with_grad, tol=tol)
        except Exception as e:  # a bug in the harness itself, reported rather than fatal
            o = Outcome(name, dname, i, FAIL, phase="harness", category="harness-error",
                        exc_type=type(e).__name__, message=_first_line(e))
        if o.status == SKIP_SLOW:
            slow = o.message
        emit(o)


@contextlib.contextmanager
def _quiet(threads: int) -> Iterator[None]:
    before = torch.get_num_threads()
    if threads > 0:
        torch.set_num_threads(threads)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            torch.set_num_threads(before)


def run_in_process(
    units: Sequence[tuple[str, str]], threads: int = 1, progress: Callable[[str], None] | None = None
) -> Report:
    """Runs the units here; a crash of the C++ core takes the process down with it."""
    import_device()
    table = op_table()
    report = Report()
    began = time.perf_counter()
    with _quiet(threads):
        for name, dname in units:
            op = table.get(name)
            if op is None:
                report.notes.append(f"unknown OpInfo {name!r}")
                continue
            if progress:
                progress(f"{name} [{dname}]")
            run_unit(op, DTYPE_NAMES[dname], report.add)
            report.units += 1
    report.seconds = time.perf_counter() - began
    return report


# --------------------------------------------------------------------------------------------
# Worker processes
# --------------------------------------------------------------------------------------------


def _serve_units(task: dict[str, Any], emit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """The worker's task: run units from ``resume_unit`` (its samples from ``resume_sample``), emitting events.

    ``{"begin": u}`` before unit u, ``{"u", "i", "stage"}`` before each risky
    stage of a sample, one event per sample outcome, ``{"end": u}`` after the
    unit: from the last events the parent knows where a crash happened.
    """
    global _stage_hook
    import_device()
    table = op_table()
    units = [tuple(u) for u in task["units"]]
    with _quiet(task["threads"]):
        for u in range(task["resume_unit"], len(units)):
            name, dname = units[u]
            emit({"begin": u})
            op = table.get(name)
            if op is not None:
                start = task["resume_sample"] if u == task["resume_unit"] else 0
                _stage_hook = lambda i, stage, u=u: emit({"u": u, "i": i, "stage": stage})  # noqa: E731
                run_unit(op, DTYPE_NAMES[dname], lambda o, u=u: emit({"u": u, **dataclasses.asdict(o)}), start)
                _stage_hook = None
            emit({"end": u})
    return {"units": len(units)}


def _crash_site(stderr: str) -> str:
    """The innermost Python frame of the crashed thread in a faulthandler dump, or of a traceback."""
    lines = stderr.splitlines()
    if "Fatal Python error" in stderr:
        # faulthandler lists every thread; the one that crashed comes first after this line, innermost first
        start = next((i for i, ln in enumerate(lines) if ln.startswith("Current thread")), len(lines))
        frames = [ln.strip() for ln in lines[start + 1 :] if ln.strip().startswith("File ")][:1]
    else:
        frames = [ln.strip() for ln in lines if ln.strip().startswith("File ")][-1:]
    return frames[0][:200] if frames else ""


@dataclasses.dataclass
class _Progress:
    """Where a worker got to, from its events: the unit it was in, the last sample it finished, the stage."""

    report: Report
    resume_unit: int
    resume_sample: int
    current: int = -1
    last: int = -1
    stage: str = ""
    ended: set[int] = dataclasses.field(default_factory=set)

    def on_event(self, ev: dict[str, Any]) -> None:
        if "begin" in ev:
            self.current, self.stage = ev["begin"], "sample generation"
            self.last = self.resume_sample - 1 if ev["begin"] == self.resume_unit else -1
        elif "end" in ev:
            self.ended.add(ev["end"])
            self.report.units += 1
        elif "stage" in ev:
            self.stage = f"sample {ev['i']}: {ev['stage']}"
        else:
            self.report.add(Outcome(**{k: v for k, v in ev.items() if k in _OUTCOME_FIELDS}))
            self.last, self.stage = max(self.last, ev["index"]), ""


_OUTCOME_FIELDS = {f.name for f in dataclasses.fields(Outcome)}


def _run_chunk(pool: WorkerPool, units: list[tuple[str, str]], threads: int, log: Callable[[str], None],
               max_restarts: int = 500) -> Report:
    """Runs units in a worker, restarting it after each crash just past the sample that crashed."""
    report = Report()
    resume_unit, resume_sample, restarts = 0, 0, 0
    while resume_unit < len(units):
        progress = _Progress(report, resume_unit, resume_sample)
        task = {"units": units, "resume_unit": resume_unit, "resume_sample": resume_sample, "threads": threads}
        result = pool.run(task, timeout=float("inf"), on_event=progress.on_event)
        if result.ok:
            break
        restarts += 1
        if result.status == "error":  # the harness itself failed outside any sample
            report.notes.append(f"worker error: {result.message.splitlines()[0][:200]}")
            break
        if progress.current < 0 or progress.current in progress.ended:
            # died outside any unit (startup, import): nothing to pin it on, move on
            tail = result.stderr_tail.strip().splitlines()[-1:] or [""]
            report.notes.append(f"worker died outside a unit ({result.message}): {tail[0][:200]}")
            resume_unit, resume_sample = max(progress.current + 1, resume_unit + (progress.current < 0)), 0
        else:
            name, dname = units[progress.current]
            crash_index = progress.last + 1
            stalled = result.status in ("stall", "timeout")
            site = _crash_site(result.stderr_tail)
            where = f"{result.message} during {progress.stage or 'the unit'}" + (f" at {site}" if site else "")
            on_cpu = ": cpu" in progress.stage  # the reference itself died: not the device's failure
            report.add(Outcome(name, dname, crash_index, CPU_FAIL if on_cpu else FAIL, phase="worker",
                               category="timeout" if stalled else "crash",
                               exc_type="Timeout" if stalled else "Crash", message=where))
            log(f"  {name} [{dname}] {progress.stage}: {result.message}")
            resume_unit, resume_sample = progress.current, crash_index + 1
        if restarts >= max_restarts:
            report.notes.append(f"gave up on the chunk after {restarts} worker restarts")
            break
    return report


def run_in_subprocesses(
    units: Sequence[tuple[str, str]],
    chunk_ops: int = 25,
    threads: int = 1,
    stall_timeout: float = STALL_TIMEOUT_S,
    log: Callable[[str], None] = lambda s: None,
) -> Report:
    """Runs the units in a worker process (torch_neuronx.testing.workers), chunks of about `chunk_ops` OpInfos
    at a time; a crash or a stall costs the sample it happened in, and the run goes on past it."""
    by_op: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for u in units:
        by_op[u[0]].append(u)
    ops = list(by_op)
    report = Report()
    began = time.perf_counter()
    argv = [sys.executable, "-X", "faulthandler", "-m", "torch_neuronx.testing.conformance", "--worker"]
    with WorkerPool(argv, stall_timeout=stall_timeout) as pool:
        for c in range(0, len(ops), max(1, chunk_ops)):
            chunk = [u for name in ops[c : c + chunk_ops] for u in by_op[name]]
            log(f"ops {c + 1}-{min(c + chunk_ops, len(ops))} of {len(ops)} ({len(chunk)} op/dtype units), "
                f"{time.perf_counter() - began:.0f}s")
            report.merge(_run_chunk(pool, chunk, threads, log))
    report.seconds = time.perf_counter() - began
    return report


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def category_counts(failures: Iterable[Outcome]) -> Counter[str]:
    return Counter(f"{f.phase}:{f.category}" + (f":{f.exc_type}" if f.exc_type else "") for f in failures)


def to_json(report: Report, verdict: Verdict) -> dict[str, Any]:
    return {
        "summary": report.summary(),
        "ok": verdict.ok,
        "failure_categories": dict(category_counts(report.failures).most_common()),
        "regressions": [dataclasses.asdict(f) for f in verdict.regressions],
        "expected_failures": [dict(dataclasses.asdict(f), reason=r) for f, r in verdict.explained],
        "stale_expected": verdict.stale,
        "random_differ": [dataclasses.asdict(f) for f in report.randoms],
        "notes": report.notes,
    }


def to_markdown(report: Report, verdict: Verdict, title: str = "OpInfo conformance: neuron vs CPU") -> str:
    s = report.summary()
    lines = [
        f"# {title}",
        "",
        "| metric | value |",
        "|---|---|",
        f"| op/dtype units | {s['units']} |",
        f"| samples attempted | {s['samples_attempted']} |",
        f"| samples passing on CPU | {s['samples_cpu_pass']} |",
        f"| samples compared | {s['samples_compared']} |",
        f"| samples passing on neuron | {s['samples_neuron_pass']} |",
        f"| pass rate | {s['pass_rate']:.4%} |",
        f"| random ops differing after seeding | {s['samples_random_differ']} |",
        f"| gradients checked | {s['gradients_checked']} |",
        *(f"| {k} | {v} |" for k, v in s["skipped"].items()),
        f"| wall time | {s['seconds']} s |",
        "",
        f"**{'OK' if verdict.ok else 'REGRESSION'}**: {len(verdict.regressions)} unexpected failures, "
        f"{len(verdict.explained)} expected.",
        "",
    ]
    if report.failures:
        lines += ["## Failure categories", "", "| category | samples |", "|---|---|"]
        lines += [f"| {c} | {n} |" for c, n in category_counts(report.failures).most_common()]
        lines.append("")

    def grouped(items: list[tuple[Outcome, str]], header: str) -> None:
        if not items:
            return
        lines.extend([f"## {header}", "", "| op/dtype | samples | first failure | reason |", "|---|---|---|---|"])
        groups: dict[str, list[tuple[Outcome, str]]] = defaultdict(list)
        for f, r in items:
            groups[f.key].append((f, r))
        for key, fs in groups.items():
            first = fs[0][0].describe().split(": ", 1)[1].replace("|", "\\|")
            lines.append(f"| `{key}` | {len(fs)} | {first[:200]} | {fs[0][1]} |")
        lines.append("")

    grouped([(f, "") for f in verdict.regressions], "Unexpected failures")
    grouped(verdict.explained, "Expected failures")
    if verdict.stale:
        lines += ["## Expected failures that did not fail", "", *(f"- `{k}`" for k in verdict.stale), ""]
    if report.randoms:
        keys = Counter(f.key for f in report.randoms)
        lines += ["## Random ops differing after identical seeding", "",
                  *(f"- `{k}`: {n} samples" for k, n in keys.most_common()), ""]
    if report.notes:
        lines += ["## Notes", "", *(f"- {n}" for n in report.notes), ""]
    return "\n".join(lines)


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    serve(_serve_units)
