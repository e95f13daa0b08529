"""The checker's report: terminal text, the JSON document for CI, and a self-contained HTML page with plots.

The plots (matplotlib, rendered to PNG and embedded, so the page is one
file): step time per rank over steps with compile events on the same axis,
device memory per core over steps against the core's capacity, and the loss
against the reference run.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import Any

from torch_neuronx.runtime.config import format_bytes

MARK = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "info": "info"}


def text(doc: dict[str, Any]) -> str:
    lines = [f"torch-neuronx check: {MARK[doc['verdict']]}   ({' '.join(doc['command'])})"]
    if doc.get("interrupted"):
        lines.append(f"INTERRUPTED by {doc['interrupted']}: what was seen until then")
    if doc["reference_command"]:
        lines.append(f"reference: {' '.join(doc['reference_command'])}")
    for name, layer in doc["layers"].items():
        lines.append(f"\n{name:<13} {MARK[layer['verdict']]}")
        for e in layer["evidence"]:
            lines.append(f"  [{MARK[e['verdict']]}] {e['message']}")
            if e["verdict"] == "fail" and e.get("log_tail"):
                tail = e["log_tail"].strip().splitlines()[-8:]
                lines.extend("        | " + t for t in tail)
    lines.append("")
    for r in doc["ranks"]:
        st = r["step_time_s"]
        timing = f", steady step p50 {st['p50'] * 1e3:.1f} ms" if st else ""
        mem = ", ".join(f"neuron:{m['device']} {format_bytes(m['peak'])}" for m in r["memory"]) or "-"
        lines.append(f"rank {r['rank']}: {r['status']}, {r['steps']} steps ({r['warmup_steps']} warm-up){timing}, "
                     f"compile {r['compile_seconds']:.1f} s, peak memory {mem}")
    return "\n".join(lines)


def finite(obj: Any) -> Any:
    """`obj` with every NaN or infinite float replaced by null, and a sibling ``<key>_nonfinite`` string ("nan",
    "inf", "-inf"; for a list, index -> string) saying what it was: strict JSON parsers reject the bare NaN
    token (docs/check.md#json-schema)."""
    def word(x: float) -> str:
        return "nan" if x != x else ("inf" if x > 0 else "-inf")

    def bad(x: Any) -> bool:
        return isinstance(x, float) and (x != x or x in (float("inf"), float("-inf")))

    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            if bad(v):
                out[k], out[f"{k}_nonfinite"] = None, word(v)
            elif isinstance(v, list) and any(bad(x) for x in v):
                out[k] = [None if bad(x) else finite(x) for x in v]
                out[f"{k}_nonfinite"] = {str(i): word(x) for i, x in enumerate(v) if bad(x)}
            else:
                out[k] = finite(v)
        return out
    if isinstance(obj, (list, tuple)):
        return [None if bad(x) else finite(x) for x in obj]
    return None if bad(obj) else obj


def write_json(doc: dict[str, Any], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(finite(doc), indent=1, default=str, allow_nan=False))


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def _axes() -> tuple[Any, Any]:
    """A plain Figure (no pyplot state: the caller's matplotlib backend is left alone) and its axes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 3.2))
    return fig, fig.subplots()


def figures(doc: dict[str, Any]) -> dict[str, str]:
    """Title -> base64 PNG."""
    steps = doc["steps"]
    ranks = sorted({s["rank"] for s in steps})
    out: dict[str, str] = {}
    if not steps:
        return out
    fig, ax = _axes()
    for r in ranks:
        mine = [s for s in steps if s["rank"] == r and s["duration_s"] is not None]
        ax.plot([s["step"] for s in mine], [s["duration_s"] * 1e3 for s in mine], marker=".", label=f"rank {r}")
    compiled = sorted({s["step"] for s in steps if s["compiled_graphs"]})
    for i, step in enumerate(compiled):
        ax.axvline(step, color="tab:red", alpha=0.35, linestyle="--", label="compile" if i == 0 else None)
    ax.set(xlabel="step", ylabel="step time (ms)", yscale="log", title="Step time, with compile events")
    ax.legend(fontsize=7)
    out["Step time and compilation"] = _png(fig)

    fig, ax = _axes()
    capacity = None
    for r in ranks:
        per_core: dict[int, list[tuple[int, int, int]]] = {}
        for s in steps:
            if s["rank"] != r:
                continue
            for m in s["memory"]:
                per_core.setdefault(m["device"], []).append((s["step"], m["allocated"], m["peak"]))
                capacity = m["capacity"]
        for core, pts in per_core.items():
            ax.plot([p[0] for p in pts], [p[2] / 2**20 for p in pts], label=f"rank {r} neuron:{core} peak")
            ax.plot([p[0] for p in pts], [p[1] / 2**20 for p in pts], linestyle=":", label=f"rank {r} allocated")
    if capacity:
        ax.axhline(capacity / 2**20, color="black", linewidth=1, label="core capacity")
        ax.set_yscale("log")
    ax.set(xlabel="step", ylabel="MiB", title="Device memory per core")
    ax.legend(fontsize=7)
    out["Device memory per core"] = _png(fig)

    if any(s["loss"] is not None for s in steps):
        fig, ax = _axes()
        for r in ranks:
            mine = [s for s in steps if s["rank"] == r and s["loss"] is not None]
            ax.plot([s["step"] for s in mine], [s["loss"] for s in mine], marker=".", label=f"rank {r} neuron")
            ref = [s for s in mine if s["reference_loss"] is not None]
            if ref:
                ax.plot([s["step"] for s in ref], [s["reference_loss"] for s in ref], linestyle="--",
                        label=f"rank {r} reference")
        ax.set(xlabel="step", ylabel="loss", title="Loss against the reference")
        ax.legend(fontsize=7)
        out["Loss against the reference"] = _png(fig)
    return out


def write_html(doc: dict[str, Any], path: str | Path) -> None:
    rows = []
    for name, layer in doc["layers"].items():
        items = "".join(f"<li class='{e['verdict']}'><b>{MARK[e['verdict']]}</b> {html.escape(e['message'])}</li>"
                        for e in layer["evidence"])
        rows.append(f"<tr><td>{name}</td><td class='{layer['verdict']}'>{MARK[layer['verdict']]}</td>"
                    f"<td><ul>{items}</ul></td></tr>")
    plots = "".join(f"<h2>{html.escape(t)}</h2><img alt='{html.escape(t)}' src='data:image/png;base64,{b}'>"
                    for t, b in figures(doc).items())
    interrupted = (f"<p class='fail'><b>Interrupted by {html.escape(doc['interrupted'])}</b>: what was seen until "
                   "then</p>" if doc.get("interrupted") else "")
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>torch-neuronx check</title>
<style>body{{font-family:sans-serif;max-width:1000px;margin:2em auto}} td{{vertical-align:top;padding:4px}}
.pass{{color:#176f2c}} .info{{color:#555}} .warn{{color:#9a6700}} .fail{{color:#b00020}} ul{{margin:0}}</style>
</head><body><h1>torch-neuronx check: <span class="{doc['verdict']}">{MARK[doc['verdict']]}</span></h1>
<p><code>{html.escape(' '.join(doc['command']))}</code></p>{interrupted}
<table><tr><th>layer</th><th>verdict</th><th>evidence</th></tr>{''.join(rows)}</table>{plots}
</body></html>"""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(page)
