"""Corpus (torch-neuronx migrate): supervised fine-tuning with Optimum Neuron's NeuronSFTTrainer and tensor
parallelism (the style of Optimum Neuron's SFT examples), on a tiny local model directory.

    torchrun --nproc-per-node 2 optimum_sft_tp.py MODEL_DIR OUT_DIR [STEPS]

Rank 0 writes the logged losses to OUT_DIR/losses_rank0.json.
"""
import json
import os
import sys

import torch
from datasets import Dataset
from optimum.neuron import NeuronSFTConfig, NeuronSFTTrainer
from optimum.neuron.models.training import NeuronModelForCausalLM
from transformers import AutoTokenizer


def main():
    model_dir, out_dir = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    words = "the cat sat on mat dog ran to park bird flew over tree".split()
    texts = [" ".join(words[(i + j) % len(words)] for j in range(24)) for i in range(64)]
    dataset = Dataset.from_dict({"text": texts})

    args = NeuronSFTConfig(
        output_dir=out_dir,
        per_device_train_batch_size=2,
        max_steps=steps,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        max_length=64,
        packing=False,
        tensor_parallel_size=2,  # shard the model's layers over 2 NeuronCores
        fuse_qkv=True,
        seed=0,
    )
    trn_config = args.trn_config
    model = NeuronModelForCausalLM.from_pretrained(model_dir, trn_config, torch_dtype=torch.float32,
                                                   use_flash_attention_2=True)
    trainer = NeuronSFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    trainer.train()
    if trainer.is_world_process_zero():
        with open(os.path.join(out_dir, "losses_rank0.json"), "w") as f:
            json.dump([h["loss"] for h in trainer.state.log_history if "loss" in h], f)


if __name__ == "__main__":
    main()
