"""``torch-neuronx migrate --tp-invariance N``: the migrated script at TP = N against itself at TP = 1.

``--check`` compares the migrated script with its CPU twin, which got the same rewrite: a tensor-parallel plan that
shards a fused weight the wrong way passes it. Here the reference is the unsharded run: the script is launched
twice under torchrun, with N processes and a (1, N) mesh, and with one process and a (1, 1) mesh (tp_probe.py
sets the mesh; the script is not edited), both at once. Every rank's losses and every step's full gradients must
equal the TP = 1 run's within a tolerance (float32 reductions in another order).
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from torch_neuronx.runtime import processes

RTOL = 1e-4
ATOL = 1e-5


@dataclass
class TPResult:
    """The verdict ("pass" or "fail") and one line per finding."""

    verdict: str
    lines: list[str] = field(default_factory=list)

    def text(self) -> str:
        return "\n".join([f"tp-invariance: {self.verdict.upper()}", *(f"  {line}" for line in self.lines)])


def _launch(script: Path, args: list[str], nproc: int, out: Path, log: Path) -> subprocess.Popen[bytes]:
    """torchrun under the shared guardian (runtime/processes.py): a signal to this process, an exception or its
    death stops torchrun and every rank, however they detached themselves."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "torch_neuronx.tools.migrate.tp_probe", str(out), str(nproc), str(script), *args]
    with open(log, "wb") as f:
        return processes.spawn(argv, stdout=f, stderr=subprocess.STDOUT)


def _wait(procs: list[subprocess.Popen[bytes]], timeout: float) -> bool:
    """Wait for all; at the deadline stop every process tree this module started. True when none timed out."""
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                processes.stop(q)
            return False
    return True


MESH_CALL = "neuron_init_mesh("
NO_MESH = ("--tp-invariance: {script} never builds a mesh through neuron_init_mesh (NxD's initialize_model_parallel): "
           "there is no tensor-parallel size to change, so nothing to compare")


def _compare(tp_n: dict, tp_1: dict, rank: int) -> list[str]:
    problems: list[str] = []
    la, lb = tp_n["losses"], tp_1["losses"]
    if len(la) != len(lb):
        problems.append(f"rank {rank}: {len(la)} losses at TP = N, {len(lb)} at TP = 1")
    for i, (a, b) in enumerate(zip(la, lb, strict=False)):
        if abs(a - b) > ATOL + RTOL * abs(b):
            problems.append(f"rank {rank}: loss {i} is {a:.6g} at TP = N, {b:.6g} at TP = 1")
            break
    for step, (ga, gb) in enumerate(zip(tp_n["grads"], tp_1["grads"], strict=False)):
        if len(ga) != len(gb):
            problems.append(f"rank {rank}: step {step} has {len(ga)} parameters at TP = N, {len(gb)} at TP = 1")
            break
        for i, (a, b) in enumerate(zip(ga, gb, strict=True)):
            if (a is None) != (b is None) or (a is not None and b is not None and (
                    a.shape != b.shape or not torch.allclose(a, b, rtol=RTOL, atol=ATOL))):
                diff = "" if a is None or b is None or a.shape != b.shape else \
                    f", largest difference {float((a - b).abs().max()):.3g}"
                problems.append(f"rank {rank}: step {step}, parameter {i} "
                                f"{tuple(b.shape) if b is not None else None}: the gradient differs{diff}")
                return problems
    return problems


def run(script: Path, args: list[str], nproc: int, out_dir: Path, timeout: float = 600.0) -> TPResult:
    """Run `script` at TP = `nproc` and at TP = 1 and compare. Raises ValueError for bad input."""
    if nproc < 2:
        raise ValueError(f"--tp-invariance {nproc}: give a tensor-parallel size of 2 or more")
    if not script.is_file():
        raise ValueError(f"--tp-invariance: {script} is not a file")
    if MESH_CALL not in script.read_text(errors="replace"):
        raise ValueError(NO_MESH.format(script=script))
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = {"tp_n": (nproc, out_dir / f"tp{nproc}"), "tp_1": (1, out_dir / "tp1")}
    with processes.guarded():  # SIGINT / SIGTERM: every torchrun and rank stopped, then Interrupted (exit 128 + N)
        procs = [_launch(script, args, n, d, out_dir / f"{name}.log") for name, (n, d) in runs.items()]
        finished = _wait(procs, timeout)
    if not finished:
        return TPResult("fail", [f"timed out after {timeout:.0f} s (logs in {out_dir})"])
    failed = [f"the TP = {n} run exited with {p.returncode}: see {out_dir / (name + '.log')}"
              for (name, (n, _)), p in zip(runs.items(), procs, strict=True) if p.returncode != 0]
    if failed:
        return TPResult("fail", failed)
    reference = torch.load(runs["tp_1"][1] / "rank0.pt", weights_only=True)
    if not reference.get("mesh"):  # the call is in the file, but the run never reached it
        raise ValueError(NO_MESH.format(script=script).replace("never builds", "never built"))
    if not reference["losses"]:
        return TPResult("fail", ["no loss was seen (no backward() on a scalar): nothing to compare"])
    problems = []
    for rank in range(nproc):
        problems += _compare(torch.load(runs["tp_n"][1] / f"rank{rank}.pt", weights_only=True), reference, rank)
    steps = len(reference["grads"])
    summary = (f"{len(reference['losses'])} losses and {steps} steps of gradients on {nproc} ranks "
               f"{'differ from' if problems else 'equal'} the TP = 1 run's (rtol {RTOL}, atol {ATOL})")
    return TPResult("fail" if problems else "pass", [summary, *problems])
