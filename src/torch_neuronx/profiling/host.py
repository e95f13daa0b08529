"""Host sampling for the CPU_UTIL and HOST_MEMORY modes: /proc/stat and /proc/meminfo read in a thread."""

from __future__ import annotations

import os
import resource
import threading
import time
from collections import deque
from typing import Any

from torch_neuronx.profiling.capture import SAMPLE_INTERVAL_S


def _read_host() -> dict[str, Any]:
    """One sample of what the host can tell without psutil: /proc on Linux, getrusage elsewhere."""
    sample: dict[str, Any] = {"ts_ns": time.time_ns()}
    usage = resource.getrusage(resource.RUSAGE_SELF)
    sample["process_cpu_s"] = usage.ru_utime + usage.ru_stime
    try:
        with open("/proc/stat") as f:
            cpus = []
            for line in f:
                if not line.startswith("cpu"):
                    break
                fields = [int(x) for x in line.split()[1:]]
                idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
                cpus.append((sum(fields[:8]), idle))  # guest time is already counted in user
            sample["cpu"] = cpus  # [total, cpu0, cpu1, ...]
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.split()[1:2]}
        sample["mem_total_bytes"] = info.get("MemTotal")
        sample["mem_available_bytes"] = info.get("MemAvailable")
        with open("/proc/self/status") as f:
            status = {
                line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.startswith(("VmRSS", "VmHWM"))
            }
        sample["process_rss_bytes"] = status.get("VmRSS")
        sample["process_peak_rss_bytes"] = status.get("VmHWM")
    except (OSError, ValueError, IndexError):
        scale = 1 if os.uname().sysname == "Darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
        sample["process_peak_rss_bytes"] = usage.ru_maxrss * scale
    return sample


class _HostSampler:
    """Samples the host every SAMPLE_INTERVAL_S in a daemon thread, keeping the last hour."""

    def __init__(self) -> None:
        self.samples: deque[dict[str, Any]] = deque(maxlen=int(3600 / SAMPLE_INTERVAL_S))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.sample()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="neuron-profiler-host-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            self.sample()

    def sample(self) -> None:
        s = _read_host()
        with self._lock:
            self.samples.append(s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None

    def window(self, start_ns: int, end_ns: int) -> list[dict[str, Any]]:
        """The samples of [start_ns, end_ns], with the last one before start_ns as the baseline."""
        with self._lock:
            samples = list(self.samples)
        before = [s for s in samples if s["ts_ns"] < start_ns]
        inside = [s for s in samples if start_ns <= s["ts_ns"] <= end_ns]
        return before[-1:] + inside


def _cpu_util(samples: list[dict[str, Any]]) -> dict[str, Any]:
    rows = []
    for prev, cur in zip(samples, samples[1:], strict=False):
        wall = (cur["ts_ns"] - prev["ts_ns"]) / 1e9
        row: dict[str, Any] = {"ts_ns": cur["ts_ns"], "interval_s": round(wall, 6)}
        if wall > 0:
            row["process_pct"] = round(100 * (cur["process_cpu_s"] - prev["process_cpu_s"]) / wall, 2)
        if "cpu" in cur and "cpu" in prev:
            pcts = []
            for (t0, i0), (t1, i1) in zip(prev["cpu"], cur["cpu"], strict=False):
                pcts.append(round(100 * (1 - (i1 - i0) / (t1 - t0)), 2) if t1 > t0 else 0.0)
            row["total_pct"], row["per_cpu_pct"] = pcts[0], pcts[1:]
        rows.append(row)
    source = "/proc/stat" if samples and "cpu" in samples[-1] else "getrusage (no /proc: process only)"
    return {"source": source, "cpus": os.cpu_count(), "sample_interval_s": SAMPLE_INTERVAL_S, "samples": rows}


def _host_mem(samples: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("mem_total_bytes", "mem_available_bytes", "process_rss_bytes", "process_peak_rss_bytes")
    rows = [{"ts_ns": s["ts_ns"], **{k: s[k] for k in keys if s.get(k) is not None}} for s in samples]
    source = "/proc/meminfo" if samples and "mem_total_bytes" in samples[-1] else "getrusage (no /proc: peak RSS)"
    return {"source": source, "sample_interval_s": SAMPLE_INTERVAL_S, "samples": rows}
