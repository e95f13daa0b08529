"""``plan --serve --measure``: run the real model through each planned bucket on the emulated device.

Why it exists: a serving plan's promises -- one compiled graph per bucket, no
recompilation in steady state, the same tokens as the reference, the HBM it
estimated, an out-of-memory bucket named rather than a crash -- are checked
here on a real Hugging Face model (a local directory's weights, or the
config built on the spot with seeded random weights).

Per bucket (context length c, token-generation length g): a static KV cache
of g slots, a prefill of c prompt tokens (the logits of the last token only,
as Neuron's stacks compute them), then greedy decode steps, in fp32 (exact
tokens; the estimate is taken at 4-byte elements); on CPU (the
reference), on the neuron device eagerly, and under
``torch.compile(backend="neuron", dynamic=False)`` (static shapes, as
Neuron compiles). Host times are the emulator's, not Trainium's. The model
runs Transformers' eager attention: the CPU's SDPA kernel would upcast the
whole bf16 cache to fp32 at each decode step, an emulator artefact no Neuron
attention kernel has, which would spoil the memory comparison.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any

from torch_neuronx.tools.plan import serve, serve_buckets
from torch_neuronx.tools.plan.layouts import PlanError
from torch_neuronx.tools.plan.model import ModelSpec, load

REPEATS = 3  # timed steady-state runs per bucket after the compiling one


def build_model(model: Any, dtype: Any) -> Any:
    """The model to run: a directory's weights when it has them, else its config with seeded random weights."""
    import torch
    from transformers import AutoModelForCausalLM

    path = Path(str(model)) if isinstance(model, str | Path) else None
    if path is not None and path.is_dir() and any(path.glob("*.safetensors")):
        return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation="eager").eval()
    config = model if hasattr(model, "to_dict") else load(model).transformers_config()
    if config is None:
        raise PlanError("--measure needs a config.json with model_type (or a model directory) to build the model")
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="eager").eval()


def _cache(config: Any, spec: ModelSpec, batch: int, length: int, dtype: Any, device: Any) -> Any:
    from transformers import StaticCache

    cache = StaticCache(config=config, max_cache_len=length)
    cache.early_initialization(batch, spec.kv_heads, spec.head_dim, dtype, device)
    return cache


def _generate(fwd: Any, config: Any, spec: ModelSpec, ids: Any, cache_len: int, steps: int,
              timings: list[float] | None) -> Any:
    """Context encoding of `ids` into a static cache of the prompt's length (its own graph: it does not depend on
    the token-generation bucket), the cache copied into one of `cache_len` slots, then `steps` greedy decode steps
    (one graph per `cache_len`); the tokens."""
    import torch

    device, (batch, prompt) = ids.device, ids.shape
    dtype = next(p for p in fwd.parameters()).dtype if hasattr(fwd, "parameters") else torch.bfloat16
    context = _cache(config, spec, batch, prompt, dtype, device)
    tokens = []
    with torch.no_grad():
        start = time.perf_counter()
        out = fwd(input_ids=ids, cache_position=torch.arange(prompt, device=device), past_key_values=context,
                  use_cache=True, logits_to_keep=1)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        tokens.append(token.cpu())
        if timings is not None:
            timings.append(time.perf_counter() - start)
        cache = _cache(config, spec, batch, cache_len, dtype, device)
        for src, dst in zip(context.layers, cache.layers, strict=True):
            dst.keys[:, :, :prompt].copy_(src.keys)
            dst.values[:, :, :prompt].copy_(src.values)
            dst.cumulative_length.fill_(prompt)
        del context
        for i in range(steps):
            start = time.perf_counter()
            out = fwd(input_ids=token, cache_position=torch.tensor([prompt + i], device=device),
                      past_key_values=cache, use_cache=True, logits_to_keep=1)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            tokens.append(token.cpu())
            if timings is not None:
                timings.append(time.perf_counter() - start)
    return torch.cat(tokens, dim=1)


def _ms(values: list[float]) -> dict[str, float]:
    return {"p50": 1e3 * serve_buckets.percentile(values, 50), "p99": 1e3 * serve_buckets.percentile(values, 99)}


def measure_plan(model: Any, plan: dict[str, Any], *, decode_steps: int = 4, dtype: Any = None) -> dict[str, Any]:
    """Run every bucket pair of `plan` (its batch size, one core) and compare with CPU and the estimate."""
    import torch

    import torch_neuronx.compile as ncompile

    dtype = dtype or torch.float32  # exact greedy tokens against CPU (bf16 kernels round differently once fused)
    element = torch.empty((), dtype=dtype).element_size()
    cpu_model = build_model(model, dtype)
    spec: ModelSpec = load(cpu_model.config)
    device = torch.device("neuron", 0)
    torch._dynamo.reset()  # graphs of earlier models (and the weights they hold) go
    ncompile.reset_dynamo_metrics()
    gc.collect()
    torch.neuron.synchronize()
    baseline = torch.neuron.memory_allocated()  # what this process holds already: not this model's
    dev_model = build_model(model, dtype).to(device)
    torch.neuron.synchronize()
    model_bytes = torch.neuron.memory_allocated() - baseline
    compiled = torch.compile(dev_model, backend="neuron", dynamic=False)
    batch = plan["batch"]
    pairs = [(b["context_length"], b["generation_length"]) for b in plan["buckets"]]
    results = []
    generator = torch.Generator().manual_seed(0)
    for c, g in pairs:
        steps = max(0, min(decode_steps, g - c - 1))
        ids = torch.randint(4, spec.vocab, (batch, c), generator=generator)
        estimate = serve.memory(spec, _one_core(), 1, batch, g, c, "fp32" if element == 4 else "bf16", reserve=0,
                                element=element)
        entry: dict[str, Any] = {"context_length": c, "generation_length": g, "decode_steps": steps,
                                 "estimate_bytes": estimate.total, "kv_cache_bytes": estimate.kv_cache}
        reference = _generate(cpu_model, cpu_model.config, spec, ids, g, steps, None)
        gc.collect()
        torch.neuron.synchronize()
        # earlier buckets' caches that their compiled graphs still hold (Dynamo keeps static-address inputs alive):
        # not this bucket's memory
        held = torch.neuron.memory_allocated() - baseline - model_bytes
        torch.neuron.reset_peak_memory_stats()
        try:
            eager = _generate(dev_model, dev_model.config, spec, ids.to(device), g, steps, None)
        except torch.OutOfMemoryError:
            free, total = torch.neuron.mem_get_info()
            entry.update(status="OOM", message=f"out of memory: the KV cache of {g} slots x batch {batch} needs "
                         f"{estimate.kv_cache:,} bytes; the core has {total:,} bytes ({free:,} free)")
            results.append(entry)
            continue
        peak = torch.neuron.max_memory_allocated() - baseline - held
        graphs_before = len(ncompile.get_dynamo_metrics())
        first: list[float] = []
        start = time.perf_counter()
        tokens = _generate(compiled, dev_model.config, spec, ids.to(device), g, steps, first)
        first_run = time.perf_counter() - start
        compiled_graphs = len(ncompile.get_dynamo_metrics()) - graphs_before
        steady: list[float] = []
        prefill: list[float] = []
        for _ in range(REPEATS):
            run: list[float] = []
            again = _generate(compiled, dev_model.config, spec, ids.to(device), g, steps, run)
            prefill.append(run[0])
            steady += run[1:]
            if not torch.equal(again, tokens):
                raise RuntimeError("the compiled model gave different tokens on a repeat run")
        recompiles = len(ncompile.get_dynamo_metrics()) - graphs_before - compiled_graphs
        entry.update(status="ok", tokens_equal_cpu_eager=bool(torch.equal(eager, reference)),
                     tokens_equal_cpu_compiled=bool(torch.equal(tokens, reference)), graphs_compiled=compiled_graphs,
                     steady_state_recompiles=recompiles, peak_bytes=peak, held_by_earlier_graphs=held,
                     peak_over_estimate=peak / estimate.total,
                     emulator_prefill_ms=_ms(prefill), emulator_decode_ms=_ms(steady) if steady else None,
                     emulator_compile_s=max(0.0, first_run - sum(prefill) / len(prefill) - sum(steady) / REPEATS))
        results.append(entry)
    return {"buckets": results, "graphs_compiled": len(ncompile.get_dynamo_metrics()),
            "planned_compile_count": plan["compile_count"],
            "note": "host times on the emulator (CPU kernels), not Trainium times; memory on one emulated core"}


def _one_core() -> Any:
    """The emulated machine's hardware (one core, its configured HBM) for the estimate."""
    from torch_neuronx import runtime
    from torch_neuronx.tools.plan.layouts import hardware

    machine = runtime.machine()
    return hardware(machine.instance.name)


def measured_table(measured: dict[str, Any]) -> str:
    lines = ["Measured on the emulated device (host time, not Trainium time):",
             f"{'ctx':>6} {'gen':>6} {'status':>6} {'graphs':>6} {'recomp':>6} {'=CPU':>9} {'peak MiB':>9} "
             f"{'est MiB':>8} {'ratio':>5} {'prefill p50/p99 ms':>19} {'decode p50/p99 ms':>18} {'compile s':>9}"]
    for b in measured["buckets"]:
        if b["status"] != "ok":
            lines.append(f"{b['context_length']:>6} {b['generation_length']:>6} {b['status']:>6}  {b['message']}")
            continue
        same = "yes" if b["tokens_equal_cpu_eager"] and b["tokens_equal_cpu_compiled"] else "NO"
        decode = b["emulator_decode_ms"] or {"p50": 0.0, "p99": 0.0}
        lines.append(f"{b['context_length']:>6} {b['generation_length']:>6} {'ok':>6} {b['graphs_compiled']:>6} "
                     f"{b['steady_state_recompiles']:>6} {same:>9} {b['peak_bytes'] / 2**20:>9.1f} "
                     f"{b['estimate_bytes'] / 2**20:>8.1f} {b['peak_over_estimate']:>5.2f} "
                     f"{b['emulator_prefill_ms']['p50']:>9.1f}/{b['emulator_prefill_ms']['p99']:<9.1f} "
                     f"{decode['p50']:>8.1f}/{decode['p99']:<9.1f} {b['emulator_compile_s']:>9.2f}")
    lines.append(f"graphs compiled in all: {measured['graphs_compiled']} "
                 f"(planned: {measured['planned_compile_count']})")
    return "\n".join(lines)
