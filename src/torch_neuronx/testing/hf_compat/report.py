"""The compatibility report: every architecture checked in a worker process, summarised as JSON and Markdown.

    python scripts/hf_compat_report.py [--subset ci|all] [--models llama,gpt2] [--compiled auto|on|off]
                                       [--timeout 180] [--out-dir build/hf_compat]

For every model type in transformers' ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` a
tiny random model is built from its config (:mod:`.configs`), then the same
weights run a forward pass and a greedy ``generate`` on CPU (the reference)
and on neuron eager; where the ``"neuron"`` compile backend is registered,
also ``generate(cache_implementation="static")``, which transformers
auto-compiles with that backend (:mod:`.check`). Nothing is downloaded.

Each architecture runs in a worker process with a per-model timeout: a crash
or a hang costs one row, the worker is restarted and the run goes on. Writes
``hf_compat.json`` and ``hf_compat.md`` under ``--out-dir``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

from torch_neuronx.testing.hf_compat.check import Row
from torch_neuronx.testing.hf_compat.configs import CI_SUBSET
from torch_neuronx.testing.workers import WorkerPool


def run_report(models: list[str], compiled_mode: str = "auto", timeout: float = 180.0, threads: int = 1,
               progress: bool = False, compile_budget_s: float | None = None,
               compile_only: set[str] | None = None) -> tuple[list[dict[str, Any]], bool]:
    """Runs every model type; returns (rows, whether compiled runs were done).

    compile_budget_s: once the run has taken this long, the remaining
    architectures run eager only (compiling costs tens of seconds each).
    compile_only: compile just these architectures (the others eager only).
    """
    argv = [sys.executable, "-X", "faulthandler", "-m", "torch_neuronx.testing.hf_compat.check", "--worker",
            "--compiled", compiled_mode, "--threads", str(threads)]
    rows: list[dict[str, Any]] = []
    run_start = time.perf_counter()
    with WorkerPool(argv, stall_timeout=timeout) as pool:
        ready = pool.run({"ping": True}, timeout=300)
        if not ready.ok:
            raise RuntimeError(f"hf_compat worker did not start ({ready.message}): {ready.stderr_tail[-500:]}")
        compiled = bool(ready.value["compiled"])
        for model_type in models:
            start = time.perf_counter()
            in_budget = compile_budget_s is None or start - run_start < compile_budget_s
            selected = compile_only is None or model_type in compile_only
            result = pool.run({"model": model_type, "compiled": in_budget and selected}, timeout)
            if result.ok:
                row = result.value
            else:
                lines = [ln for ln in result.stderr_tail.splitlines() if ln.strip()]
                category = "worker crashed" if result.status == "crash" else f"timeout ({timeout:.0f} s)"
                row = asdict(Row(model_type, category=category,
                                 failure=(lines[-1][:240] if lines and result.status == "crash" else
                                          result.message[:240])))
            row["total_s"] = time.perf_counter() - start
            if compiled and not in_budget:
                row["notes"].append("compiled: not run (time budget)")
            rows.append(row)
            if progress:
                print(f"{model_type:28s} cpu={row['cpu_ok']!s:5s} eager={row['eager_pass']!s:5s} "
                      f"compiled={row['compiled_pass']!s:5s} {row['category']} {row['failure'][:100]}", flush=True)
    return rows, compiled


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    cpu_ok = [r for r in rows if r["cpu_ok"]]
    return {
        "architectures": len(rows),
        "cpu_ok": len(cpu_ok),
        "eager_pass": sum(1 for r in cpu_ok if r["eager_pass"]),
        "compiled_tried": sum(1 for r in cpu_ok if r["compiled_pass"] is not None),
        "compiled_pass": sum(1 for r in cpu_ok if r["compiled_pass"]),
        "compiled_na": sum(1 for r in cpu_ok if any(n.startswith("compiled: n/a") for n in r["notes"])),
        "compiled_not_run": sum(1 for r in cpu_ok if r["eager_pass"] and any("time budget" in n for n in r["notes"])),
        "categories": dict(Counter(r["category"] for r in rows if r["category"]).most_common()),
    }


def _fmt(value: Any, spec: str = ".3g") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    return format(value, spec)


def to_markdown(rows: list[dict[str, Any]], compiled: bool) -> str:
    s = summarize(rows)
    lines = [
        f"{s['architectures']} architectures; tiny model runs on CPU: {s['cpu_ok']}; "
        f"neuron eager matches CPU: {s['eager_pass']}/{s['cpu_ok']}; "
        + (f"compiled (static cache) matches: {s['compiled_pass']}/{s['compiled_tried']} tried "
           f"({s['compiled_na']} n/a, {s['compiled_not_run']} not run: time budget)."
           if compiled else "compiled: not run (backend \"neuron\" not registered)."),
        "",
        "| architecture | eager pass | compiled pass | max abs diff | wall s (neuron, incl. compile) "
        "| peak device MiB | failure reason |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        wall = (r["eager_wall_s"] or 0) + (r["compiled_wall_s"] or 0) if r["eager_wall_s"] is not None else None
        compiled_cell = _fmt(r["compiled_pass"])
        if any(n.startswith("compiled: n/a") for n in r["notes"]):
            compiled_cell = "n/a"  # generate() declined to compile, or no static cache for it on CPU
        elif any("time budget" in n for n in r["notes"]) and r["eager_pass"]:
            compiled_cell = "not run"
        reason = f"{r['category']}: {r['failure']}" if r["category"] else ""
        reason = reason.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r['architecture']} | {_fmt(r['eager_pass'])} | {compiled_cell} "
                     f"| {_fmt(r['max_abs_diff'])} | {_fmt(wall, '.2f')} | {_fmt(r['peak_mib'], '.1f')} | {reason} |")
    lines += ["", "Failure categories: " + ", ".join(f"{k}: {v}" for k, v in s["categories"].items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subset", choices=["ci", "all"], default="all")
    parser.add_argument("--models", help="comma-separated model types (overrides --subset)")
    parser.add_argument("--compiled", choices=["auto", "on", "off"], default="auto",
                        help="auto: compiled runs if the 'neuron' backend is registered by `import torch`; "
                             "on: import torch_neuronx.compile to register it")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per architecture")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--compile-budget", type=float, help="seconds; after that, eager only")
    parser.add_argument("--out-dir", default="build/hf_compat")
    parser.add_argument("--render", metavar="JSON", help="only rewrite the Markdown from a saved hf_compat.json")
    args = parser.parse_args(argv)
    if args.render:
        saved = json.loads(Path(args.render).read_text())
        print(to_markdown(saved["rows"], saved["summary"]["compiled_run"]), end="")
        return 0

    if args.models:
        models = args.models.split(",")
    elif args.subset == "ci":
        models = CI_SUBSET
    else:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        # The CI subset first: under --compile-budget it is the part that gets compiled.
        models = CI_SUBSET + [m for m in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES if m not in CI_SUBSET]
    start = time.perf_counter()
    rows, compiled = run_report(models, args.compiled, args.timeout, args.threads, progress=True,
                                compile_budget_s=args.compile_budget)
    rows.sort(key=lambda r: r["architecture"])
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(rows) | {"compiled_run": compiled, "wall_s": time.perf_counter() - start}
    (out / "hf_compat.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    (out / "hf_compat.md").write_text(to_markdown(rows, compiled))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
