"""transformers' generate() with a static cache auto-compiles with backend "neuron": once, for all steps."""

from __future__ import annotations

import torch
from compile_models import tiny_llama

from torch_neuronx.compile import metrics


def test_static_cache_generate_compiles_once(dev: torch.device) -> None:
    model = tiny_llama().to(dev).eval()
    ids = torch.randint(1, 256, (1, 8), device=dev)
    kwargs = {"max_new_tokens": 50, "min_new_tokens": 50, "do_sample": False, "pad_token_id": 0}
    out = model.generate(ids, cache_implementation="static", **kwargs)
    m = metrics.snapshot()
    assert out.shape == (1, 58)
    # transformers picked backend "neuron" itself (CompileConfig(backend="neuron", dynamic=False)).
    assert m["graphs_compiled"] == 1, m["functions"]
    assert m["recompilations"] == 0, m["recompile_reasons"]
    ref = model.generate(ids, disable_compile=True, **kwargs)
    torch.testing.assert_close(out, ref)
