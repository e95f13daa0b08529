"""Where the test suite's C++ compiler time goes: a recording wrapper for ``$CXX`` and the sums of its log.

Inductor compiles every CPU kernel with g++ in a child process that pytest's
records see only as "children CPU" of whatever test waited for it. One run of
the suite spends about a fifth of its CPU there (docs/testing.md), in three
different things: the kernels of the graphs the tests compile, the tiny
programs Inductor builds to check the CPU's vector ISA once per cache
directory, and the preprocessing of the precompiled header. To tell them
apart, ``benchmarks/bench_suite.py --compilers`` puts :func:`write_wrapper`'s
script first as ``$CXX`` (Inductor reads ``CXX``; every process the tests
start inherits it): it runs the real compiler unchanged (arguments, exit
status, output and errors pass through) and, when ``$BENCH_SUITE_CXX_LOG``
names a file it can append to, appends one line per call with the call's
kind, user and system CPU seconds and the test that was running
(``$PYTEST_CURRENT_TEST``, inherited by the test's subprocesses).
:func:`compiler_costs` sums that log. A process whose environment was rebuilt
without ``$CXX`` compiles with the real compiler, unseen. The log variable is
named outside the ``TORCH_NEURONX_``/``NEURON_`` prefixes, which
``testing/workers.py`` strips from the ranks it starts.

Keep the wrapper at one path (:func:`wrapper_dir`): Inductor keys its
precompiled header by the compiler's command line, path included, and keeps
it in its global folder (``/tmp/torchinductor_$USER/precompiled_headers``,
about 150 MB each), so a wrapper at a new path per run would leave a new
header behind every time.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterable
from pathlib import Path

KINDS = ("kernel", "isa-check", "header", "preprocess", "other")
LOG_ENV = "BENCH_SUITE_CXX_LOG"  # the file the wrapper appends to; unset (or not writable): it only compiles

# The wrapper. bash's `time` keyword writes the line (TIMEFORMAT) to the group's stderr, which is the log; the
# compiler's own stderr goes to the caller through fd 3. A kind is read from the arguments: -E preprocesses, a .gch
# output is a precompiled header, a .cpp holding a `_chk_kernel` symbol is one of Inductor's ISA probes (the
# `__avx512_chk_kernel`... programs of torch/_inductor/cpu_vec_isa.py), any other .cpp a kernel (or its wrapper).
_SCRIPT = r"""#!/usr/bin/env bash
# Written by torch_neuronx.testing.compiler_time (benchmarks/bench_suite.py --compilers): runs the real C++
# compiler and appends one line per call to the log. Delete it with its folder.
real=@REAL@
log="${BENCH_SUITE_CXX_LOG:-}"
# No log, or one that cannot be appended to: compile, record nothing (a compile never fails for the log's sake).
if [ -z "$log" ] || ! { : >>"$log"; } 2>/dev/null; then exec "$real" "$@"; fi
kind=other
for a in "$@"; do
  case "$a" in
    -E) kind=preprocess ;;
    *.gch) [ "$kind" = other ] && kind=header ;;
  esac
done
if [ "$kind" = other ]; then
  for a in "$@"; do
    case "$a" in
      *.cpp|*.cc|*.cxx)
        if grep -q _chk_kernel -- "$a" 2>/dev/null; then kind=isa-check; else kind=kernel; fi ;;
    esac
  done
fi
test="${PYTEST_CURRENT_TEST% (*)}"
test="${test//$'\t'/ }"
TIMEFORMAT="$kind	%3U	%3S	${test//%/%%}"
{ time "$real" "$@" 2>&3 3>&-; } 3>&2 2>>"$log"
"""


def _quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def real_compiler() -> str:
    """The compiler Inductor would run: ``$CXX``, else ``g++`` on PATH (its own default on Linux)."""
    name = os.environ.get("CXX") or "g++"
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"no C++ compiler: {name!r} is not on PATH; install gcc (g++) or point CXX at one")
    return path


def wrapper_dir() -> Path:
    """The wrapper's one place: under the user's cache directory (``$XDG_CACHE_HOME`` or ``~/.cache``), not a
    world-writable temporary folder, and the same every run (see the module's note on precompiled headers)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "torch_neuronx", "cxx-wrapper").absolute()


def write_wrapper(directory: Path | None = None, real: str | None = None) -> Path:
    """Write the recording wrapper as ``directory/g++`` (default :func:`wrapper_dir`; named so, since Inductor
    picks its precompiled-header format by the compiler's name) around `real` (default :func:`real_compiler`).
    Its calls are logged to the file ``$BENCH_SUITE_CXX_LOG`` names in their environment."""
    directory = directory or wrapper_dir()
    real = real or real_compiler()
    if Path(real).resolve().parent == directory.resolve():
        raise ValueError(f"the real compiler {real} is the wrapper itself: unset CXX or point it at g++")
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / "g++"
    text = _SCRIPT.replace("@REAL@", _quote(real))
    if not path.is_file() or path.read_text() != text:  # unchanged: left alone (its path and content are the key)
        tmp = directory / f".g++.{os.getpid()}"
        tmp.write_text(text)
        tmp.chmod(stat.S_IRWXU)
        os.replace(tmp, path)
    return path


def compiler_costs(lines: Iterable[str], top: int = 15) -> dict:
    """Sum a wrapper log: calls and CPU seconds per kind, and the test files whose compiles cost most
    ("(none)" for compiles no test's environment reached). Lines that are not the wrapper's are counted apart."""
    kinds = {k: {"calls": 0, "cpu": 0.0} for k in KINDS}
    files: dict[str, dict[str, float]] = {}
    unreadable = 0
    for line in lines:
        parts = line.rstrip("\n").split("\t")
        try:
            kind, user, system, test = parts
            cpu = float(user) + float(system)
        except ValueError:
            unreadable += bool(line.strip())
            continue
        if kind not in kinds:
            unreadable += 1
            continue
        kinds[kind]["calls"] += 1
        kinds[kind]["cpu"] += cpu
        f = files.setdefault(test.split("::")[0] or "(none)", {"calls": 0, "cpu": 0.0})
        f["calls"] += 1
        f["cpu"] += cpu
    by_file = sorted(files.items(), key=lambda kv: -kv[1]["cpu"])[:top]
    return {
        "calls": sum(int(k["calls"]) for k in kinds.values()),
        "cpu": round(sum(k["cpu"] for k in kinds.values()), 1),
        "by_kind": {name: {"calls": int(k["calls"]), "cpu": round(k["cpu"], 1)} for name, k in kinds.items()},
        "by_file": [{"file": name, "calls": int(f["calls"]), "cpu": round(f["cpu"], 1)} for name, f in by_file],
        "unreadable_lines": unreadable,
    }
