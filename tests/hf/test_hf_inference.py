"""transformers inference on neuron, unmodified: from_pretrained(device_map=...) and generate() match CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import torch_neuronx.compile

GREEDY: dict[str, Any] = {"max_new_tokens": 12, "min_new_tokens": 12, "do_sample": False}


def _prompt(path: Path) -> dict[str, torch.Tensor]:
    tok = AutoTokenizer.from_pretrained(path)
    # Two rows of different lengths: left padding and the attention mask take part.
    tok.padding_side = "left"
    return dict(tok(["the cat sat on", "dog ran to park bird flew"], return_tensors="pt", padding=True))


def _generate(model: Any, inputs: dict[str, torch.Tensor], **kwargs: Any) -> torch.Tensor:
    inputs = {k: v.to(model.device) for k, v in inputs.items()}
    with torch.no_grad():
        return model.generate(**inputs, **GREEDY, **kwargs).cpu()


_DETECT = textwrap.dedent("""
    import torch  # nothing else: autoload must make the device and the backend visible to the libraries
    import accelerate.utils.imports, transformers.utils
    from accelerate import PartialState
    from accelerate.utils import DynamoBackend
    assert transformers.utils.is_torch_neuron_available(check_device=True)
    assert accelerate.utils.imports.is_neuron_available(check_device=True)
    assert PartialState().device == torch.device("neuron"), PartialState().device
    assert DynamoBackend("NEURON").value == "NEURON" and "neuron" in torch._dynamo.list_backends()
    print("ok", torch._utils._get_available_device_type(), torch.neuron.get_device_properties(0).name)
""")


def test_libraries_detect_neuron_after_plain_import_torch() -> None:
    """The libraries' own detection (find_spec + torch.neuron.is_available(), lru_cached) sees the device."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    proc = subprocess.run([sys.executable, "-c", _DETECT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["ok", "neuron", "trn2"], proc.stdout


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("device_map", ["neuron", {"": "neuron"}, 0], ids=["str", "dict", "index"])
def test_from_pretrained_device_map_generate_matches_cpu(tiny_llama_dir: Path, device_map: Any,
                                                         dtype: torch.dtype) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, device_map=device_map, dtype=dtype)
    ref = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=dtype)
    # device_map=0 means "accelerator 0", which is neuron:0 on this machine.
    assert model.device == torch.device("neuron:0")
    assert {p.device for p in model.parameters()} == {torch.device("neuron:0")}
    assert model.dtype == dtype
    inputs = _prompt(tiny_llama_dir)
    out = _generate(model, inputs)
    assert out.shape == (2, inputs["input_ids"].shape[1] + GREEDY["max_new_tokens"])
    assert torch.equal(out, _generate(ref, inputs))


def test_forward_logits_match_cpu(tiny_llama_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, device_map="neuron")
    ref = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    inputs = _prompt(tiny_llama_dir)
    with torch.no_grad():
        got = model(**{k: v.to("neuron") for k, v in inputs.items()}).logits
        want = ref(**inputs).logits
    assert got.device.type == "neuron"
    torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1e-5)


def test_static_cache_eager_matches_cpu(tiny_llama_dir: Path) -> None:
    """The static cache's index_copy_ / in-place cache updates, without compiling."""
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, device_map="neuron")
    ref = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    inputs = _prompt(tiny_llama_dir)
    out = _generate(model, inputs, cache_implementation="static", disable_compile=True)
    assert torch.equal(out, _generate(ref, inputs))


def _cpu_compiled_reference(ref: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The same static-cache generate compiled on CPU: Inductor's C++ code for the host, as neuron's backend uses."""
    from transformers import CompileConfig

    config = CompileConfig(backend="inductor", fullgraph=True, dynamic=False)
    config._compile_all_devices = True  # transformers auto-compiles on accelerators only
    return _generate(ref, inputs, cache_implementation="static", compile_config=config)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_static_cache_generate_auto_compiles_and_matches_cpu(tiny_llama_dir: Path, dtype: torch.dtype) -> None:
    """transformers compiles the decode step itself on neuron (CompileConfig(backend="neuron"))."""
    torch._dynamo.reset()
    torch.neuron.reset_dynamo_metrics()
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, device_map="neuron", dtype=dtype)
    ref = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=dtype)
    inputs = _prompt(tiny_llama_dir)
    out = _generate(model, inputs, cache_implementation="static")
    metrics = torch_neuronx.compile.metrics.snapshot()
    assert metrics["graphs_compiled"] >= 1, metrics
    assert metrics["recompilations"] == 0, metrics
    # Compiled bf16 rounds once per fused kernel, eager once per op, so near-ties in bf16 can flip a token
    # between compiled and eager on any device: the reference is the same compiled code on CPU, bit for bit.
    torch._dynamo.reset()
    assert torch.equal(out, _cpu_compiled_reference(ref, inputs))
    if dtype == torch.float32:
        assert torch.equal(out, _generate(ref, inputs, cache_implementation="static", disable_compile=True))
    torch._dynamo.reset()


def test_static_cache_100_token_decode_does_not_recompile(tiny_llama_dir: Path) -> None:
    """One warm-up generate compiles the graphs; a 100-token decode after it compiles nothing more."""
    torch._dynamo.reset()
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, device_map="neuron")
    ref = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    long = {"max_new_tokens": 100, "min_new_tokens": 100, "do_sample": False, "cache_implementation": "static"}
    ids = torch.tensor([[2, 4, 5, 6, 7, 8], [2, 9, 10, 11, 12, 13]])
    with torch.no_grad():
        model.generate(ids.to("neuron"), **long)  # warm-up: prefill and decode graphs
        torch.neuron.reset_dynamo_metrics()
        other = torch.tensor([[2, 14, 15, 16, 4, 5], [2, 6, 7, 8, 9, 10]])  # new tokens, same shapes
        out = model.generate(other.to("neuron"), **long).cpu()
        want = ref.generate(other, **{**long, "disable_compile": True})
    metrics = torch_neuronx.compile.metrics.snapshot()
    assert metrics["graphs_compiled"] == 0 and metrics["recompilations"] == 0, metrics
    assert out.shape == (2, 106) and torch.equal(out, want)
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def deep_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """More tensors than loader threads, several shards: concurrent allocations and copies do happen."""
    from torch_neuronx.testing import hf as hf_tiny

    config = hf_tiny.llama_config()
    config.num_hidden_layers = 8
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("deep_llama")
    AutoModelForCausalLM.from_config(config).save_pretrained(path, max_shard_size="100KB")
    assert len(list(path.glob("*.safetensors"))) > 1
    return path


def _check_loaded(path: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(path, device_map="neuron")
    ref = AutoModelForCausalLM.from_pretrained(path)
    got, want = model.state_dict(), ref.state_dict()
    assert got.keys() == want.keys()
    for name, tensor in got.items():
        assert tensor.device == torch.device("neuron:0"), (name, tensor.device)
        assert torch.equal(tensor.cpu(), want[name]), name
    ids = torch.tensor([[2, 4, 5, 6, 7]])
    kw = {"max_new_tokens": 8, "min_new_tokens": 8, "do_sample": False}
    with torch.no_grad():
        assert torch.equal(model.generate(ids.to("neuron"), **kw).cpu(), ref.generate(ids, **kw))


def test_weight_loading_threaded(deep_llama_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default load materialises weights from a thread pool: allocations and copies race."""
    monkeypatch.delenv("HF_DEACTIVATE_ASYNC_LOAD", raising=False)
    for _ in range(3):
        _check_loaded(deep_llama_dir)


def test_weight_loading_sequential_env(deep_llama_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DEACTIVATE_ASYNC_LOAD", "1")  # read by transformers at each load
    _check_loaded(deep_llama_dir)


def _tiny_mixtral(experts_implementation: str | None) -> Any:
    from transformers import MixtralConfig

    config = MixtralConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                           num_experts_per_tok=2, max_position_embeddings=256, pad_token_id=0)
    torch.manual_seed(0)
    kwargs = {} if experts_implementation is None else {"experts_implementation": experts_implementation}
    return AutoModelForCausalLM.from_config(config, **kwargs).eval()


def _moe_matches_cpu(experts_implementation: str | None) -> None:
    import copy

    model = _tiny_mixtral(experts_implementation)
    ids = torch.randint(3, 256, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits
        got = copy.deepcopy(model).to("neuron")(ids.to("neuron")).logits.cpu()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_moe_eager_experts_matches_cpu() -> None:
    _moe_matches_cpu("eager")


def test_moe_default_experts_matches_cpu() -> None:
    _moe_matches_cpu(None)
