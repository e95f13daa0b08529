"""Greedy generation with transformers on the neuron device: from_pretrained(device_map="neuron") + static cache.

    python examples/hf_generate.py [--new-tokens 32] [--no-compile] [--compare-cpu]

A tiny random Llama and a word-level tokenizer are made on the spot and saved
to a temporary directory, so the load path is the one a Hub checkpoint takes.
With a static KV cache on a neuron device, transformers compiles the decode
step itself with torch.compile(backend="neuron", dynamic=False); --no-compile
runs the same static cache eagerly.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here needs the network

from transformers import AutoModelForCausalLM, AutoTokenizer

from torch_neuronx.testing import hf as tiny_hf


def generate(path: str, device_map: str | None, new_tokens: int, static: bool, compile: bool) -> tuple[str, float]:
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, device_map=device_map)
    inputs = tok(["the cat sat on"], return_tensors="pt").to(model.device)
    kwargs = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False}
    if static:
        kwargs["cache_implementation"] = "static"
    if not compile:
        kwargs["disable_compile"] = True
    start = time.perf_counter()
    out = model.generate(**inputs, **kwargs)
    seconds = time.perf_counter() - start
    # The random model's ids beyond the 17-word vocabulary decode to nothing; show the ids too.
    return f"{tok.decode(out[0], skip_special_tokens=True)} {out[0].tolist()}", seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--no-compile", action="store_true", help="static cache, eager decode step")
    parser.add_argument("--compare-cpu", action="store_true")
    args = parser.parse_args()

    compile = not args.no_compile
    with tempfile.TemporaryDirectory() as path:
        tiny_hf.save_checkpoint(path)
        text, seconds = generate(path, "neuron", args.new_tokens, static=True, compile=compile)
        mode = "compiled" if compile else "eager"
        print(f"neuron ({mode}, static cache): {seconds:.2f} s incl. compile | {text!r}")
        if args.compare_cpu:
            ref, cpu_seconds = generate(path, None, args.new_tokens, static=False, compile=False)
            print(f"cpu (dynamic cache): {cpu_seconds:.2f} s | {ref!r}")
            print("match" if text == ref else "MISMATCH")
            if text != ref:
                raise SystemExit(1)


if __name__ == "__main__":
    main()
