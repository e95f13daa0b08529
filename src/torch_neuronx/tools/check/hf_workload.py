"""The job `torch-neuronx check --hf-model DIR` runs when there is no script: SFT steps, then greedy generation.

    python -m torch_neuronx.tools.check.hf_workload --model DIR --task all --device neuron --out OUT

The same command with ``--device cpu`` is the reference. SFT: a few steps of
TRL's SFTTrainer on a small built-in corpus (fp32, rows padded to 128 on both
devices so the shapes are Trainium's), then ``save_model`` to OUT and the
trained model's logits on a fixed batch recorded as ``probe_logits`` (the
checker loads OUT on CPU and compares). Generation: greedy ``generate`` with
the static cache, three prompts of one length, each a step; the tokens are
recorded. On neuron, transformers compiles the decode step with the "neuron"
backend by itself; on CPU it runs eagerly.

With ``--buckets 128,512`` (``check --hf-model DIR --buckets`` / ``--buckets-from
plan.json``: the context buckets of ``plan --serve``) generation runs once per
bucket instead: a prompt of 3/4 of the bucket's length, left-padded to it (as a
serving stack pads a prompt to its context bucket, masked), a static cache of
bucket + new tokens; first one warm-up call per bucket (each compiles the decode
graph for its cache length; Dynamo's recompile limit is raised to cover every
bucket), then one steady call per bucket (none may compile).
Tokens are recorded as ``generated_b{bucket}`` and ``generated_b{bucket}_warmup``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from torch_neuronx.testing import hf as tiny_hf  # noqa: E402
from torch_neuronx.tools.check import probe as check  # noqa: E402  (the markers of torch_neuronx.check)
from torch_neuronx.tools.check.config import HF_NEW_TOKENS, HF_SFT_STEPS, parse_buckets  # noqa: E402
from torch_neuronx.tools.check.verdicts import PROBE_IDS  # noqa: E402

PROMPTS = ["the cat sat on", "a dog ran to", "the bird flew over"]


def load_tokenizer(model_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError):  # a directory with weights only: the built-in word-level tokenizer
        return tiny_hf.tokenizer()
    # transformers 5 may not raise for a directory without tokenizer files: it returns an empty tokenizer of the
    # model's class (a Qwen2Tokenizer with one token, encoding any text to nothing); that is no tokenizer either
    if len(tok) < 2 or len(tok(" ".join(PROMPTS))["input_ids"]) < 2:
        return tiny_hf.tokenizer()
    return tok


def sft(model_dir: Path, device: str, out: Path, steps: int = HF_SFT_STEPS) -> None:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer

    tok = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    args = SFTConfig(output_dir=str(out / "trainer"), use_cpu=device == "cpu", report_to=[], save_strategy="no",
                     logging_steps=1, seed=0, disable_tqdm=True, dataloader_num_workers=0, max_steps=steps,
                     per_device_train_batch_size=2, learning_rate=5e-3, max_length=64, packing=False,
                     pad_to_multiple_of=128, bf16=False)  # fp32: the checkpoint is compared exactly
    data = Dataset.from_dict({"text": tiny_hf.corpus(4 * steps)})
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tok)
    trainer.train()
    trainer.save_model(str(out))
    with torch.no_grad():
        ids = torch.tensor([PROBE_IDS], device=trainer.model.device) % trainer.model.config.vocab_size
        check.record("probe_logits", trainer.model(ids).logits)


def generate(model_dir: Path, device: str, new_tokens: int = HF_NEW_TOKENS) -> None:
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 device_map="neuron" if device == "neuron" else None)
    for i, prompt in enumerate(PROMPTS):
        ids = tok([prompt], return_tensors="pt")["input_ids"][:, :4].to(model.device)  # one length: one graph
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, cache_implementation="static",
                             disable_compile=device == "cpu", pad_token_id=model.config.pad_token_id)
        check.record(f"generated_{i}", out)
        check.step()


def bucket_prompt(tok, bucket: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[no-untyped-def]
    """A prompt of ``bucket - bucket // 4`` real tokens (the built-in prompts' words, repeated), left-padded to the
    bucket with `pad_id` and masked: ids and attention mask, each [1, bucket]."""
    words = tok(" ".join(PROMPTS), return_tensors="pt")["input_ids"][0]
    if len(words) == 0:
        raise ValueError("the tokenizer encodes the built-in prompts to no tokens; give a directory with a working "
                         "tokenizer (or none: the built-in one is used)")
    real = bucket - bucket // 4
    ids = words.repeat(real // len(words) + 1)[:real]
    pad = torch.full((bucket - real,), pad_id, dtype=ids.dtype)
    mask = torch.cat([torch.zeros(bucket - real, dtype=torch.long), torch.ones(real, dtype=torch.long)])
    return torch.cat([pad, ids])[None], mask[None]


def allow_one_graph_per_bucket(buckets: list[int]) -> None:
    """Each bucket's static cache has its own length, so the decode step compiles once per bucket; Dynamo keeps at
    most ``recompile_limit`` (8) graphs per code object and runs the rest eagerly, which would leave buckets 9+
    uncompiled. Raise the limits to cover every bucket, with room for the workload's other graphs."""
    import torch._dynamo.config as dynamo_config

    need = len(buckets) + 8
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, need)
    dynamo_config.accumulated_recompile_limit = max(dynamo_config.accumulated_recompile_limit, 4 * need)


def generate_buckets(model_dir: Path, device: str, buckets: list[int], new_tokens: int = HF_NEW_TOKENS) -> None:
    from transformers import AutoModelForCausalLM

    allow_one_graph_per_bucket(buckets)
    tok = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 device_map="neuron" if device == "neuron" else None)
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    prompts = {b: bucket_prompt(tok, b, pad_id) for b in buckets}
    for suffix in ("_warmup", ""):  # every bucket's warm-up call (it compiles), then every bucket's steady call
        for b in buckets:
            ids, mask = (t.to(model.device) for t in prompts[b])
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False, cache_implementation="static",
                                 disable_compile=device == "cpu", pad_token_id=pad_id)
            check.record(f"generated_b{b}{suffix}", out[:, b:])
            check.step()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--task", default="all", choices=("generate", "sft", "all"))
    parser.add_argument("--device", default="neuron", choices=("neuron", "cpu"))
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--buckets", type=parse_buckets, help="generate at each prompt length, e.g. 128,512")
    args = parser.parse_args(argv)
    if args.task in ("sft", "all"):
        sft(args.model, args.device, args.out)
    if args.task in ("generate", "all") and args.buckets:
        generate_buckets(args.model, args.device, args.buckets)
    elif args.task in ("generate", "all"):
        generate(args.model, args.device)


if __name__ == "__main__":
    main()
