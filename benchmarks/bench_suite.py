"""Where the test suite's time goes: by test file and by kind (torchrun, subprocess, compile, in-process).

CI has a 90-minute limit per submission and the suite is most of it; this is the
measurement the budget in docs/testing.md is kept with. It runs pytest (the
whole suite, or the arguments after ``--``) with the suite plugin's report
(``torch_neuronx.testing.suite``), or reads a report written before
(``--from``), and prints:

* wall seconds per kind, with test counts and the CPU seconds spent in this
  process and in the processes it waited for;
* per pytest-xdist worker, its tests and how long it sat idle at the end (what ``--dist loadfile`` could not
  balance);
* the files that cost most;
* the slowest tests;
* with ``--compilers``, the C++ compiler's CPU seconds (Inductor's kernels, its ISA probes, header
  preprocessing) by kind and by test file, recorded by a wrapper put first as ``$CXX``
  (``torch_neuronx.testing.compiler_time``).

Usage::

    python benchmarks/bench_suite.py                          # the whole suite, as CI runs it
    python benchmarks/bench_suite.py -- tests/tools -x        # a part of it
    python benchmarks/bench_suite.py --from report.json       # group a report pytest wrote (--suite-report)
    python benchmarks/bench_suite.py --compilers              # also where the C++ compiler's CPU goes
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from torch_neuronx.testing.bench import report
from torch_neuronx.testing.compiler_time import LOG_ENV, compiler_costs, write_wrapper
from torch_neuronx.testing.suite import worker_balance

ROOT = Path(__file__).resolve().parents[1]


def run_suite(pytest_args: list[str], path: Path, cxx: tuple[Path, Path] | None = None) -> tuple[int, float]:
    """Run pytest with the suite report into `path` (and, given `cxx` = (wrapper, log), the recording compiler
    wrapper as the C++ compiler); its exit code and wall seconds."""
    env = dict(os.environ)
    if cxx is not None:
        env["CXX"], env[LOG_ENV] = str(cxx[0]), str(cxx[1])
    # Private, cold compile caches, as .ci/run has them.
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(path.parent / "inductor"))
    env.setdefault("XDG_CACHE_HOME", str(path.parent / "cache"))  # the neuron backend's cache lives under it
    t0 = time.monotonic()
    rc = subprocess.call([sys.executable, "-m", "pytest", "-q", f"--suite-report={path}", *pytest_args],
                         cwd=ROOT, env=env)
    return rc, time.monotonic() - t0


def group(costs: list[dict], top: int) -> dict:
    """Totals per kind and per file, and the slowest tests."""
    kinds: dict[str, dict[str, float]] = defaultdict(lambda: {"tests": 0, "wall": 0.0, "cpu": 0.0, "children_cpu": 0.0})
    files: dict[str, dict[str, float]] = defaultdict(lambda: {"tests": 0, "wall": 0.0})
    for c in costs:
        k = kinds[c["kind"]]
        k["tests"] += 1
        k["wall"] += c["wall"]
        k["cpu"] += c["cpu"]
        k["children_cpu"] += c["children_cpu"]
        files[c["file"]]["tests"] += 1
        files[c["file"]]["wall"] += c["wall"]
    rounded = {name: {k: round(v, 1) for k, v in d.items()} for name, d in kinds.items()}
    by_file = sorted(files.items(), key=lambda kv: -kv[1]["wall"])
    slowest = sorted(costs, key=lambda c: -c["wall"])[:top]
    return {
        "workers": worker_balance(costs),
        "tests": len(costs),
        "wall": round(sum(c["wall"] for c in costs), 1),
        "by_kind": dict(sorted(rounded.items(), key=lambda kv: -kv[1]["wall"])),
        "by_file": [{"file": f, "tests": int(d["tests"]), "wall": round(d["wall"], 1)} for f, d in by_file[:top]],
        "slowest": [{"test": c["nodeid"], "kind": c["kind"], "wall": c["wall"]} for c in slowest],
    }


def print_table(g: dict) -> None:
    print(f"{g['tests']} tests, {g['wall']:.0f} s of test wall time")
    print(f"\n{'kind':<12}{'tests':>7}{'wall s':>9}{'cpu s':>9}{'child cpu s':>13}")
    for kind, d in g["by_kind"].items():
        print(f"{kind:<12}{d['tests']:>7.0f}{d['wall']:>9.1f}{d['cpu']:>9.1f}{d['children_cpu']:>13.1f}")
    if g.get("workers"):
        print(f"\n{'worker':<8}{'tests':>7}{'wall s':>9}{'idle at the end s':>19}")
        for w in g["workers"]:
            print(f"{w['worker']:<8}{w['tests']:>7}{w['wall']:>9.1f}{w['idle_tail']:>19.1f}")
    print(f"\n{'wall s':>8}  {'tests':>5}  file")
    for f in g["by_file"]:
        print(f"{f['wall']:>8.1f}  {f['tests']:>5}  {f['file']}")
    print(f"\n{'wall s':>8}  {'kind':<11} test")
    for t in g["slowest"]:
        print(f"{t['wall']:>8.1f}  {t['kind']:<11} {t['test']}")


def print_compilers(c: dict) -> None:
    print(f"\nC++ compiler: {c['calls']} calls, {c['cpu']:.1f} CPU s")
    print(f"{'kind':<12}{'calls':>7}{'cpu s':>9}")
    for kind, d in c["by_kind"].items():
        print(f"{kind:<12}{d['calls']:>7}{d['cpu']:>9.1f}")
    print(f"\n{'cpu s':>8}  {'calls':>5}  file (the test running when the compiler was called)")
    for f in c["by_file"]:
        print(f"{f['cpu']:>8.1f}  {f['calls']:>5}  {f['file']}")


def main() -> int:
    argv = sys.argv[1:]
    pytest_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", metavar="REPORT", help="group an existing --suite-report JSON")
    parser.add_argument("--top", type=int, default=30, help="files and tests to list (default 30)")
    parser.add_argument("--json", metavar="PATH", help="write the grouped figures as JSON")
    parser.add_argument("--compilers", action="store_true",
                        help="also record the C++ compiler's calls (a wrapper as $CXX) and sum them by kind and file")
    args = parser.parse_args(own)
    if args.top <= 0:
        parser.error(f"--top must be positive, got {args.top}")
    if args.compilers and args.source:
        parser.error("--compilers records a run; it cannot be read back from a --from report")
    wrapper = None
    if args.compilers:
        try:  # no compiler, CXX naming the wrapper itself, or an unwritable cache folder: refused before any run
            wrapper = write_wrapper()
        except (RuntimeError, ValueError, OSError) as exc:
            parser.error(f"--compilers: {exc}")
    extra: dict = {}
    if args.json:
        try:  # refuse an unwritable output before running anything
            with open(args.json, "a") as f:
                f.write("")
                f.flush()
        except OSError as exc:
            parser.error(f"--json {args.json}: cannot be written ({exc.strerror})")
    if args.source:
        if not Path(args.source).is_file():
            parser.error(f"--from {args.source}: not a regular file")
        try:
            costs = json.loads(Path(args.source).read_text())
        except (OSError, ValueError) as exc:
            parser.error(f"cannot read the suite report {args.source}: {exc}")
        keys = {"nodeid", "file", "wall", "cpu", "children_cpu", "kind"}
        if not isinstance(costs, list) or not costs or not all(isinstance(c, dict) and keys <= c.keys() for c in costs):
            parser.error(f"--from {args.source}: not a suite report (a list of records with {sorted(keys)})")
    else:
        with tempfile.TemporaryDirectory(prefix="bench_suite_") as tmp:
            path = Path(tmp) / "suite.json"
            log = Path(tmp) / "cxx.tsv"
            cxx = (wrapper, log) if wrapper is not None else None
            rc, seconds = run_suite(pytest_args, path, cxx)
            if not path.exists():
                print(f"pytest exited {rc} without a report", file=sys.stderr)
                return 1
            costs = json.loads(path.read_text())
            if args.compilers:
                extra["compilers"] = compiler_costs(log.read_text().splitlines() if log.exists() else [], args.top)
        extra.update({"pytest_exit": rc, "pytest_wall": round(seconds, 1), "load_avg": os.getloadavg()})
    g = {**group(costs, args.top), **extra}
    print_table(g)
    if "compilers" in extra:
        print_compilers(extra["compilers"])
    if extra:
        print(f"\npytest exit {extra['pytest_exit']}, {extra['pytest_wall']:.0f} s, load {extra['load_avg']}")
    if args.json:
        try:
            report(g, args.json, show=False)
        except OSError as exc:
            print(f"bench_suite: --json {args.json}: {exc.strerror}", file=sys.stderr)
            return 2
    return int(extra.get("pytest_exit", 0))


if __name__ == "__main__":
    raise SystemExit(main())
