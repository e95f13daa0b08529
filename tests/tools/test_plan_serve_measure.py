"""``plan --serve --measure``: a tiny Llama and a tiny Qwen2 through three token-generation buckets on the device.

References: the CPU run of the same model and cache (greedy tokens, token for
token), the plan's compile count (one graph per context bucket and per
token-generation bucket), the plan's own HBM estimate, and the allocator's
out-of-memory error for a cache larger than the core.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from torch_neuronx.tools.plan.serve_measure import measure_plan, measured_table
from torch_neuronx.tools.plan.serve_plan import plan_serving

SIZES = {"vocab_size": 128, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 1,
         "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 1024,
         "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 3}
TRAFFIC = [(8, 60), (8, 250), (8, 500)]  # one context bucket, three token-generation buckets


def _config_dir(tmp: Path, kind: str, **fields: int) -> Path:
    from transformers import LlamaConfig, Qwen2Config

    config = (LlamaConfig if kind == "llama" else Qwen2Config)(**{**SIZES, **fields})
    config.save_pretrained(tmp / kind)
    return tmp / kind / "config.json"


@pytest.mark.slow  # four Inductor compilations per model: 40-60 s each (cold cache) on a loaded 2-core machine
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_measure_matches_cpu_and_the_plan(kind: str, tmp_path: Path) -> None:
    model = _config_dir(tmp_path, kind)
    plan = plan_serving(model, "trn1.2xlarge", TRAFFIC, tp=1, batch=2, max_buckets=3)
    assert plan["context_buckets"] == [8] and plan["generation_buckets"] == [68, 258, 508]
    measured = measure_plan(model, plan, decode_steps=2)
    assert measured["graphs_compiled"] == plan["compile_count"] == 4, measured_table(measured)
    for b in measured["buckets"]:
        assert b["status"] == "ok"
        assert b["tokens_equal_cpu_eager"] and b["tokens_equal_cpu_compiled"], b
        assert b["steady_state_recompiles"] == 0
        assert b["peak_bytes"] >= b["kv_cache_bytes"]
        assert b["emulator_compile_s"] >= 0 and b["emulator_decode_ms"]["p99"] >= b["emulator_decode_ms"]["p50"]
        assert b["peak_over_estimate"] == pytest.approx(1.0, abs=0.1), measured_table(measured)


def test_a_cache_larger_than_the_core_is_an_oom_entry(tmp_path: Path) -> None:
    import torch

    model = _config_dir(tmp_path, "llama", max_position_embeddings=1 << 17)  # room for 70,008 positions
    plan = plan_serving(model, "trn1.2xlarge", [(8, 70_000)], tp=1, batch=2, max_buckets=1)
    with torch.neuron.memory.override_hbm_capacity(32 << 20):
        measured = measure_plan(model, plan, decode_steps=1)
    (entry,) = measured["buckets"]
    kv = 2 * 1 * 2 * 70_008 * 2 * 64 * 4  # K and V, 1 layer, batch 2, 70,008 slots, 2 heads of 64, fp32
    assert entry["status"] == "OOM" and entry["kv_cache_bytes"] == kv
    assert f"{kv:,} bytes" in entry["message"] and "OOM" in measured_table(measured)
