"""Which transformers causal-LM architectures run on the neuron device, and do they match CPU?

    python scripts/hf_compat_report.py [--subset ci|all] [--models llama,gpt2] [--compiled auto|on|off]
                                       [--timeout 180] [--out-dir build/hf_compat]

For every model type in transformers' ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` a
tiny random model is built from its config (generic tiny sizes, with
per-architecture overrides where the generic ones do not build), then the
same weights run a forward pass and a greedy ``generate`` on CPU (the
reference) and on neuron eager; where the ``"neuron"`` compile backend is
registered, also ``generate(cache_implementation="static")``, which
transformers auto-compiles with that backend. Nothing is downloaded.

Each architecture runs in a worker process with a per-model timeout: a crash
or a hang costs one row, the worker is restarted and the run goes on. Writes
``hf_compat.json`` and ``hf_compat.md`` under ``--out-dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Representative families: Llama-likes (RoPE, GQA, RMSNorm), learned/ALiBi
# positions, parallel attention/MLP blocks, partial rotary, tied embeddings.
CI_SUBSET = ["llama", "mistral", "mixtral", "qwen2", "gpt2", "gpt_neox", "phi", "gemma", "opt", "bloom"]

VOCAB = 256
PROMPT_LEN = 8
NEW_TOKENS = 8
# fp32 tiny models: the kernels are the CPU's, so differences are rounding from
# different blocking/fusion at most; anything above this is a real mismatch.
ATOL = 1e-4

# Generic tiny sizes. A key is applied only where the architecture's config
# has that attribute (directly or through its attribute_map), so one table
# serves naming schemes from GPT-2 (n_embd) to DeepSeek (kv_lora_rank).
GENERIC: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "n_positions": 256,
    # encoder-decoder families used as decoder-only causal LMs
    "d_model": 64,
    "decoder_layers": 2,
    "encoder_layers": 2,
    "decoder_attention_heads": 4,
    "encoder_attention_heads": 4,
    "decoder_ffn_dim": 128,
    "encoder_ffn_dim": 128,
    "ffn_dim": 128,
    "d_ff": 128,
    "n_inner": 128,
    # mixture of experts
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 64,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    # multi-head latent attention
    "kv_lora_rank": 16,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    # state-space / recurrent blocks
    "state_size": 8,
    "mamba_d_state": 8,
    "mamba_n_heads": 4,
    "mamba_d_head": 32,
    "mamba_head_dim": 32,
    "ssm_state_size": 8,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "attention_hidden_size": 64,
    "vocab_size_per_layer_input": VOCAB,
    "hidden_size_per_layer_input": 16,
    "rotary_dim": 8,
    "partial_rotary_factor": 0.5,
    "sliding_window": 32,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

# Architecture-specific tiny settings, applied over GENERIC; None removes a
# generic key for that architecture (its config derives the value itself).
OVERRIDES: dict[str, dict[str, Any]] = {
    "mamba": {"head_dim": None},
    "mamba2": {"num_heads": 4, "head_dim": 32, "n_groups": 1, "expand": 2},
    "falcon_mamba": {"head_dim": None},
    "falcon_h1": {"mamba_d_ssm": 128, "mamba_chunk_size": 16},
    "reformer": {"axial_pos_shape": [16, 16], "axial_pos_embds_dim": [32, 32], "attn_layers": ["local", "lsh"],
                 "local_attn_chunk_length": 8, "lsh_attn_chunk_length": 8, "num_buckets": 4, "hidden_size": 64,
                 "feed_forward_size": 128, "attention_head_size": 16, "max_position_embeddings": 256,
                 "is_decoder": True},
    "xlnet": {"d_head": 16, "max_position_embeddings": None},  # no length limit: setting it raises
    "prophetnet": {"num_hidden_layers": None, "num_encoder_layers": 2, "num_decoder_layers": 2},
    "ctrl": {"n_embd": 64, "dff": 128},
    "bigbird_pegasus": {"attention_type": "original_full"},
    "big_bird": {"attention_type": "original_full"},
    "recurrent_gemma": {"lru_width": 64, "block_types": ["recurrent", "attention"], "attention_window_size": 32},
    "xmod": {"default_language": "en_XX"},
    "xlstm": {"embedding_dim": 64, "num_blocks": 2, "num_heads": 4, "chunk_size": 8, "qk_dim_factor": 1.0},
    # Hybrid stacks: the two tiny layers must include an attention layer.
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1},
    "bamba": {"attn_layer_indices": [1]},
    "zamba": {"num_hidden_layers": 4, "attn_layer_period": 2, "attn_layer_offset": 1, "attention_hidden_size": 128,
              "attention_head_dim": 32, "mamba_expand": 2},
    "zamba2": {"hybrid_layer_ids": [1], "attention_hidden_size": 128, "attention_head_dim": 32},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
    "zaya": {"num_experts_per_tok": 1},
    "gemma3n_text": {"num_kv_shared_layers": 0, "vocab_size_per_layer_input": VOCAB,
                     "hidden_size_per_layer_input": 16},
    "gemma4_assistant": {"hidden_size_per_layer_input": 0},
    "cohere_compass_text": {"partial_rotary_factor": None,
                            "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    # Sparse-attention indexers; their attention wants as many KV heads as query heads.
    "deepseek_v32": {"index_head_dim": 16, "index_n_heads": 4, "index_topk": 8, "num_key_value_heads": 4},
    "glm_moe_dsa": {"index_head_dim": 16, "index_n_heads": 4, "index_topk": 8, "num_key_value_heads": 4},
    "axk2": {"index_head_dim": 16, "index_n_heads": 4, "index_topk": 8, "num_key_value_heads": 4},
    "qwen4_exp_text": {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16, "indexer_budget": 8,
                       "indexer_compress_ratio": 2},
    "dots3_note_text": {"num_key_value_heads": 4},
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"]},
    "musicgen": {"num_codebooks": 2},
    "musicgen_melody": {"num_codebooks": 2},
    "dbrx": {"d_model": 64, "n_heads": 4, "n_layers": 2, "max_seq_len": 256,
             "attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
             "ffn_config": {"ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2}},
    "blt": {"encoder_hash_byte_group_vocab": 512, "max_position_embeddings": 256},
}


@dataclass
class Row:
    architecture: str
    cpu_ok: bool = False
    eager_pass: bool | None = None
    compiled_pass: bool | None = None
    max_abs_diff: float | None = None
    compiled_max_abs_diff: float | None = None
    eager_wall_s: float | None = None
    compiled_wall_s: float | None = None
    peak_mib: float | None = None
    compiled_peak_mib: float | None = None
    category: str = ""
    failure: str = ""
    graphs: int | None = None  # graphs compiled by generate(); cache hits count too
    graph_breaks: int | None = None
    recompilations: int | None = None
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------
# Inside the worker process
# ----------------------------------------------------------------------------


def tiny_config(model_type: str) -> Any:
    """A tiny config of `model_type`: GENERIC sizes (where the config has the attribute) plus OVERRIDES."""
    # The causal-LM class's own config class: for composite families (MusicGen)
    # it is the decoder's config, not the one AutoConfig returns for the type.
    explicit = OVERRIDES.get(model_type, {})
    config_class = model_class(model_type).config_class
    try:
        default = config_class()
    except Exception:  # a few defaults do not validate on their own (gemma4_assistant)
        default = config_class(**explicit)
    kwargs = _size_kwargs(default, explicit)
    # Composite configs (text + vision/audio towers, DBRX's attn/ffn parts): the
    # towers are built with the model even when only text is fed, so shrink them too.
    for name in getattr(default, "sub_configs", {}) or {}:
        sub = getattr(default, name, None)
        if sub is not None and name not in explicit:
            kwargs[name] = _shrink_sub(sub)
    return _build(type(default), kwargs, default)


def model_class(model_type: str) -> Any:
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])


def _size_kwargs(config: Any, explicit: dict[str, Any]) -> dict[str, Any]:
    wanted = {**GENERIC, **explicit}
    # Read-only properties (FalconConfig.head_dim) are derived: setting them raises.
    kwargs = {k: v for k, v in wanted.items()
              if v is not None and (k in explicit or (_has(config, k) and not _is_property(config, k)))}
    # Multi-head latent attention: the rotary part of a head is qk_rope_head_dim wide.
    if "qk_rope_head_dim" in kwargs and "head_dim" in kwargs and "head_dim" not in explicit:
        kwargs["head_dim"] = kwargs["qk_rope_head_dim"]
    return kwargs


def _shrink_sub(sub: Any) -> Any:
    # Start from the composite's own defaults for the tower (image size, patch
    # size, projector shapes must stay consistent), change only the sizes.
    depth = getattr(sub, "num_hidden_layers", None)
    base = {k: v for k, v in sub.to_dict().items() if k not in ("model_type", "transformers_version", "architectures")}
    base = {k: v for k, v in base.items() if not (isinstance(v, list) and isinstance(depth, int) and len(v) == depth)}
    kwargs = _size_kwargs(sub, OVERRIDES.get(getattr(sub, "model_type", ""), {}))
    try:
        return type(sub)(**{**base, **kwargs})
    except Exception:
        return _build(type(sub), kwargs, sub)


def _build(cls: Any, kwargs: dict[str, Any], default: Any) -> Any:
    try:
        layers = getattr(default, "num_hidden_layers", None)
    except RuntimeError:
        layers = None
    # Per-layer lists of the default depth (layer_types, MLP kinds, block
    # patterns) are cut to the tiny depth keeping one layer of each kind: a
    # list recomputed for 2 layers would often keep only the linear/SSM kind.
    cuts = {k: v for k, v in _cut_layer_lists(default, layers, kwargs.get("num_hidden_layers")).items()
            if k not in kwargs}
    for attempt in ({**kwargs, **cuts}, kwargs):
        try:
            return cls(**attempt)
        except Exception as exc:
            error = exc
    raise error


def _has(config: Any, name: str) -> bool:
    try:
        getattr(config, name)
    except AttributeError:
        return False
    except RuntimeError:
        # Per-layer configs (heterogeneous stacks) refuse a global read of a
        # per-layer attribute: it exists, and a global value sets every layer.
        return True
    return True


def _is_property(config: Any, name: str) -> bool:
    attr = getattr(type(config), name, None)
    return isinstance(attr, property) and attr.fset is None


def _cut_layer_lists(config: Any, old: int | None, new: int | None) -> dict[str, Any]:
    if not isinstance(old, int) or not isinstance(new, int):
        return {}
    return {k: _sample_pattern(v, new) for k, v in vars(config).items()
            if isinstance(v, list) and len(v) == old and k != "architectures"}


def _sample_pattern(values: list[Any], n: int) -> list[Any]:
    """n entries of a per-layer list keeping its variety (a hybrid stack keeps one layer of each kind)."""
    distinct: list[Any] = []
    for v in values:
        if v not in distinct:
            distinct.append(v)
    if len(distinct) >= n:
        return distinct[:n]
    return values[: n - len(distinct)] + distinct


def _logits(out: Any) -> Any:
    import torch

    t = out.logits if hasattr(out, "logits") else out[0]
    return t if isinstance(t, torch.Tensor) else t[0]


def _short(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {msg}"[:240]


def run_one(model_type: str, compiled: bool) -> dict[str, Any]:
    """Build, run and compare one architecture; returns a Row as a dict."""
    import copy

    import torch

    row = Row(model_type)
    # CPU reference first: an architecture whose tiny model does not run on CPU
    # says nothing about the device, and is reported apart.
    try:
        config = tiny_config(model_type)
        torch.manual_seed(0)
        model = model_class(model_type)(config).eval()
        vocab = min(int(getattr(config, "vocab_size", VOCAB) or VOCAB), VOCAB)
        ids = torch.randint(3, vocab, (2, PROMPT_LEN), generator=torch.Generator().manual_seed(1))
        gen_kwargs: dict[str, Any] = {"max_new_tokens": NEW_TOKENS, "min_new_tokens": NEW_TOKENS,
                                      "do_sample": False, "pad_token_id": 0}
        with torch.no_grad():
            ref_logits = _logits(model(ids)).float()
            ref_tokens = model.generate(ids, attention_mask=torch.ones_like(ids), **gen_kwargs)
        row.cpu_ok = True
    except Exception as exc:
        row.category = "cpu: tiny model does not build/run"
        row.failure = _short(exc)
        return asdict(row)

    dev = torch.device("neuron:0")
    torch.neuron.empty_cache()
    torch.neuron.reset_peak_memory_stats()
    start = time.perf_counter()
    try:
        model_n = copy.deepcopy(model).to(dev)
        with torch.no_grad():
            logits = _logits(model_n(ids.to(dev))).float().cpu()
            row.max_abs_diff = float((logits - ref_logits).abs().max())
            tokens = model_n.generate(ids.to(dev), attention_mask=torch.ones_like(ids, device=dev), **gen_kwargs).cpu()
        row.eager_wall_s = time.perf_counter() - start
        row.peak_mib = torch.neuron.max_memory_allocated() / 2**20
        same_tokens = torch.equal(tokens, ref_tokens)
        row.eager_pass = row.max_abs_diff <= ATOL and same_tokens
        if not row.eager_pass:
            row.category = "neuron: output differs from CPU"
            row.failure = f"max |logits diff| {row.max_abs_diff:.3g}, tokens equal: {same_tokens}"
    except Exception as exc:
        row.eager_pass = False
        row.category = "neuron eager: " + type(exc).__name__
        row.failure = _short(exc)
        row.notes.append(traceback.format_exc(limit=-3))
        return asdict(row)

    if compiled:
        _run_compiled(row, model, model_n, ids, gen_kwargs)
    return asdict(row)


def _run_compiled(row: Row, model: Any, model_n: Any, ids: Any, gen_kwargs: dict[str, Any]) -> None:
    import torch

    torch._dynamo.reset()
    dev = torch.device("neuron:0")
    static = {**gen_kwargs, "cache_implementation": "static"}
    try:
        with torch.no_grad():
            # The reference is CPU eager with the same static cache (CPU never auto-compiles).
            ref = model.generate(ids, attention_mask=torch.ones_like(ids), disable_compile=True, **static)
    except Exception as exc:
        row.notes.append("compiled: n/a, static cache unsupported on CPU: " + _short(exc))
        return
    torch.neuron.reset_peak_memory_stats()
    torch.neuron.reset_dynamo_metrics()
    start = time.perf_counter()
    try:
        with torch.no_grad():
            out = model_n.generate(ids.to(dev), attention_mask=torch.ones_like(ids, device=dev), **static).cpu()
        row.compiled_wall_s = time.perf_counter() - start
        row.compiled_peak_mib = torch.neuron.max_memory_allocated() / 2**20
        metrics = torch.neuron.get_dynamo_metrics()
        row.graphs = metrics["graphs_compiled"]
        row.graph_breaks = metrics["graph_breaks"]["count"]
        row.recompilations = metrics["recompilations"]
        if not row.graphs:
            # generate() declined to compile (cache or model not compileable): nothing was tested.
            row.notes.append("compiled: n/a, generate() did not compile")
            return
        row.compiled_pass = torch.equal(out, ref)
        if not row.compiled_pass:
            row.category = row.category or "neuron compiled: output differs from CPU"
            row.failure = row.failure or "static-cache generate tokens differ from CPU"
    except Exception as exc:
        row.compiled_pass = False
        row.category = row.category or "neuron compiled: " + type(exc).__name__
        row.failure = row.failure or _short(exc)
        row.notes.append(traceback.format_exc(limit=-3))
    finally:
        torch._dynamo.reset()


RESULT_TAG = "@@hf_compat_result@@ "


def worker_main(compiled_mode: str, threads: int) -> None:
    """Reads "model_type 0|1" (1: also compiled) lines from stdin; writes one tagged JSON result line each."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(threads)
    if compiled_mode == "on":
        import torch_neuronx.compile  # noqa: F401  (registers the backend explicitly)
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    compiled = compiled_mode != "off" and "neuron" in torch._dynamo.list_backends()
    print(RESULT_TAG + json.dumps({"ready": True, "compiled": compiled}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        model_type, want_compiled = line.split()
        try:
            result = run_one(model_type, compiled and want_compiled == "1")
        except BaseException as exc:  # keep the worker alive for the next architecture
            result = asdict(Row(model_type, category="harness error", failure=_short(exc)))
        print(RESULT_TAG + json.dumps(result), flush=True)


# ----------------------------------------------------------------------------
# In the parent process
# ----------------------------------------------------------------------------


class Worker:
    """A worker subprocess; answers with tagged JSON lines read by a thread, so waits can time out."""

    def __init__(self, compiled_mode: str, threads: int) -> None:
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", "--compiled", compiled_mode,
             "--threads", str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, bufsize=1,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(RESULT_TAG):
                self.lines.put(line[len(RESULT_TAG):])
        self.lines.put(None)  # end of stream: the process died

    def ask(self, model_type: str | None, timeout: float, compiled: bool = True) -> dict[str, Any] | None:
        """Sends a model type (None: only wait for the ready line); None back means crash or timeout."""
        if model_type is not None:
            assert self.proc.stdin is not None
            self.proc.stdin.write(f"{model_type} {int(compiled)}\n")
            self.proc.stdin.flush()
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            return None
        return None if line is None else json.loads(line)

    def stderr_tail(self) -> str:
        self.log.seek(0)
        lines = [ln for ln in self.log.read().splitlines() if ln.strip()]
        return lines[-1][:240] if lines else ""

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.log.close()


def run_report(models: list[str], compiled_mode: str = "auto", timeout: float = 180.0, threads: int = 1,
               progress: bool = False, compile_budget_s: float | None = None,
               compile_only: set[str] | None = None) -> tuple[list[dict[str, Any]], bool]:
    """Runs every model type; returns (rows, whether compiled runs were done).

    compile_budget_s: once the run has taken this long, the remaining
    architectures run eager only (compiling costs tens of seconds each).
    compile_only: compile just these architectures (the others eager only).
    """
    rows: list[dict[str, Any]] = []
    worker: Worker | None = None
    compiled = False
    run_start = time.perf_counter()
    for model_type in models:
        if worker is None:
            worker = Worker(compiled_mode, threads)
            ready = worker.ask(None, timeout=300)
            if ready is None:
                raise RuntimeError("hf_compat_report worker did not start: " + worker.stderr_tail())
            compiled = bool(ready["compiled"])
        start = time.perf_counter()
        in_budget = compile_budget_s is None or start - run_start < compile_budget_s
        selected = compile_only is None or model_type in compile_only
        result = worker.ask(model_type, timeout, compiled=in_budget and selected)
        if result is None:
            crashed = worker.proc.poll() is not None
            tail = worker.stderr_tail()
            worker.close()
            worker = None
            result = asdict(Row(model_type, category="worker crashed" if crashed else f"timeout ({timeout:.0f} s)",
                                failure=tail if crashed else ""))
        result["total_s"] = time.perf_counter() - start
        if compiled and not in_budget:
            result["notes"].append("compiled: not run (time budget)")
        rows.append(result)
        if progress:
            print(f"{model_type:28s} cpu={result['cpu_ok']!s:5s} eager={result['eager_pass']!s:5s} "
                  f"compiled={result['compiled_pass']!s:5s} {result['category']} {result['failure'][:100]}",
                  flush=True)
    if worker is not None:
        worker.close()
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
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker_main(args.compiled, args.threads)
        return 0
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
