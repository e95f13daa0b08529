"""The test suite's time budget, as a pytest plugin: what each test costs, of which kind, and which test is too slow.

CI has 90 minutes for a submission, and the suite is most of it. This plugin
(loaded through ``-p torch_neuronx.testing.suite`` in pyproject.toml) records,
for every test, its wall time, the CPU time it used in this process and in the
processes it started and waited for, and its kind:

* ``torchrun``   -- it launched a multi-process job (torchrun, or several ranks at once);
* ``subprocess`` -- it started a fresh Python (or other program) and waited for it;
* ``compile``    -- it compiled graphs with torch.compile in this process;
* ``in-process`` -- everything else.

``--suite-report PATH`` writes those records as JSON (``benchmarks/bench_suite.py``
groups them by file and by kind). ``--test-budget SECONDS`` fails the session
when a test runs longer than the budget, unless it is listed in
:data:`BUDGET_EXCEPTIONS` with its reason. The budget is in quiet-machine
seconds: on a machine whose 1-minute load is above its core count, the limit is
scaled by load / cores, so that a busy runner does not turn a correct
submission red (the budget catches tests that grew, not a noisy neighbour).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

# Tests allowed past the budget, each with the reason it cannot be cut (node id -> reason). Measured in
# docs/testing.md; each is a debt to cut, not a licence.
BUDGET_EXCEPTIONS: dict[str, str] = {
    "tests/titan/test_torchtitan.py::test_fsdp2_tp_matches_one_process":
        "its module fixture runs TorchTitan three times (seed, 1 process, 4 processes), mostly Inductor compiles "
        "of FlexAttention forward and backward on every rank; the other titan tests reuse it",
    "tests/tools/test_check.py::test_hf_generate_runs_plan_serve_buckets_against_cpu":
        "one check of 9 plan --serve buckets (more than Dynamo's default limit of 8 is the case it proves): 9 "
        "static-cache generate graphs compiled on each side, neuron and CPU",
    "tests/tools/test_check.py::test_a_hugging_face_model_directory_passes":
        "check runs SFT steps and static-cache generate of a saved model twice, on neuron and on the CPU "
        "reference, each in fresh processes that import Transformers and TRL and compile the decode step",
    "tests/tools/test_check.py::test_hf_sft_tp_fsdp_example_passes_all_four_layers":
        "check runs the 4-rank TP x FSDP SFT example and its CPU reference: eight ranks that each import "
        "Transformers and TRL before any step",
    "tests/tools/test_check.py::test_a_correct_compiled_job_with_dropout_passes":
        "a compiled job is checked in both forms (neuron backend, portable backend), each on neuron and on the "
        "CPU reference, with a cold Inductor compile in every fresh process",
    "tests/compile/test_compile_cache.py::test_disk_cache_across_processes_and_corruption":
        "the cross-process cache needs processes: two cold compiles at once, a warm one, and one after the "
        "cache files are damaged",
    "tests/hf/test_hf_flex.py::test_flex_attention_matches_sdpa_on_neuron[llama]":
        "Transformers' flex_attention path compiled forward and backward in a fresh process, against SDPA",
    "tests/hf/test_hf_flex.py::test_flex_attention_matches_sdpa_on_neuron[mistral]":
        "the same for Mistral's sliding-window mask: its own compiles in a fresh process",
    "tests/testing/test_conformance.py::test_ci_subset_covers_every_op":
        "its session fixture runs PyTorch's OpInfo samples for every op of the CI subset on neuron and CPU",
    "tests/testing/test_hf_compat.py::test_ci_subset_builds_on_cpu":
        "its fixture builds and runs every architecture of the CI subset, eager and compiled, on neuron and CPU",
    "tests/hf/test_hf_diffusers.py::test_compiled_pipeline_matches_cpu[flux]":
        "a Flux pipeline compiled with the neuron backend and with Inductor on CPU, denoising steps compared",
    "tests/compile/test_compile_registration.py::test_neuron_compiles_leave_cpu_compiles_as_they_were":
        "a fresh process compiles for CPU, then for neuron, then for CPU again to prove nothing leaked",
    "tests/hf/test_hf_examples.py::test_generate_example_matches_cpu":
        "runs examples/hf_generate.py as a user would, in a fresh process: from_pretrained, compiled static-cache "
        "generate on neuron and the same on CPU",
    "tests/compile/test_compile_cache.py::test_read_only_cache_serves_hits_and_writes_nothing":
        "three processes: one warms the cache, two read it from a read-only mount (a hit and a miss)",
}

# Words in a test module's source that say its subprocesses are multi-process jobs.
_MULTIPROCESS_WORDS = ("torchrun", "nproc", "run_processes", "world_size=")


@dataclass
class TestCost:
    """What one test cost: seconds of wall time, CPU here and in its reaped children, its kind and outcome."""

    nodeid: str
    file: str
    wall: float
    cpu: float
    children_cpu: float
    kind: str
    outcome: str
    limit: float
    worker: str = ""  # the pytest-xdist worker that ran it ("" without xdist)
    finished: float = 0.0  # when its teardown ended (epoch seconds): the workers' idle tails show from these


def _cpu() -> tuple[float, float]:
    t = os.times()
    return t.user + t.system, t.children_user + t.children_system


def _compiled_graphs() -> int:
    dynamo = sys.modules.get("torch._dynamo.utils")
    if dynamo is None:
        return 0
    return int(dynamo.counters["stats"]["unique_graphs"])


def _load_factor() -> float:
    """How much slower than quiet the machine is: the 1-minute load per usable core, from 1 to 4. Sampled when a
    test starts, so a test cannot raise its own limit with the processes it starts."""
    try:
        load = os.getloadavg()[0]
        cores = len(os.sched_getaffinity(0))
    except (OSError, AttributeError):
        return 1.0
    return min(4.0, max(1.0, load / max(1, cores)))


def worker_balance(costs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per pytest-xdist worker of a report: its tests, their summed wall seconds, and its idle tail (seconds between
    its last test's end and the last worker's): the time ``--dist loadfile`` could not give it. Empty for a report
    without xdist workers or finish times (reports written before they were recorded)."""
    if not costs or not all(c.get("finished") for c in costs) or not any(c.get("worker") for c in costs):
        return []
    last = max(c["finished"] for c in costs)
    per: dict[str, dict[str, float]] = {}
    for c in costs:
        w = per.setdefault(c.get("worker") or "controller", {"tests": 0, "wall": 0.0, "finished": 0.0})
        w["tests"] += 1
        w["wall"] += c["wall"]
        w["finished"] = max(w["finished"], c["finished"])
    return [{"worker": name, "tests": int(w["tests"]), "wall": round(w["wall"], 1),
             "idle_tail": round(last - w["finished"], 1)} for name, w in sorted(per.items())]


class SuiteBudget:
    """Collects :class:`TestCost` records and judges them against the budget."""

    def __init__(self, report: str | None, budget: float | None, worker: str = "") -> None:
        self.report = report
        self.budget = budget
        self.worker = worker  # this process's pytest-xdist worker id ("" when it is not one)
        self.costs: list[TestCost] = []
        self._start: dict[str, tuple[float, float, float, float]] = {}
        self._sources: dict[str, str] = {}
        self._outcomes: dict[str, str] = {}
        self._graphs: dict[str, int] = {}

    def _source(self, fn: Any) -> str:
        """The source of a test function or fixture (cached; empty where it cannot be read)."""
        key = getattr(fn, "__qualname__", repr(fn)) + getattr(getattr(fn, "__code__", None), "co_filename", "")
        if key not in self._sources:
            try:
                self._sources[key] = inspect.getsource(fn)
            except (OSError, TypeError):
                self._sources[key] = ""
        return self._sources[key]

    def _kind(self, item: pytest.Item, children_cpu: float, graphs: int) -> str:
        if graphs > 0:  # before children: Inductor's compile workers are child processes
            return "compile"
        if children_cpu > 0.2:
            fns = [getattr(item, "obj", None)]
            info = getattr(item, "_fixtureinfo", None)
            for defs in (info.name2fixturedefs.values() if info else ()):
                fns += [d.func for d in defs]
            text = "".join(self._source(fn) for fn in fns if fn is not None)
            return "torchrun" if any(w in text for w in _MULTIPROCESS_WORDS) else "subprocess"
        return "in-process"

    # Measured where the test runs (a pytest-xdist worker, or this process) and carried to the process that
    # reports (xdist's controller, or this one) in the teardown report's user_properties.
    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        own, children = _cpu()
        self._start[item.nodeid] = (time.monotonic(), own, children, _load_factor())

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        # Graphs are counted around the test body alone: fixtures may reset Dynamo's counters.
        before = _compiled_graphs()
        yield
        self._graphs[item.nodeid] = max(0, _compiled_graphs() - before)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> Any:
        outcome = yield
        report = outcome.get_result()
        if call.when != "teardown" or item.nodeid not in self._start:
            return
        t0, own0, children0, factor = self._start.pop(item.nodeid)
        own, children = _cpu()
        child = children - children0
        kind = self._kind(item, child, self._graphs.pop(item.nodeid, 0))
        cost = TestCost(item.nodeid, item.nodeid.split("::")[0], round(time.monotonic() - t0, 3),
                        round(own - own0, 3), round(child, 3), kind,
                        "passed", round((self.budget or 0.0) * factor, 3),
                        self.worker, round(time.time(), 3))
        report.user_properties.append(("suite_cost", asdict(cost)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed or report.skipped:  # a skip marker skips in setup, xfail in call
            self._outcomes.setdefault(report.nodeid, "failed" if report.failed else "skipped")
            if report.failed:
                self._outcomes[report.nodeid] = "failed"
        for name, value in report.user_properties:
            if name == "suite_cost":
                self.costs.append(TestCost(**{**value, "outcome": self._outcomes.pop(report.nodeid, "passed")}))

    def over_budget(self) -> list[TestCost]:
        if not self.budget:
            return []
        return [c for c in self.costs if c.wall > c.limit and c.nodeid not in BUDGET_EXCEPTIONS]

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.report:
            Path(self.report).write_text(json.dumps([asdict(c) for c in self.costs], indent=1))
        if self.over_budget() and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        slow = self.over_budget()
        if not slow:
            return
        terminalreporter.section("tests over the time budget", sep="=", red=True)
        for c in slow:
            terminalreporter.line(f"{c.wall:7.1f} s > {c.limit:.3g} s  [{c.kind}]  {c.nodeid}")
        terminalreporter.line(
            "Each test must fit the budget (docs/testing.md): share fixtures, shrink shapes, merge launches; "
            "or list it in torch_neuronx.testing.suite.BUDGET_EXCEPTIONS with the reason it cannot be cut."
        )


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("torch-neuronx suite budget")
    group.addoption("--suite-report", metavar="PATH", default=None,
                    help="write every test's wall/CPU seconds and kind as JSON (benchmarks/bench_suite.py reads it)")
    group.addoption("--test-budget", metavar="SECONDS", type=float, default=None,
                    help="fail the session when a test runs longer (scaled by load per core on a busy machine)")


def _private_caches_per_worker() -> None:
    """Under pytest-xdist, each worker compiles into caches of its own (below the run's), so that two workers
    never race on one entry; subprocesses the worker starts inherit them."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    for var in ("TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME"):
        if os.environ.get(var):
            os.environ[var] = os.path.join(os.environ[var], worker)


# Run once by the controller, in a fresh Python with a cache of its own: does every vector ISA the CPU claims pass
# Inductor's own probes? Then TORCHINDUCTOR_VEC_ISA_OK=1, under which Inductor trusts exactly those claims, leaves
# its list of ISAs, and so every pick from it (any simdlen, any ATEN_CPU_CAPABILITY), as the probes make them.
_ISA_PROBE = """
from torch._inductor import cpu_vec_isa as v
claimed = v.x86_isa_checker()
print([str(i) for i in v.valid_vec_isa_list()] == [str(i) for i in v.supported_vec_isa_list
                                                    if all(f in claimed for f in str(i).split())])
"""
_ISA_CHECK_TIMEOUT_S = 120.0


def _isa_check_key() -> str:
    """What the check's answer depends on: Python, torch, the C++ compiler Inductor runs (``$CXX`` or g++: where
    it is installed, what its ``--version`` says, and ``$PATH``, where a wrapper finds the compiler it runs) and
    the CPU's flags. A change to any of them checks again."""
    import importlib.metadata
    import shutil

    cxx = shutil.which(os.environ.get("CXX") or "g++") or ""
    stat = os.stat(cxx) if cxx else None
    answered = _run_bounded([cxx, "--version"], 10.0) if cxx else None
    version = answered[1] if answered and answered[0] == 0 else ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        flags = ""
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = ""
    return json.dumps([sys.executable, torch_version, cxx, stat and stat.st_mtime_ns, stat and stat.st_size, version,
                       os.environ.get("PATH", ""), flags.split()])


def _kept_isa_answer() -> Path | None:
    """Where the answer is kept: the user's cache (``$XDG_CACHE_HOME``, which the XDG spec says to ignore unless
    it is an absolute path, else ``~/.cache``)."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    try:
        base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    except (RuntimeError, KeyError):  # no HOME and no passwd entry: nowhere to keep it
        return None
    return base / "torch_neuronx" / "vec-isa-check.json"


def _run_bounded(argv: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int, str] | None:
    """Run `argv` under the project's process guardian (torch_neuronx.runtime.processes) and return its exit
    status and output (decoded leniently). Past `timeout`, on SIGINT or SIGTERM while it runs, or when pytest dies
    (even by SIGKILL), its whole process tree is killed: nothing it started is left running. None: out of time."""
    import subprocess

    from torch_neuronx.runtime import processes

    with processes.guarded():  # SIGINT / SIGTERM: its tree stopped, then processes.Interrupted
        proc = processes.spawn(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, errors="replace")
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            processes.stop(proc)
            return None
    return proc.returncode, out


def _run_isa_check() -> bool:
    """The check, in a fresh Python with an Inductor cache of its own. A check that fails, exits non-zero or runs
    out of time is a no: the probes stay on."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="neuron-isa-") as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
        done = _run_bounded([sys.executable, "-c", _ISA_PROBE], _ISA_CHECK_TIMEOUT_S, env)
    return done is not None and done[0] == 0 and done[1].split()[-1:] == ["True"]


def _keep_isa_answer(kept: Path, key: str, ok: bool) -> None:
    """Write the answer whole (a partial file, then a rename); where it cannot be (an unwritable cache, a folder in
    the way), nothing is left behind and the check runs again next time."""
    partial = kept.with_name(f"{kept.name}.{os.getpid()}")
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps({"key": key, "ok": ok}))
        os.replace(partial, kept)
    except OSError:
        with contextlib.suppress(OSError):
            partial.unlink()


def _trust_the_probed_vector_isa() -> None:
    """Inductor probes, in every process that compiles, whether the C++ compiler builds and loads each vector ISA
    the CPU claims: a build per probe per Inductor cache directory and a `dlopen` subprocess per probe per
    process (docs/testing.md). Under TORCHINDUCTOR_VEC_ISA_OK=1 it trusts the CPU's claims instead. Where every
    claimed ISA passes the probes (checked in a fresh Python; the answer, yes or no, kept in the user's cache,
    keyed by :func:`_isa_check_key`), the run's processes get the variable: the same ISAs to pick from, without the
    base probes. Not where the user set the variable, and not off x86-64."""
    import platform

    if "TORCHINDUCTOR_VEC_ISA_OK" in os.environ or platform.machine() not in ("x86_64", "AMD64"):
        return
    key, kept = _isa_check_key(), _kept_isa_answer()
    ok = None
    try:
        if kept is not None and kept.is_file():  # not a FIFO or a folder someone left there
            known = json.loads(kept.read_text())
            if known["key"] == key and isinstance(known["ok"], bool):
                ok = known["ok"]
    except Exception:  # whatever the file holds (even JSON nested past the recursion limit): no answer
        pass
    if ok is None:
        ok = _run_isa_check()
        if kept is not None:
            _keep_isa_answer(kept, key, ok)
    if ok:
        os.environ["TORCHINDUCTOR_VEC_ISA_OK"] = "1"


def _check_writable(path: str) -> None:
    """Refuse a report path that cannot take the report before any test runs, not after all of them."""
    target = Path(path)
    if target.is_dir() or (target.exists() and not target.is_file()):
        raise pytest.UsageError(f"--suite-report {path}: not a regular file; give a file path for the JSON report")
    existed = target.exists()
    try:
        with open(target, "a") as f:
            f.write("")
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise pytest.UsageError(f"--suite-report {path}: cannot be written ({exc.strerror})") from None
    if not existed:
        target.unlink(missing_ok=True)


def pytest_configure(config: pytest.Config) -> None:
    _private_caches_per_worker()
    if not getattr(config, "workerinput", None):  # xdist's workers inherit the controller's environment
        _trust_the_probed_vector_isa()
    budget = config.getoption("--test-budget")
    if budget is not None and not (0 < budget < float("inf")):  # also refuses nan
        raise pytest.UsageError(f"--test-budget must be a positive number of seconds, got {budget}")
    report = config.getoption("--suite-report")
    if report is not None and not getattr(config, "workerinput", None):  # the controller writes it, once
        _check_writable(report)
    # the worker id from xdist's own config, not $PYTEST_XDIST_WORKER, which a pytest run inside a test inherits
    worker = getattr(config, "workerinput", {}).get("workerid", "")
    config.pluginmanager.register(SuiteBudget(config.getoption("--suite-report"), budget, worker),
                                  "torch-neuronx-budget")
