"""One architecture, checked: a tiny random model on CPU (the reference) and on neuron, eager and compiled.

This module is also the worker the report runs it in (``python -m
torch_neuronx.testing.hf_compat.check --worker``, tasks through
torch_neuronx.testing.workers), so that a crash or a hang costs one row.
"""

from __future__ import annotations

import argparse
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from torch_neuronx.testing.hf_compat.configs import VOCAB, model_class, tiny_config

PROMPT_LEN = 8
NEW_TOKENS = 8
# fp32 tiny models: the kernels are the CPU's, so differences are rounding from
# different blocking/fusion at most; anything above this is a real mismatch.
ATOL = 1e-4


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
        from torch_neuronx.compile import metrics as compile_metrics

        metrics = compile_metrics.snapshot()
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


def _serve(compiled_mode: str, threads: int) -> None:
    """The worker: a {"model": type, "compiled": bool} task gives a Row; {"ping": true} says whether it compiles."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from torch_neuronx.testing.workers import serve

    torch.set_num_threads(threads)
    if compiled_mode == "on":
        import torch_neuronx.compile  # noqa: F401  (registers the backend explicitly)
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    compiled = compiled_mode != "off" and "neuron" in torch._dynamo.list_backends()

    def handle(task: dict[str, Any], emit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        if task.get("ping"):
            return {"compiled": compiled}
        try:
            return run_one(task["model"], compiled and task["compiled"])
        except BaseException as exc:  # a row, not a lost worker
            return asdict(Row(task["model"], category="harness error", failure=_short(exc)))

    serve(handle)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true", required=True)
    parser.add_argument("--compiled", choices=["auto", "on", "off"], default="auto")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    _serve(args.compiled, args.threads)
