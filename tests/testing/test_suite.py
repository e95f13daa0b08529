"""The suite's time budget (torch_neuronx.testing.suite): each test's kind and cost, and the budget that fails CI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torch_neuronx.testing import suite

SAMPLE = '''
import subprocess, sys, time
import torch

def test_sleeps():
    time.sleep(1.0)

def test_starts_python():
    subprocess.run([sys.executable, "-c", "sum(range(3 * 10**7))"], check=True)

def test_compiles():
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))

def test_fails():
    assert False

def test_quick():
    pass
'''


def _run(folder: Path, *args: str) -> tuple[int, str, list[dict]]:
    report = folder / "costs.json"
    report.unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "torch_neuronx.testing.suite",
                           f"--suite-report={report}", "-p", "no:cacheprovider", *args, str(folder / "test_sample.py")],
                          cwd=folder, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr, json.loads(report.read_text()) if report.exists() else []


def test_costs_kinds_and_the_budget(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    # One run with a budget every test but the quick ones exceeds: the sleeper is named, the run fails.
    rc, out, costs = _run(tmp_path, "--test-budget=0.01")
    assert rc == 1, out
    by_name = {c["nodeid"].split("::")[1]: c for c in costs}
    assert set(by_name) == {"test_sleeps", "test_starts_python", "test_compiles", "test_fails", "test_quick"}
    assert by_name["test_sleeps"]["wall"] >= 1.0 and by_name["test_sleeps"]["kind"] == "in-process"
    assert by_name["test_starts_python"]["kind"] == "subprocess" and by_name["test_starts_python"]["children_cpu"] > 0
    assert by_name["test_compiles"]["kind"] == "compile"
    assert by_name["test_fails"]["outcome"] == "failed" and by_name["test_quick"]["outcome"] == "passed"
    assert "tests over the time budget" in out and "test_sample.py::test_sleeps" in out
    # without xdist no worker is named; each record says when its test ended, in the order they ran
    assert {c["worker"] for c in costs} == {""}
    assert [c["nodeid"] for c in sorted(costs, key=lambda c: c["finished"])] == [c["nodeid"] for c in costs]
    assert suite.worker_balance(costs) == []

    # A budget the tests fit: the same passing tests stay green.
    rc, out, costs = _run(tmp_path, "-k", "sleeps or quick", "--test-budget=60")
    assert rc == 0 and len(costs) == 2, out
    assert "over the time budget" not in out

    # A budget that is not a positive number (nan included): a usage error, and no test runs.
    rc, out, costs = _run(tmp_path, "--test-budget=nan")
    assert rc == 4 and "--test-budget must be a positive number" in out and not costs


def test_a_report_path_that_cannot_be_written_is_refused_before_any_test(tmp_path: Path) -> None:
    for bad in ("/proc/x.json", str(tmp_path), "/dev/full", str(tmp_path / "missing" / "x.json")):
        with pytest.raises(pytest.UsageError, match="--suite-report"):
            suite._check_writable(bad)
    good = tmp_path / "costs.json"  # the twin: accepted, and nothing is left behind by the check
    suite._check_writable(str(good))
    assert not good.exists()


def test_exceptions_name_a_reason() -> None:
    for nodeid, reason in suite.BUDGET_EXCEPTIONS.items():
        assert nodeid.startswith("tests/") and "::" in nodeid, nodeid
        assert len(reason.split()) >= 5, f"{nodeid}: say why it cannot be cut"
        assert Path(nodeid.split("::")[0]).exists() or (Path(__file__).parents[2] / nodeid.split("::")[0]).exists()


def test_worker_balance_names_each_workers_idle_tail() -> None:
    def cost(worker: str, wall: float, finished: float) -> dict:
        return {"nodeid": f"tests/x.py::t{finished}", "wall": wall, "worker": worker, "finished": finished}

    costs = [cost("gw0", 10.0, 1000.0), cost("gw1", 30.0, 1030.0), cost("gw0", 5.0, 1012.5), cost("gw1", 1.0, 1031.0)]
    assert suite.worker_balance(costs) == [
        {"worker": "gw0", "tests": 2, "wall": 15.0, "idle_tail": 18.5},  # its last test ended 18.5 s before gw1's
        {"worker": "gw1", "tests": 2, "wall": 31.0, "idle_tail": 0.0},
    ]
    # a report written before finish times were recorded: no balance is claimed
    assert suite.worker_balance([{"nodeid": "a", "wall": 1.0, "worker": "gw0"}]) == []


PICK = ("from torch._inductor import cpu_vec_isa as v; i = v.pick_vec_isa(); "
        "print(type(i).__name__, '|', str(i), '|', i.build_arch_flags())")


def test_trusting_the_cpus_vector_isa_picks_what_the_probes_pick(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The run trusts the CPU's vector ISA claims (TORCHINDUCTOR_VEC_ISA_OK=1) only where that changes no pick
    Inductor makes: every claimed ISA passes its probes, so its list of ISAs is the same, and so are the picks
    from it at each SIMD width and each ATEN_CPU_CAPABILITY (the reference: a fresh process that probes)."""
    picks = ("import os\nfrom torch._inductor import config, cpu_vec_isa as v\n"
             "print([str(i) for i in v.valid_vec_isa_list()])\n"
             "for simdlen in (None, 512, 256):\n"
             "    config.cpp.simdlen = simdlen; i = v.pick_vec_isa(); print(simdlen, str(i), i.build_arch_flags())\n")

    def run(code: str, **env: str) -> list[str]:
        run_env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_VEC_ISA_OK", "ATEN_CPU_CAPABILITY")}
        run_env.update(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"), TORCH_DEVICE_BACKEND_AUTOLOAD="0", **env)
        return subprocess.run([sys.executable, "-c", code], env=run_env, capture_output=True, text=True,
                              timeout=300, check=True).stdout.strip().splitlines()

    # One probing process: the plugin's check (its answer), then Inductor's picks; one trusting process; and the
    # same two with ATEN_CPU_CAPABILITY=avx2 (a child of the run may set it: it inherits the variable).
    answer, *probed = run(suite._ISA_PROBE + picks)
    if answer != "True":
        pytest.skip("this machine's compiler fails a probe of an ISA its CPU claims: the run keeps the probes")
    assert run(picks, TORCHINDUCTOR_VEC_ISA_OK="1") == probed and len(probed) == 4, probed
    assert run(picks, ATEN_CPU_CAPABILITY="avx2", TORCHINDUCTOR_VEC_ISA_OK="1") == run(picks,
                                                                                      ATEN_CPU_CAPABILITY="avx2")

    # The plugin's logic, with the check replaced: it runs the check once, keeps the answer (yes or no) under its
    # key, uses it while the key holds, checks again for another key (a new compiler, torch, CPU) or an unreadable
    # answer, and leaves alone what the user set.
    checks: list[bool] = []
    reply = [True]

    def fake_check() -> bool:
        checks.append(reply[0])
        return reply[0]

    monkeypatch.delenv("TORCHINDUCTOR_VEC_ISA_OK", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(suite, "_run_isa_check", fake_check)
    kept = tmp_path / "xdg" / "torch_neuronx" / "vec-isa-check.json"

    def trust(kept_answer: object = None, raw: str | None = None) -> tuple[int, str | None]:
        monkeypatch.delenv("TORCHINDUCTOR_VEC_ISA_OK", raising=False)
        if kept_answer is not None or raw is not None:
            kept.write_text(raw if raw is not None else json.dumps(kept_answer))
        checks.clear()
        suite._trust_the_probed_vector_isa()
        return len(checks), os.environ.get("TORCHINDUCTOR_VEC_ISA_OK")

    key = suite._isa_check_key()
    assert trust() == (1, "1") and json.loads(kept.read_text()) == {"key": key, "ok": True}
    assert trust() == (0, "1")  # kept
    assert trust({"key": key, "ok": False}) == (0, None)
    assert trust({"key": "another", "ok": False}) == (1, "1")
    assert trust({"key": key, "ok": "no"}) == (1, "1")  # not an answer: checked again
    assert trust(raw="[" * 100_000) == (1, "1")  # past the JSON decoder's recursion limit: no answer
    assert trust(raw="{not json") == (1, "1")
    kept.unlink()
    os.mkfifo(kept)  # read, it would block: not a kept answer; the new answer replaces it
    assert trust() == (1, "1") and kept.is_file()
    reply[0] = False
    assert trust(raw="") == (1, None) and json.loads(kept.read_text())["ok"] is False
    assert trust() == (0, None)  # a no is kept too: the check does not run again at every start
    kept.unlink()
    kept.mkdir()  # a folder in the way: no answer kept, and nothing left beside it
    assert trust() == (1, None) and sorted(p.name for p in kept.parent.iterdir()) == [kept.name]
    kept.rmdir()
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # not absolute: the XDG spec says ignore it
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert suite._kept_isa_answer() == tmp_path / "home" / ".cache" / "torch_neuronx" / "vec-isa-check.json"
    monkeypatch.setenv("TORCHINDUCTOR_VEC_ISA_OK", "0")
    checks.clear()
    suite._trust_the_probed_vector_isa()
    assert not checks and os.environ["TORCHINDUCTOR_VEC_ISA_OK"] == "0"


def _left(marker: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()


def test_an_isa_check_past_its_deadline_or_signalled_leaves_no_process(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The check (and the key's `--version`) run under the process guardian: past the deadline, or when pytest is
    sent SIGTERM while one runs, the whole tree is killed, compilers included. A hung check is a no."""
    marker = f"isa-check-hang-{os.getpid()}"
    hang = ["bash", "-c", f"(exec -a {marker} sleep 900) & wait"]  # a grandchild, as a compiler would be
    monkeypatch.setattr(suite, "_ISA_PROBE", "import subprocess, time\n"
                        f"subprocess.Popen({hang!r})\ntime.sleep(900)\n")
    monkeypatch.setattr(suite, "_ISA_CHECK_TIMEOUT_S", 3.0)
    assert suite._run_isa_check() is False and not _left(marker)
    assert suite._run_bounded(hang, 1.0) is None and not _left(marker)
    # a `--version` that is not UTF-8 is read, not a traceback
    assert suite._run_bounded(["bash", "-c", r"printf 'g++ \377 1\n'"], 10.0) == (0, "g++ \ufffd 1\n")
    assert suite._run_bounded([str(tmp_path / "missing")], 10.0) == (127, "")  # the guardian's "cannot start"

    code = f"from torch_neuronx.testing import suite; print(suite._run_bounded({hang!r}, 300.0))"
    waiter = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if _left(marker):
                break
            time.sleep(0.2)
        assert _left(marker), "the bounded command never started"
        waiter.send_signal(signal.SIGTERM)
        assert waiter.wait(timeout=60) != 0  # processes.Interrupted, after the guardian killed the tree
        assert not _left(marker)
    finally:
        waiter.kill()
        waiter.wait()


def test_without_a_home_the_answer_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setenv("XDG_CACHE_HOME", "relative")
    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    monkeypatch.delenv("TORCHINDUCTOR_VEC_ISA_OK", raising=False)
    monkeypatch.setattr(suite, "_run_isa_check", lambda: True)
    assert suite._kept_isa_answer() is None
    suite._trust_the_probed_vector_isa()
    assert os.environ["TORCHINDUCTOR_VEC_ISA_OK"] == "1"
