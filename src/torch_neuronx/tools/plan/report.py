"""Show a plan: a terminal table, a JSON file, and plots (PNG files and one self-contained HTML page).

Plots use matplotlib with the Agg backend (no display needed): memory per
core by kind against the capacity line, estimated step time split into
compute and exposed communication, and padding waste by policy.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

from torch_neuronx.runtime.config import format_bytes

GIB = 1 << 30
MEMORY_KINDS = ("params", "grads", "optimizer", "activations", "buffers")
_SCOPE = {"chip": "chip", "neuronlink": "NL", "efa": "EFA"}


def _layout_name(d: dict[str, Any]) -> str:
    return f"{d['tp']}x{d.get('pp', 1)}x{d['fsdp']}x{d['dp']}"


def table(data: dict[str, Any]) -> str:
    """The plan as text: one row per layout, best first, then padding policies and the estimate's caveat."""
    hw, s = data["hardware"], data["settings"]
    n = data["model"]["parameters"]
    size = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n:,}"
    extras = [k for k, on in (("ZeRO-1", s.get("zero1")), ("sequence parallel", s.get("sequence_parallel"))) if on]
    lines = [f"{data['model']['name']}: {size} parameters on {hw['instances']} x "
             f"{hw['instance']} (LNC={hw['lnc']}, {hw['cores']} cores, {format_bytes(hw['hbm_per_core'])} HBM each, "
             f"{format_bytes(s.get('hbm_reserve', 0))} of it kept by the Neuron runtime); "
             f"global batch {s['global_batch']} x {s['seq_len']} tokens, micro-batch {s['micro_batch']}, "
             f"{s['precision']}, checkpointing {s['checkpointing']}, {s['optimizer']}"
             + "".join(f", {e}" for e in extras),
             f"{'#':>3} {'TPxPPxFSDPxDP':>13} {'fits':>4} {'allocated':>10} {'reserved':>10} {'params':>9} "
             f"{'optim':>9} {'activ':>9} {'comm/step':>10} {'links':<26} {'step s':>8} {'exposed':>7} "
             f"{'bubble':>7} {'tok/s':>9}"]
    for i, d in enumerate(data["layouts"], 1):
        m = d["memory_per_core"]
        comm_bytes = sum(c["bytes"] for c in d["comm_per_step"])
        scopes = " ".join(f"{g}:{_SCOPE[sc]}" for g, sc in sorted({(c["group"], c["scope"])
                                                                    for c in d["comm_per_step"]})) or "-"
        t = d["step_time_s"]
        lines.append(f"{i:>3} {_layout_name(d):>13} {'yes' if d['fits'] else 'NO':>4} {format_bytes(m['total']):>10} "
                     f"{format_bytes(m.get('reserved', m['total'])):>10} {format_bytes(m['params']):>9} "
                     f"{format_bytes(m['optimizer']):>9} "
                     f"{format_bytes(m['activations']):>9} {format_bytes(comm_bytes):>10} {scopes:<26} "
                     f"{t['total']:>8.3f} {t['exposed_comm']:>7.3f} {t.get('pipeline_bubble', 0.0):>7.3f} "
                     f"{t['tokens_per_s']:>9.0f}")
        if not d["fits"]:
            lines.append(f"{'':>17} does not fit: {d['reason']}")
        if "measured" in d:
            ms = d["measured"]
            lines.append(f"{'':>17} measured: peak {format_bytes(ms['peak_allocated'])} "
                         f"(analytic {ms['memory_error']:+.1%}), reserved {format_bytes(ms['peak_reserved'])} "
                         f"(estimate {ms.get('reserved_error', 0.0):+.1%}), comm bytes "
                         f"{'exact' if ms['comm_exact'] else 'DIFFER'}")
    if data.get("padding"):
        lines.append(f"padding policies over {data['padding']['lengths']} sequences:")
        for p in data["padding"]["policies"]:
            lines.append(f"  {p['name']:<20} {p['graphs']:>3} graph(s)  waste {p['waste']:>6.1%}  throughput x"
                         f"{p['throughput_factor']:.3f}  buckets={p['buckets']}")
    lines.append("allocated / reserved: estimated peak per core of the busiest pipeline stage (fits: reserved + "
                 "128 MiB fragmentation margin + the runtime's share <= HBM); comm/step: bytes per core as comm_stats "
                 "counts them; links: chip = inside a chip, NL = NeuronLink, EFA = across instances; exposed: "
                 "communication not hidden behind compute; bubble: pipeline fill and drain (1F1B)")
    lines += [f"note: {n}" for n in data["notes"]]
    return "\n".join(lines)


def write_json(data: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(data, indent=2))
    return path


def figures(data: dict[str, Any]) -> dict[str, Any]:
    """The plots as matplotlib figures, by name (plain Figures: no pyplot state, the caller's backend untouched)."""
    from matplotlib.figure import Figure

    layouts = data["layouts"]
    names = [_layout_name(d) for d in layouts]
    out = {}
    fig = Figure(figsize=(max(6, len(names) * 0.6), 4))
    ax = fig.subplots()
    bottom = [0.0] * len(names)
    for kind in MEMORY_KINDS:
        values = [d["memory_per_core"][kind] / GIB for d in layouts]
        ax.bar(names, values, bottom=bottom, label=kind)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.scatter(names, [d["memory_per_core"]["total"] / GIB for d in layouts], color="black", marker="_", s=300,
               zorder=3, label="estimated peak")
    ax.axhline(data["hardware"]["hbm_per_core"] / GIB, color="black", linestyle="--", label="HBM per core")
    ax.set(ylabel="GiB per core", xlabel="TP x PP x FSDP x DP",
           title="Memory per core")
    ax.tick_params(axis="x", rotation=45)
    ax.legend(fontsize=7)
    out["memory"] = fig
    fig = Figure(figsize=(max(6, len(names) * 0.6), 4))
    ax = fig.subplots()
    compute = [d["step_time_s"]["compute"] for d in layouts]
    ax.bar(names, compute, label="compute")
    ax.bar(names, [d["step_time_s"]["exposed_comm"] for d in layouts], bottom=compute, label="exposed communication")
    ax.set(ylabel="seconds per step (estimate)", xlabel="TP x PP x FSDP x DP", title="Estimated step time")
    ax.tick_params(axis="x", rotation=45)
    ax.legend(fontsize=7)
    out["step_time"] = fig
    if data.get("padding"):
        pols = data["padding"]["policies"]
        fig = Figure(figsize=(6, 3.5))
        ax = fig.subplots()
        ax.bar([p["name"] for p in pols], [100 * p["waste"] for p in pols])
        for i, p in enumerate(pols):
            ax.text(i, 100 * p["waste"], f"{p['graphs']} graph(s)", ha="center", va="bottom", fontsize=8)
        ax.set(ylabel="padding, % of computed tokens", title="Padding waste by policy")
        out["padding"] = fig
    return out


def write_plots(data: dict[str, Any], directory: str | Path) -> list[Path]:
    """PNG files of the plots and ``plan.html`` embedding them; returns the paths written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written, images = [], []
    for name, fig in figures(data).items():
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
        (directory / f"{name}.png").write_bytes(buf.getvalue())
        written.append(directory / f"{name}.png")
        images.append(f'<img alt="{name}" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">')
    html = directory / "plan.html"
    text = table(data).replace("&", "&amp;").replace("<", "&lt;")
    html.write_text("<!doctype html><meta charset=utf-8><title>torch-neuronx plan</title>"
                    f"<pre>{text}</pre>{''.join(images)}")
    return [*written, html]
