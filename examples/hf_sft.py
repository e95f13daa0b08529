"""Supervised fine-tuning with TRL's SFTTrainer on the neuron device, unmodified.

    python examples/hf_sft.py [--steps 8] [--max-length 512] [--compare-cpu]

A tiny random Llama, a word-level tokenizer and an in-memory text dataset are
made on the spot. Nothing names the device: the Trainer finds neuron:0 itself,
TRL pads to multiples of 128 on neuron (one compiled graph per bucket), and
bf16=True uses neuron's autocast. Packing "wrapped" cuts the token stream into
rows of exactly --max-length tokens.
"""

from __future__ import annotations

import argparse
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from datasets import Dataset
from trl import SFTConfig, SFTTrainer

from torch_neuronx.testing import hf as tiny_hf


def train(steps: int, max_length: int, use_cpu: bool, out_dir: str) -> list[float]:
    model = tiny_hf.llama(max_length)
    n_texts = steps * 2 * max_length // 25 + 1  # ~25 tokens a text: enough for steps x batch 2 rows
    args = SFTConfig(output_dir=out_dir, max_steps=steps, per_device_train_batch_size=2, learning_rate=5e-3,
                     bf16=True, packing=True, packing_strategy="wrapped", max_length=max_length, logging_steps=1,
                     report_to=[], save_strategy="no", seed=0, use_cpu=use_cpu, disable_tqdm=True)
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_dict({"text": tiny_hf.corpus(n_texts)}),
                         processing_class=tiny_hf.tokenizer())
    print(f"device {trainer.args.device}, pad_to_multiple_of {trainer.args.pad_to_multiple_of}")
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--compare-cpu", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out_dir:
        losses = train(args.steps, args.max_length, use_cpu=False, out_dir=out_dir)
        print("neuron losses:", " ".join(f"{x:.3f}" for x in losses))
        if args.compare_cpu:
            ref = train(args.steps, args.max_length, use_cpu=True, out_dir=out_dir)
            print("cpu losses:   ", " ".join(f"{x:.3f}" for x in ref))
            worst = max(abs(a - b) for a, b in zip(losses, ref, strict=True))
            print(f"max |loss difference| {worst:.4f} (bf16 autocast on both)")


if __name__ == "__main__":
    main()
