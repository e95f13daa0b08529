"""Hugging Face workloads on neuron vs CPU, side by side in one run.

* generate: greedy tokens/s of a small Llama — neuron static cache compiled
  (transformers' own auto-compile with backend "neuron"), neuron static cache
  eager, neuron dynamic cache eager; CPU dynamic cache (eager) and CPU static
  cache compiled by Inductor (the same compiled decode, for the host).
* SFT: TRL SFTTrainer training tokens/s (bf16 and fp32, packed rows), neuron vs CPU.

Repetitions alternate between the sides so the machine's noise hits all of
them alike; figures are medians after a warm-up (compile time is reported
apart). Ratios are neuron / CPU throughput (> 1: neuron faster).

    python benchmarks/bench_hf.py [--quick] [--threads 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import AutoModelForCausalLM, PrinterCallback, TrainerCallback

import torch_neuronx  # noqa: F401
from torch_neuronx.testing import hf as tiny_hf
from torch_neuronx.testing.bench import arguments, parse


def llama(hidden: int, layers: int, vocab: int, positions: int) -> Any:
    return tiny_hf.llama(positions, hidden=hidden, layers=layers, vocab=vocab, heads=max(hidden // 32, 1),
                         kv_heads=max(hidden // 64, 1)).eval()


def bench_generate(args: argparse.Namespace) -> dict[str, Any]:
    model_cpu = llama(args.hidden, args.layers, 1024, 512)
    model_dev = AutoModelForCausalLM.from_config(model_cpu.config).eval()
    model_dev.load_state_dict(model_cpu.state_dict())
    model_dev.to("neuron")
    ids = torch.randint(4, 1024, (args.batch, args.prompt), generator=torch.Generator().manual_seed(0))
    base = {"max_new_tokens": args.new_tokens, "min_new_tokens": args.new_tokens, "do_sample": False,
            "attention_mask": torch.ones_like(ids)}
    on_dev = {**base, "attention_mask": base["attention_mask"].to("neuron")}
    from transformers import CompileConfig

    cpu_compile = CompileConfig(backend="inductor", fullgraph=True, dynamic=False)
    cpu_compile._compile_all_devices = True  # transformers auto-compiles on accelerators only
    cases: dict[str, Callable[[], torch.Tensor]] = {
        "cpu dynamic cache": lambda: model_cpu.generate(ids, **base),
        # The like-for-like CPU figure: the same static-cache decode compiled by Inductor for the host.
        "cpu static cache (compiled, inductor)": lambda: model_cpu.generate(
            ids, cache_implementation="static", compile_config=cpu_compile, **base),
        "neuron dynamic cache (eager)": lambda: model_dev.generate(ids.to("neuron"), **on_dev).cpu(),
        "neuron static cache (eager)": lambda: model_dev.generate(
            ids.to("neuron"), cache_implementation="static", disable_compile=True, **on_dev).cpu(),
        # transformers compiles the decode step itself, with backend "neuron" (registered by `import torch`).
        "neuron static cache (compiled)": lambda: model_dev.generate(
            ids.to("neuron"), cache_implementation="static", **on_dev).cpu(),
    }
    warmup_s: dict[str, float] = {}
    outputs: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, fn in cases.items():  # the first call of the compiled case compiles
            start = time.perf_counter()
            outputs[name] = fn()
            warmup_s[name] = time.perf_counter() - start
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.reps):
            for name, fn in cases.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    tokens = args.batch * args.new_tokens
    ref = outputs["cpu dynamic cache"]
    cpu_tps = tokens / statistics.median(times["cpu dynamic cache"])
    rows = {}
    for name in cases:
        tps = tokens / statistics.median(times[name])
        rows[name] = {"tokens_per_s": round(tps, 1), "vs_cpu": round(tps / cpu_tps, 3),
                      "first_call_s": round(warmup_s[name], 2), "matches_cpu": bool(torch.equal(outputs[name], ref))}
    eager = rows["neuron static cache (eager)"]["tokens_per_s"]
    compiled = rows["neuron static cache (compiled)"]["tokens_per_s"]
    rows["neuron static cache (compiled)"]["vs_eager_static"] = round(compiled / eager, 3)
    rows["neuron static cache (compiled)"]["vs_cpu_compiled"] = round(
        compiled / rows["cpu static cache (compiled, inductor)"]["tokens_per_s"], 3)
    return {"rows": rows}


class _StepTimer(TrainerCallback):
    """Wall time of each optimizer step, so the first (allocations, autocast caches) can be dropped."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._start = 0.0

    def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
        self._start = time.perf_counter()

    def on_step_end(self, *args: Any, **kwargs: Any) -> None:
        self.times.append(time.perf_counter() - self._start)


def _sft_step_times(args: argparse.Namespace, use_cpu: bool, bf16: bool, out_dir: str) -> list[float]:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    words = [f"w{i}" for i in range(200)]
    texts = [" ".join(words[(i * 7 + j) % len(words)] for j in range(40)) for i in range(
        args.sft_steps * args.batch * args.seq // 40 + 8)]
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([" ".join(words)], trainers.WordLevelTrainer(
        special_tokens=["[PAD]", "[UNK]", "[BOS]", "[EOS]"]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                        bos_token="[BOS]", eos_token="[EOS]")
    timer = _StepTimer()
    config = SFTConfig(output_dir=out_dir, max_steps=args.sft_steps, per_device_train_batch_size=args.batch,
                       learning_rate=1e-3, bf16=bf16, packing=True, packing_strategy="wrapped",
                       max_length=args.seq, logging_steps=10**6, report_to=[], save_strategy="no", seed=0,
                       use_cpu=use_cpu, disable_tqdm=True)
    trainer = SFTTrainer(model=llama(args.hidden, args.layers, 256, args.seq), args=config,
                         train_dataset=Dataset.from_dict({"text": texts}), processing_class=tokenizer,
                         callbacks=[timer])
    trainer.remove_callback(PrinterCallback)  # disable_tqdm=True would print every log line instead
    trainer.train()
    return timer.times[1:]


def bench_sft(args: argparse.Namespace, bf16: bool) -> dict[str, Any]:
    from accelerate.state import AcceleratorState

    times: dict[str, list[float]] = {"cpu": [], "neuron": []}
    with tempfile.TemporaryDirectory() as out_dir:
        for _ in range(args.sft_reps):  # alternate the sides
            for side in ("cpu", "neuron"):
                # Accelerate keeps its state per process; each run must pick its own device.
                AcceleratorState._reset_state(reset_partial_state=True)
                times[side] += _sft_step_times(args, side == "cpu", bf16, out_dir)
    tokens = args.batch * args.seq
    tps = {side: tokens / statistics.median(t) for side, t in times.items()}
    return {"cpu_tokens_per_s": round(tps["cpu"], 1), "neuron_tokens_per_s": round(tps["neuron"], 1),
            "neuron_vs_cpu": round(tps["neuron"] / tps["cpu"], 3), "steps_timed_per_side": len(times["cpu"])}


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--seq", type=int, default=512, help="SFT packed row length")
    parser.add_argument("--skip-generate", action="store_true")
    parser.add_argument("--skip-sft", action="store_true")
    args = parse(parser)
    args.reps = 2 if args.quick else 5
    args.sft_steps = 4 if args.quick else 8
    args.sft_reps = 1 if args.quick else 2
    import datasets
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    results: dict[str, Any] = {"config": {k: v for k, v in vars(args).items() if k != "json"}}
    if not args.skip_generate:
        results["generate"] = gen = bench_generate(args)
        print(f"generate: batch {args.batch}, prompt {args.prompt}, {args.new_tokens} new tokens, "
              f"Llama hidden {args.hidden} x {args.layers} layers, {args.threads} thread(s)")
        print("| case | tokens/s | vs CPU | first call s | matches CPU |\n|---|---|---|---|---|")
        for name, row in gen["rows"].items():
            print(f"| {name} | {row['tokens_per_s']} | {row['vs_cpu']}x | {row['first_call_s']} "
                  f"| {row['matches_cpu']} |")
    if not args.skip_sft:
        results["sft"] = {}
        for bf16 in (True, False):
            name = "bf16" if bf16 else "fp32"
            results["sft"][name] = sft = bench_sft(args, bf16)
            print(f"SFT ({name}, packed rows of {args.seq}, batch {args.batch}): CPU {sft['cpu_tokens_per_s']} "
                  f"tok/s, neuron {sft['neuron_tokens_per_s']} tok/s, neuron/CPU {sft['neuron_vs_cpu']}x", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
