"""How long `torch-neuronx plan` takes, and how its memory and collectives compare with measured steps.

Speed (the target: an 8B and a 70B model on 16 x trn2.48xlarge in under 10 s wall on an idle 2-core machine,
imports included): each variant is a fresh `torch-neuronx plan` process, timed from start to exit, in alternating
rounds beside a bare `python -c "import torch, torch_neuronx"` (the floor every CLI call pays); the figures are
medians and the ratio to that floor.

`--measured` also reruns the agreement table of docs/plan.md ("--measure against the estimate"): one real step of
each listed layout on emulated NeuronCores (one process per core), its allocator peak beside the analytic
estimate and its collectives beside the planned ones. It takes a few minutes.

    python benchmarks/bench_plan.py [--rounds 3] [--measured] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from torch_neuronx.testing.bench import medians, report

PLAN_ARGS = ["--instance", "trn2.48xlarge", "--instances", "16", "--global-batch", "1024", "--seq-len", "8192",
             "--checkpointing", "full"]

# (model, precision, checkpointing, micro-batches per step, layout, extra plan() settings): the docs' table
MEASURED = [
    ("llama", "fp32", "none", 1, (1, 4, 1), {}),
    ("llama", "fp32", "none", 2, (2, 2, 1), {}),
    ("llama", "fp32", "none", 1, (1, 2, 2), {}),
    ("llama", "fp32", "none", 1, (1, 1, 4), {}),
    ("mistral", "fp32", "none", 2, (2, 2, 1), {}),
    ("mistral", "fp32", "none", 4, (4, 1, 1), {}),
    ("mistral", "fp32", "full", 4, (4, 1, 1), {}),
    ("llama", "bf16-mixed", "none", 2, (2, 2, 1), {}),
    ("llama", "bf16-mixed", "none", 1, (1, 4, 1), {}),
    ("llama", "bf16-mixed", "full", 1, (1, 4, 1), {}),
    ("llama", "bf16-mixed", "full", 2, (2, 2, 1), {}),
    ("llama", "bf16", "none", 1, (1, 4, 1), {}),
    ("llama", "bf16", "none", 2, (2, 2, 1), {}),
    ("llama", "fp32", "none", 1, (1, 1, 4), {"zero1": True}),
    ("llama", "bf16", "none", 1, (1, 1, 4), {"zero1": True}),
    ("llama", "fp32", "none", 2, (1, 1, 1, 2), {"instance": "trn1.2xlarge"}),
    ("llama", "fp32", "none", 4, (1, 1, 1, 2), {"instance": "trn1.2xlarge"}),
    ("mistral", "fp32", "none", 4, (4, 1, 1), {"sequence_parallel": True}),
    ("mistral", "fp32", "full", 4, (4, 1, 1), {"sequence_parallel": True}),
    ("mistral", "bf16", "none", 4, (4, 1, 1), {"sequence_parallel": True}),
    ("mistral", "bf16", "full", 4, (4, 1, 1), {"sequence_parallel": True}),
    ("llama", "fp32", "none", 2, (2, 2, 1), {"sequence_parallel": True}),
    ("llama", "fp32", "none", 2, (2, 1, 2), {"sequence_parallel": True}),
    ("llama", "bf16-mixed", "full", 2, (2, 2, 1), {"sequence_parallel": True}),
]


def wall(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def speed(rounds: int, tmp: Path) -> dict[str, Any]:
    from torch_neuronx.testing.plan import LLAMA3_8B, LLAMA31_70B

    variants = {"import floor": [sys.executable, "-c", "import torch, torch_neuronx"]}
    for name, config in (("plan 8B", LLAMA3_8B), ("plan 70B", LLAMA31_70B)):
        path = tmp / f"{name.split()[1]}.json"
        path.write_text(json.dumps(config))
        variants[name] = [sys.executable, "-m", "torch_neuronx.tools.cli", "plan", str(path), *PLAN_ARGS]
    samples: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(wall(variants[name]))
    med = medians(samples)
    both = med["plan 8B"] + med["plan 70B"]
    return {"median_s": med, "8B + 70B": both, "ratio_to_import_floor": {k: v / med["import floor"]
                                                                          for k, v in med.items()}}


def measured_table(tmp: Path) -> list[str]:
    from torch_neuronx.testing.plan import tiny_llama, tiny_mistral
    from torch_neuronx.tools.plan import plan

    rows = []
    for i, (name, precision, ckpt, steps, layout, extra) in enumerate(MEASURED):
        settings = {"instance": "trn2.3xlarge", "micro_batch": 2, "seq_len": 32, **extra}
        world = layout[0] * layout[1] * layout[2] * (layout[3] if len(layout) > 3 else 1)
        data_parallel = layout[1] * layout[2]
        settings["global_batch"] = 2 * steps * data_parallel if len(layout) == 3 else 2 * steps
        config = tiny_llama() if name == "llama" else tiny_mistral()
        lp = plan(config, layouts=[layout], precision=precision, checkpointing=ckpt, measure=1,
                  workdir=tmp / f"m{i}", **settings).best
        m = lp.measured
        assert m is not None and lp.layout.world == world
        comm = "; ".join(f"{r['group']} {r['collective']} {r['calls']}x {r['bytes']:,}" for r in m["comm"])
        kind = precision + (" ZeRO-1" if extra.get("zero1") else "") + (" SP" if extra.get("sequence_parallel")
                                                                         else "")
        mib = 1 << 20
        rows.append(f"| tiny {name.capitalize()} | {kind} | {ckpt} | 2 x 32, {lp.micro_steps} | "
                    f"{lp.layout.tp}x{lp.layout.pp}x{lp.layout.fsdp}x{lp.layout.dp} | {m['analytic_peak']:,} | "
                    f"{m['peak_allocated']:,} | {m['memory_error']:+.1%} | {m['analytic_reserved'] // mib} / "
                    f"{m['peak_reserved'] // mib} MiB | {'exact' if m['comm_exact'] else 'DIFFERENT'}: {comm} |")
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--measured", action="store_true", help="also rerun the measured agreement table")
    parser.add_argument("--json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_plan_") as tmp:
        result: dict[str, Any] = {"speed": speed(args.rounds, Path(tmp))}
        print(f"8B + 70B: {result['speed']['8B + 70B']:.2f} s wall (target: under 10 s)")
        if args.measured:
            result["measured"] = measured_table(Path(tmp))
    report(result, args.json)


if __name__ == "__main__":
    main()
