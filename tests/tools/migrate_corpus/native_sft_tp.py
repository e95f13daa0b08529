"""Corpus (torch-neuronx migrate): the hand-written native version of optimum_sft_tp.py (TRL SFTTrainer, the model
sharded by Transformers' DistributedConfig), the reference of the tensor-parallel SFT test.

    torchrun --nproc-per-node 2 native_sft_tp.py MODEL_DIR OUT_DIR [STEPS]
"""
import json
import os
import sys

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.distributed import DistributedConfig
from trl import SFTConfig, SFTTrainer


def main():
    model_dir, out_dir = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    words = "the cat sat on mat dog ran to park bird flew over tree".split()
    texts = [" ".join(words[(i + j) % len(words)] for j in range(24)) for i in range(64)]
    args = SFTConfig(output_dir=out_dir, per_device_train_batch_size=2, max_steps=steps, learning_rate=1e-3,
                     logging_steps=1, save_strategy="no", report_to=[], max_length=64, packing=False, seed=0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="sdpa",
                                                 distributed_config=DistributedConfig(tp_size=2))
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_dict({"text": texts}),
                         processing_class=tokenizer)
    trainer.train()
    if trainer.is_world_process_zero():
        with open(os.path.join(out_dir, "losses_rank0.json"), "w") as f:
            json.dump([h["loss"] for h in trainer.state.log_history if "loss" in h], f)


if __name__ == "__main__":
    main()
