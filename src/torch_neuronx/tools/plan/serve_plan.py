"""Plan a model's serving: for each TP degree, buckets, TTFT/TPOT p50/p99, throughput and HBM per core.

Why it exists: it joins the traffic (``serve_traffic``), the buckets
(``serve_buckets``) and the per-bucket physics (``serve``) into the answer a
serving team needs before renting: which TP and batch, which buckets, what
latency at p50 and p99, what fits. A request pays its buckets' latency: the
TTFT of its context bucket and the TPOT of its token-generation bucket, at
the planned batch size (every slot busy), so the traffic's percentiles are
percentiles over requests.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from torch_neuronx.tools.plan import serve, serve_buckets
from torch_neuronx.tools.plan.layouts import Hardware, PlanError, hardware
from torch_neuronx.tools.plan.model import ModelSpec, load

MAX_BATCH = 4096


def _ms(values: Sequence[float]) -> dict[str, float]:
    return {"p50": 1e3 * serve_buckets.percentile(values, 50), "p99": 1e3 * serve_buckets.percentile(values, 99)}


def evaluate(m: ModelSpec, hw: Hardware, tp: int, batch: int, traffic: Sequence[tuple[int, int]],
             buckets: serve_buckets.Buckets, weights: str, capacity: int | None = None,
             factors: serve.Factors | None = None) -> dict[str, Any]:
    """The plan at one TP degree: per bucket pair and for the whole traffic mix."""
    ttft = {c: serve.ttft_seconds(m, hw, tp, batch, c, weights, factors) for c in buckets.context}
    tpot = {g: serve.tpot_seconds(m, hw, tp, batch, g, weights, factors) for g in buckets.generation}
    pairs = Counter((serve_buckets.pick(buckets.context, p), serve_buckets.pick(buckets.generation, p + o))
                    for p, o in traffic)
    outputs: dict[tuple[int, int], int] = Counter()
    for p, o in traffic:
        outputs[(serve_buckets.pick(buckets.context, p), serve_buckets.pick(buckets.generation, p + o))] += o
    entries = []
    for (c, g), n in sorted(pairs.items()):
        mem = serve.memory(m, hw, tp, batch, g, c, weights, capacity)
        busy = n * ttft[c] + (outputs[(c, g)] - n) * tpot[g]  # seconds a slot spends on these requests
        entries.append({"context_length": c, "generation_length": g, "requests": n,
                        "ttft_ms": {"p50": 1e3 * ttft[c], "p99": 1e3 * ttft[c]},
                        "tpot_ms": {"p50": 1e3 * tpot[g], "p99": 1e3 * tpot[g]},
                        "output_tokens_per_s": batch * outputs[(c, g)] / busy, "fits": mem.fits,
                        "hbm": mem.as_dict()})
    request_ttft = [ttft[serve_buckets.pick(buckets.context, p)] for p, _ in traffic]
    request_tpot = [tpot[serve_buckets.pick(buckets.generation, p + o)] for p, o in traffic]
    busy = sum(t + (o - 1) * d for t, d, (_, o) in zip(request_ttft, request_tpot, traffic, strict=True))
    tokens_per_s = batch * sum(o for _, o in traffic) / busy
    replicas = hw.cores_per_instance // tp
    worst = max(entries, key=lambda e: e["hbm"]["total"])
    return {"tp": tp, "padded": serve.padded(m, tp), "ttft_ms": _ms(request_ttft), "tpot_ms": _ms(request_tpot),
            "output_tokens_per_s": tokens_per_s, "replicas_per_instance": replicas,
            "output_tokens_per_s_per_instance": replicas * tokens_per_s, "fits": all(e["fits"] for e in entries),
            "hbm_per_core": worst["hbm"], "buckets": entries}


def _slo_met(result: dict[str, Any], slo_ttft_ms: float | None, slo_tpot_ms: float | None) -> bool:
    return (slo_ttft_ms is None or result["ttft_ms"]["p99"] <= slo_ttft_ms) and \
        (slo_tpot_ms is None or result["tpot_ms"]["p99"] <= slo_tpot_ms)


def plan_serving(model: Any, instance: str, traffic: Sequence[tuple[int, int]], *, tp: int | None = None,
                 batch: int = 1, buckets: Sequence[int] | None = None, max_buckets: int = 4,
                 precision: str = "bf16", weights: str = "bf16", slo_ttft_ms: float | None = None,
                 slo_tpot_ms: float | None = None, lnc: int | None = None,
                 capacity: int | None = None) -> dict[str, Any]:
    """The serving plan as a JSON-ready dict (docs/serve.md describes every key)."""
    if precision not in serve.PRECISIONS:
        raise PlanError(f"--precision {precision!r}: choose one of {', '.join(serve.PRECISIONS)}")
    if weights not in ("bf16", "int8"):
        raise PlanError(f"--weights {weights!r}: choose bf16 or int8")
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
        raise PlanError(f"--batch must be a whole number from 1 to {MAX_BATCH}, got {batch!r}")
    if not 1 <= max_buckets <= 64:
        raise PlanError(f"--max-buckets must be from 1 to 64, got {max_buckets}")
    for flag, value in (("--slo-ttft-ms", slo_ttft_ms), ("--slo-tpot-ms", slo_tpot_ms)):
        if value is not None and not 0 < value < 1e9:
            raise PlanError(f"{flag} must be a positive number of milliseconds, got {value}")
    m = model if isinstance(model, ModelSpec) else load(model)
    hw = hardware(instance, 1, lnc)
    check_positions(m, traffic, buckets)
    if buckets:
        chosen = serve_buckets.given(buckets, traffic)
    else:
        chosen = serve_buckets.choose(traffic, max_buckets)
    if tp is not None:
        problems = serve.tp_problems(m, hw, tp) or [p for p in [serve.unsupported_tp(hw, tp)] if p]
        if problems:
            raise PlanError(f"--tp {tp}: {problems[0]}")
        candidates = [tp]
    else:
        candidates = serve.supported_tp_degrees(m, hw)
        if not candidates:
            raise PlanError(f"no TP degree the Neuron stacks support on a {instance} serves {m.name}'s {m.heads} "
                            "heads; give --tp")
    results = [evaluate(m, hw, t, batch, traffic, chosen, weights, capacity) for t in candidates]
    for r in results:
        r["slo_met"] = _slo_met(r, slo_ttft_ms, slo_tpot_ms)
    best = _best(results, slo_ttft_ms, slo_tpot_ms)
    waste = serve_buckets.padding_waste(traffic, chosen)
    shape = {"hidden_size": m.hidden, "num_hidden_layers": m.layers, "num_attention_heads": m.heads,
             "vocab_size": m.vocab}  # `check --buckets-from` compares it with --hf-model's config.json
    return {"model": m.name, "model_shape": shape, "instance": instance, "lnc": hw.lnc, "batch": batch,
            "precision": precision, "weights": weights, "requests": len(traffic),
            "context_buckets": list(chosen.context),
            "generation_buckets": list(chosen.generation), "why_buckets": chosen.why,
            "compile_count": chosen.compile_count, "padding_waste": waste,
            "slo": {"ttft_p99_ms": slo_ttft_ms, "tpot_p99_ms": slo_tpot_ms}, **best,
            "why_tp": _why_tp(best, results, tp is not None),
            "tp_search": [{k: r[k] for k in ("tp", "ttft_ms", "tpot_ms", "output_tokens_per_s_per_instance", "fits",
                                             "slo_met")} for r in results],
            "note": "estimates from a roofline fitted to AWS's published Inf2 tables (docs/serve.md), not measurements"}


def check_positions(m: ModelSpec, traffic: Sequence[tuple[int, int]], buckets: Sequence[int] | None) -> None:
    """Refuse requests and buckets longer than the model's position embeddings (max_position_embeddings): the
    model cannot attend that far (NxD Inference and Transformers NeuronX refuse such a sequence length too)."""
    limit = m.max_positions or class_default_positions(m)
    if not limit:
        return
    prompt = max(p for p, _ in traffic)
    if prompt > limit:
        raise PlanError(f"a prompt of {prompt} tokens is longer than {m.name}'s max_position_embeddings={limit}")
    total = max(p + o for p, o in traffic)
    if total > limit:
        raise PlanError(f"a request needs {total} tokens (prompt + output) but {m.name}'s "
                        f"max_position_embeddings is {limit}: shorten the output or the prompt")
    if buckets and max(buckets) > limit:
        raise PlanError(f"--buckets: bucket {max(buckets)} is longer than {m.name}'s max_position_embeddings={limit}")


def class_default_positions(m: ModelSpec) -> int:
    """A config.json without max_position_embeddings gets its Transformers config class's default when the model is
    loaded (LlamaConfig: 2048), so that is its limit; 0 when the model type is unknown (nothing is checked)."""
    model_type = (m.raw or {}).get("model_type") if isinstance(m.raw, dict) else getattr(m.config, "model_type", None)
    if m.config is not None and hasattr(m.config, "get_text_config"):  # a transformers config: defaults filled in
        value = getattr(m.config.get_text_config(), "max_position_embeddings", None)
        return value if isinstance(value, int) and value > 0 else 0
    if not isinstance(model_type, str):
        return 0
    try:
        from transformers import AutoConfig

        value = getattr(AutoConfig.for_model(model_type).get_text_config(), "max_position_embeddings", None)
    except Exception:  # noqa: BLE001 - a model type this transformers does not know
        return 0
    return value if isinstance(value, int) and value > 0 else 0


def _slo_excess(result: dict[str, Any], slo_ttft_ms: float | None, slo_tpot_ms: float | None) -> float:
    """How far the worse of the two p99s is above its target, as a ratio (<= 1 when both are met)."""
    ratios = [result[key]["p99"] / target for key, target in (("ttft_ms", slo_ttft_ms), ("tpot_ms", slo_tpot_ms))
              if target is not None]
    return max(ratios, default=1.0)


def _best(results: list[dict[str, Any]], slo_ttft_ms: float | None = None,
          slo_tpot_ms: float | None = None) -> dict[str, Any]:
    """The fitting, SLO-meeting TP with the most output tokens per second per instance; when none meets the SLOs,
    the fitting one closest to them (the smallest ratio of p99 to target); else the one that needs least HBM."""
    met = [r for r in results if r["fits"] and r["slo_met"]]
    if met:
        return max(met, key=lambda r: r["output_tokens_per_s_per_instance"])
    fitting = [r for r in results if r["fits"]]
    if fitting:
        return min(fitting, key=lambda r: (_slo_excess(r, slo_ttft_ms, slo_tpot_ms),
                                           -r["output_tokens_per_s_per_instance"]))
    return min(results, key=lambda r: r["hbm_per_core"]["total"] - r["hbm_per_core"]["capacity"])


def _why_tp(best: dict[str, Any], results: list[dict[str, Any]], given: bool) -> str:
    tried = ", ".join(str(r["tp"]) for r in results)
    if given:
        return f"given: TP={best['tp']}"
    if not best["fits"]:
        return f"no TP degree fits ({tried} tried); TP={best['tp']} comes closest"
    if not best["slo_met"]:
        return f"no degree meets the SLOs ({tried} tried); TP={best['tp']} fits and comes closest to them"
    return f"TP={best['tp']} fits and meets the SLOs with the most output tokens/s per instance, of {tried}"
