"""Print and plot a serving plan: per bucket and for the traffic mix, with the reasons for its choices.

Why it exists: ``serve_plan`` returns data; a person reads a table. Plots
(TTFT per context bucket, TPOT per token-generation bucket, HBM per core)
need matplotlib and are skipped without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

GIB = 1 << 30


def _gib(n: float) -> str:
    return f"{n / GIB:.2f}"


def table(plan: dict[str, Any]) -> str:
    lines = [f"Serving plan: {plan['model']} on {plan['instance']} (LNC={plan['lnc']}), TP={plan['tp']}, "
             f"batch {plan['batch']}, {plan['precision']} compute, {plan['weights']} weights, "
             f"{plan['requests']} request shape(s)",
             f"  TP: {plan['why_tp']}" + (f"; {', '.join(plan['padded'])}" if plan["padded"] else ""),
             f"  buckets: context {plan['context_buckets']}, token generation {plan['generation_buckets']} -- "
             f"{plan['why_buckets']}",
             f"  compiled graphs: {plan['compile_count']} per batch size; padding waste: "
             f"{100 * plan['padding_waste']['context']:.1f}% of prompt tokens, "
             f"{100 * plan['padding_waste']['generation']:.1f}% of cache slots",
             "",
             f"{'ctx':>7} {'gen':>7} {'reqs':>6} {'TTFT ms':>9} {'TPOT ms':>8} {'out tok/s':>10} "
             f"{'weights':>8} {'KV':>7} {'act':>6} {'rsv':>5} {'total':>7} {'HBM':>6}  fits  (GiB per core)"]
    for b in plan["buckets"]:
        h = b["hbm"]
        lines.append(f"{b['context_length']:>7} {b['generation_length']:>7} {b['requests']:>6} "
                     f"{b['ttft_ms']['p50']:>9.1f} {b['tpot_ms']['p50']:>8.2f} {b['output_tokens_per_s']:>10.1f} "
                     f"{_gib(h['weights']):>8} {_gib(h['kv_cache']):>7} {_gib(h['activations']):>6} "
                     f"{_gib(h['runtime_reserve']):>5} {_gib(h['total']):>7} {_gib(h['capacity']):>6}  "
                     f"{'yes' if b['fits'] else 'NO (OOM)'}")
    slo = plan["slo"]
    lines += ["",
              f"traffic mix: TTFT p50 {plan['ttft_ms']['p50']:.1f} ms, p99 {plan['ttft_ms']['p99']:.1f} ms; "
              f"TPOT p50 {plan['tpot_ms']['p50']:.2f} ms, p99 {plan['tpot_ms']['p99']:.2f} ms; "
              f"{plan['output_tokens_per_s']:.1f} output tokens/s per replica, {plan['replicas_per_instance']} "
              f"replica(s) per instance = {plan['output_tokens_per_s_per_instance']:.1f} tokens/s per instance; "
              f"fits: {'yes' if plan['fits'] else 'NO'}"]
    if slo["ttft_p99_ms"] is not None or slo["tpot_p99_ms"] is not None:
        targets = [f"{what} <= {slo[key]:g} ms" for what, key in (("TTFT", "ttft_p99_ms"), ("TPOT", "tpot_p99_ms"))
                   if slo[key] is not None]
        lines.append(f"SLO (p99 {', '.join(targets)}): {'met' if plan['slo_met'] else 'NOT met'}")
    if len(plan["tp_search"]) > 1:
        lines.append("TP search: " + "; ".join(
            f"TP={r['tp']} TTFT p99 {r['ttft_ms']['p99']:.0f} ms, TPOT p99 {r['tpot_ms']['p99']:.1f} ms, "
            f"{r['output_tokens_per_s_per_instance']:.0f} tok/s/instance{'' if r['fits'] else ' (does not fit)'}"
            for r in plan["tp_search"]))
    lines.append(f"({plan['note']})")
    if "measured" in plan:
        from torch_neuronx.tools.plan.serve_measure import measured_table

        lines += ["", measured_table(plan["measured"])]
    return "\n".join(lines)


def write_plots(plan: dict[str, Any], folder: str | Path) -> list[Path]:
    """serve_latency.png and serve_hbm.png in `folder` (empty list without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    buckets = plan["buckets"]
    labels = [f"{b['context_length']}/{b['generation_length']}" for b in buckets]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.bar(labels, [x["ttft_ms"]["p50"] for x in buckets])
    a.set(title="TTFT per bucket (ms)", xlabel="context / generation bucket")
    b.bar(labels, [x["tpot_ms"]["p50"] for x in buckets], color="tab:orange")
    b.set(title="TPOT per bucket (ms)", xlabel="context / generation bucket")
    fig.tight_layout()
    latency = out / "serve_latency.png"
    fig.savefig(latency)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    bottom = [0.0] * len(buckets)
    for key in ("weights", "kv_cache", "activations", "runtime_reserve"):
        values = [x["hbm"][key] / GIB for x in buckets]
        ax.bar(labels, values, bottom=bottom, label=key)
        bottom = [s + v for s, v in zip(bottom, values, strict=True)]
    ax.axhline(buckets[0]["hbm"]["capacity"] / GIB, color="red", linestyle="--", label="HBM per core")
    ax.set(title="HBM per core (GiB)", xlabel="context / generation bucket")
    ax.legend()
    fig.tight_layout()
    hbm = out / "serve_hbm.png"
    fig.savefig(hbm)
    plt.close(fig)
    return [latency, hbm]
