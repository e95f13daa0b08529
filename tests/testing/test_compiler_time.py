"""The C++ compiler's recording wrapper (torch_neuronx.testing.compiler_time): transparent to the caller, and its
log summed right."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from torch_neuronx.testing.compiler_time import LOG_ENV, compiler_costs, real_compiler, wrapper_dir, write_wrapper

GXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(GXX is None, reason="needs g++ (Inductor's CPU compiler)")

KERNEL = '#include <vector>\n#include <numeric>\nextern "C" int f(){ std::vector<int> v(7, 3); ' \
         'return std::accumulate(v.begin(), v.end(), 0); }\n'


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)


def test_the_wrapper_passes_everything_through_and_logs_each_call(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "cxx.tsv"
    wrapper = write_wrapper(tmp_path / "bin dir", GXX)  # a space in the path
    monkeypatch.setenv(LOG_ENV, str(log))
    src = tmp_path / "my src" / "k.cpp"
    src.parent.mkdir()
    src.write_text(KERNEL)
    env = {**os.environ, "PYTEST_CURRENT_TEST": "tests/x.py::t[50%\tgrad] (call)"}

    for compiler, lib in ((GXX, "direct.so"), (str(wrapper), "wrapped.so")):
        r = _run([compiler, str(src), "-O1", "-shared", "-fPIC", "-o", str(tmp_path / lib)], env=env)
        assert r.returncode == 0, r.stderr
    assert ctypes.CDLL(str(tmp_path / "wrapped.so")).f() == ctypes.CDLL(str(tmp_path / "direct.so")).f() == 21

    # A failing compile: the same exit status and the same diagnostics, on stderr, as the real compiler's.
    bad = tmp_path / "bad.cpp"
    bad.write_text("int x = ;\n")
    direct, wrapped = (_run([c, "-c", str(bad), "-o", str(tmp_path / "b.o")]) for c in (GXX, str(wrapper)))
    assert wrapped.returncode == direct.returncode != 0
    assert wrapped.stderr == direct.stderr and "expected primary-expression" in wrapped.stderr
    # Preprocessing writes to stdout: unchanged.
    no_test = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    assert _run([str(wrapper), "-E", str(src)], env=no_test).stdout == _run([GXX, "-E", str(src)]).stdout
    # An ISA probe of Inductor's (a `_chk_kernel` symbol) is told apart from a kernel.
    probe = tmp_path / "probe.cpp"
    probe.write_text('extern "C" void __avx512_chk_kernel() {}\n')
    assert _run([str(wrapper), "-c", str(probe), "-o", str(tmp_path / "p.o")]).returncode == 0

    lines = log.read_text().splitlines()
    assert [line.split("\t")[0] for line in lines] == ["kernel", "kernel", "preprocess", "isa-check"]
    assert lines[0].split("\t")[3] == "tests/x.py::t[50% grad]"  # the test, its phase cut, a tab made a space
    assert lines[1].split("\t")[3] == os.environ["PYTEST_CURRENT_TEST"].rsplit(" (", 1)[0]  # inherited from pytest
    assert lines[2].split("\t")[3] == ""  # no test in that environment
    costs = compiler_costs(lines)
    assert costs["calls"] == 4 and costs["unreadable_lines"] == 0
    assert costs["by_kind"]["kernel"]["calls"] == 2 and costs["by_kind"]["isa-check"]["calls"] == 1
    assert sum(float(line.split("\t")[1]) + float(line.split("\t")[2]) for line in lines) > 0  # CPU was measured
    assert {f["file"]: f["calls"] for f in costs["by_file"]} == {
        "tests/x.py": 1, "tests/testing/test_compiler_time.py": 2, "(none)": 1}


def test_inductor_compiles_through_the_wrapper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inductor's own call of $CXX (its config.cpp.cxx) reaches the wrapper, and the kernel it builds is right."""
    import random

    import torch._inductor.config as inductor_config

    log = tmp_path / "cxx.tsv"
    wrapper = write_wrapper(tmp_path / "bin", GXX)
    c = random.random()  # a constant of this run: its kernel is in no cache yet, so it is compiled

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * c + x.sum()

    x = torch.randn(37)
    monkeypatch.setenv(LOG_ENV, str(log))  # Inductor's compiles inherit this process's environment
    torch._dynamo.reset()
    # No precompiled header: Inductor keys it by the compiler's path and keeps it in its global folder (150 MB)
    with inductor_config.patch({"cpp.cxx": (None, str(wrapper)), "cpp_cache_precompile_headers": False}):
        out = torch.compile(f, backend="inductor")(x)
    torch._dynamo.reset()
    torch.testing.assert_close(out, f(x))
    costs = compiler_costs(log.read_text().splitlines())
    assert costs["by_kind"]["kernel"]["calls"] >= 1, log.read_text()
    assert costs["unreadable_lines"] == 0


def test_compiler_costs_sums_by_kind_and_file() -> None:
    lines = [
        "kernel\t1.250\t0.250\ttests/a.py::t1",
        "kernel\t0.500\t0.000\ttests/b.py::t2[x]",
        "isa-check\t0.700\t0.100\ttests/a.py::t3",
        "preprocess\t0.100\t0.000\t",
        "kernel\tnot-a-number\t0\ttests/a.py::t1",  # a line the wrapper did not write
        "linker\t1.0\t0.0\ttests/a.py::t1",  # an unknown kind
        "",
    ]
    c = compiler_costs(lines)
    assert c["calls"] == 4 and c["unreadable_lines"] == 2
    assert c["cpu"] == pytest.approx(2.9)
    assert c["by_kind"]["kernel"] == {"calls": 2, "cpu": 2.0}
    assert c["by_kind"]["isa-check"] == {"calls": 1, "cpu": 0.8}
    assert c["by_kind"]["header"] == {"calls": 0, "cpu": 0.0}
    assert c["by_file"] == [{"file": "tests/a.py", "calls": 2, "cpu": 2.3},
                            {"file": "tests/b.py", "calls": 1, "cpu": 0.5},
                            {"file": "(none)", "calls": 1, "cpu": 0.1}]
    assert compiler_costs(lines, top=1)["by_file"] == [{"file": "tests/a.py", "calls": 2, "cpu": 2.3}]


def test_a_missing_or_self_referring_compiler_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "no-such-compiler-xyz")
    with pytest.raises(RuntimeError, match="not on PATH; install gcc"):
        real_compiler()
    monkeypatch.delenv("CXX")
    assert real_compiler() == GXX
    wrapper = write_wrapper(tmp_path / "bin", GXX)
    with pytest.raises(ValueError, match="is the wrapper itself"):
        write_wrapper(tmp_path / "bin", str(wrapper))


def test_without_a_usable_log_the_wrapper_only_compiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wrapper = write_wrapper(tmp_path / "bin", GXX)
    first = wrapper.stat()
    assert write_wrapper(tmp_path / "bin", GXX).stat().st_ino == first.st_ino  # the same script is left alone
    src = tmp_path / "k.cpp"
    src.write_text(KERNEL)
    for i, log in enumerate((None, tmp_path, tmp_path / "no" / "such" / "folder" / "log.tsv")):  # unset, a folder, none
        if log is None:
            monkeypatch.delenv(LOG_ENV, raising=False)
        else:
            monkeypatch.setenv(LOG_ENV, str(log))
        r = _run([str(wrapper), str(src), "-shared", "-fPIC", "-o", str(tmp_path / f"k{i}.so")])
        assert r.returncode == 0 and r.stderr == ""
        assert ctypes.CDLL(str(tmp_path / f"k{i}.so")).f() == 21
    assert not (tmp_path / "no").exists()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert wrapper_dir() == tmp_path / "xdg" / "torch_neuronx" / "cxx-wrapper"
