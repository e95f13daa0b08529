"""The process guardian (torch_neuronx.runtime.processes): what it kills it also reaps, so a stopped command's CPU
time reaches its starter's ``os.times()``, which the suite's budget (torch_neuronx.testing.suite) reads."""

from __future__ import annotations

import os
import sys
import time

from torch_neuronx.runtime import processes

BURN_S = 0.5
# Burns BURN_S of CPU, says so, then waits to be killed.
BURNER = (f"import time\nt = time.process_time()\nwhile time.process_time() - t < {BURN_S}: pass\n"
          "print('burnt', flush=True)\ntime.sleep(600)\n")


def _children_cpu() -> float:
    t = os.times()
    return t.children_user + t.children_system


def test_a_stopped_command_is_reaped_with_its_cpu_time(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out.txt"
    before = _children_cpu()
    with open(out, "w") as f:
        proc = processes.spawn([sys.executable, "-c", BURNER], stdout=f)
    until = time.monotonic() + 120
    while "burnt" not in out.read_text() and time.monotonic() < until and proc.poll() is None:
        time.sleep(0.05)
    assert "burnt" in out.read_text()
    started = {pid: processes.start_time(pid) for pid in processes.descendants(proc.pid)}
    assert started
    processes.stop(proc)
    assert _children_cpu() - before >= BURN_S * 0.8  # a zombie left unreaped would give ~0
    assert all(processes.start_time(pid) != when for pid, when in started.items())  # gone (or its pid reused)
