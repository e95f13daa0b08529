"""torch.compile on the neuron device: ratios measured side by side in one run.

  * compiled vs eager on neuron: a transformer block, inference and a training step;
  * neuron-compiled vs CPU-inductor-compiled, same model and inputs (target <= 1.05x);
  * cold vs warm compile in fresh processes, the warm one reading the disk
    cache the cold one wrote (target warm <= 1/3 cold).

Timings alternate between the variants in rounds and report medians, so
machine noise hits both sides alike. Run: python benchmarks/bench_compile.py
[--quick] [--json out.json].
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import torch

import torch_neuronx.compile  # noqa: F401  (registers the "neuron" backend)
from torch_neuronx.testing.bench import interleaved, report
from torch_neuronx.testing.models import DecoderBlock

D_MODEL, HEADS, FFN, BATCH, SEQ = 256, 4, 1024, 8, 128


def make_block(device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return DecoderBlock(D_MODEL, HEADS, FFN).to(device)


def make_input(device: str) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(BATCH, SEQ, D_MODEL, device=device)


def inference_step(model: Callable[..., Any], x: torch.Tensor) -> Callable[[], Any]:
    def step() -> Any:
        with torch.no_grad():
            return model(x)

    return step


def training_step(model: Callable[..., Any], params: list[torch.nn.Parameter], x: torch.Tensor) -> Callable[[], Any]:
    opt = torch.optim.SGD(params, lr=1e-4)

    def step() -> Any:
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        return loss

    return step


def runtime_ratios(rounds: int, iters: int) -> dict[str, Any]:
    """Median (and best-round) times; ratios of medians, and of best rounds (steadier on a busy machine)."""
    results: dict[str, Any] = {}
    for kind in ("inference", "training"):
        steps = {}
        for label, device, backend in (("neuron_eager", "neuron", None), ("neuron_compiled", "neuron", "neuron"),
                                       ("cpu_compiled", "cpu", "inductor")):
            model = make_block(device)
            run = torch.compile(model, backend=backend) if backend else model
            x = make_input(device)
            steps[label] = (inference_step(run, x) if kind == "inference"
                            else training_step(run, list(model.parameters()), x))
        samples = interleaved(steps, rounds, iters)
        med = {k: statistics.median(v) for k, v in samples.items()}
        best = {k: min(v) for k, v in samples.items()}
        results[kind] = {
            "median_ms": {k: round(v * 1e3, 3) for k, v in med.items()},
            "best_ms": {k: round(v * 1e3, 3) for k, v in best.items()},
            "speedup_compiled_vs_eager": round(med["neuron_eager"] / med["neuron_compiled"], 3),
            "neuron_vs_cpu_compiled": round(med["neuron_compiled"] / med["cpu_compiled"], 3),
            "neuron_vs_cpu_compiled_best": round(best["neuron_compiled"] / best["cpu_compiled"], 3),
        }
    return results


_CHILD = r"""
import json, sys, time, torch
import torch_neuronx.compile
from torch_neuronx.testing.models import DecoderBlock
torch.manual_seed(0)
model = DecoderBlock(*json.loads(sys.argv[1])).to("neuron")
torch.manual_seed(1)
x = torch.randn(*json.loads(sys.argv[2]), device="neuron")
compiled = torch.compile(model, backend="neuron")
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
def step():
    opt.zero_grad()
    compiled(x).square().mean().backward()
    opt.step()
start = time.perf_counter()
step()
print(json.dumps({"first_step_s": time.perf_counter() - start,
                  "cache": torch_neuronx.compile.metrics.snapshot()["cache"]}))
"""


def cold_warm(repeats: int) -> dict[str, Any]:
    """First training step (compile included) in fresh processes: empty cache, then warm cache."""
    cold, warm = [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="neff_bench_") as cache_dir:
            env = {**os.environ, "TORCH_NEURONX_NEFF_CACHE_DIR": cache_dir,
                   "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache_dir, "default_inductor")}
            for sink in (cold, warm):
                out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps([D_MODEL, HEADS, FFN]),
                                      json.dumps([BATCH, SEQ, D_MODEL])], env=env, capture_output=True, text=True,
                                     check=True)
                sink.append(json.loads(out.stdout.strip().splitlines()[-1]))
    cold_s = statistics.median(r["first_step_s"] for r in cold)
    warm_s = statistics.median(r["first_step_s"] for r in warm)
    return {"cold_s": round(cold_s, 2), "warm_s": round(warm_s, 2), "warm_over_cold": round(warm_s / cold_s, 3),
            "warm_cache": warm[-1]["cache"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--threads", type=int, help="intra-op threads (default: PyTorch's); 1 steadies "
                        "the figures on a busy machine")
    parser.add_argument("--skip-cache", action="store_true", help="skip the cold/warm compile measurement")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rounds, iters, repeats = (3, 3, 1) if args.quick else (15, 5, 2)
    results = {
        "model": f"pre-norm decoder block (d={D_MODEL}, heads={HEADS}, ffn={FFN}), input {BATCH}x{SEQ}x{D_MODEL}",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "runtime": runtime_ratios(rounds, iters),
    }
    if not args.skip_cache:
        results["compile_cache"] = cold_warm(repeats)
    report(results, args.json)


if __name__ == "__main__":
    main()
