"""TRL SFTTrainer with tensor parallel x FSDP on emulated NeuronCores, launched by torchrun.

    torchrun --nproc-per-node 4 examples/hf_sft_tp_fsdp.py [--tp 2] [--fsdp 2] [--steps 6] [--out DIR]

TP_SIZE x FSDP_SIZE processes, one NeuronCore each. As in the announcement, the
script does not call `init_process_group`: `from_pretrained` starts the "neuron"
process group itself (`--init-process-group` starts it first instead). Transformers shards the
weights at load (`from_pretrained(distributed_config=DistributedConfig(tp_size,
fsdp_size))`): the tensor-parallel plan of the model splits each layer's
projections across the `tp` ranks, and FSDP2 shards what remains across the
`fsdp` ranks. The Trainer sees a model Transformers distributed itself and does
not wrap it again. `trainer.save_model` gathers a standard checkpoint that
loads anywhere — on CPU, without torch_neuronx.

A tiny random Llama, a word-level tokenizer and an in-memory dataset are made on
the spot; nothing is downloaded. On a trn1.32xlarge (32 NeuronCores) the same
script runs the 4 x 8 layout of the announcement:

    torchrun --nproc-per-node 32 examples/hf_sft_tp_fsdp.py --tp 8 --fsdp 4
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
import torch.distributed as dist
from datasets import Dataset
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
from transformers.distributed import DistributedConfig
from trl import SFTConfig, SFTTrainer

from torch_neuronx.testing import hf as tiny_hf


def save_checkpoint(path: Path, max_length: int) -> None:
    # Attention heads and KV heads divisible by the largest tp size used (8).
    tiny_hf.save_checkpoint(path, max_length, hidden=128, heads=8, kv_heads=8)


def base_once(path: Path, max_length: int, timeout_s: float = 300) -> None:
    """The base checkpoint, written by local rank 0 (renamed into place when complete) while the others wait for it:
    there is no process group yet to synchronise on."""
    if os.environ.get("LOCAL_RANK", "0") == "0":
        if not (path / "config.json").exists():
            partial = path.with_name(path.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            save_checkpoint(partial, max_length)
            partial.rename(path)
        return
    deadline = time.monotonic() + timeout_s
    while not (path / "config.json").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"local rank 0 did not write the base checkpoint {path} within {timeout_s:.0f} s")
        time.sleep(0.2)


def probe_ids() -> torch.Tensor:
    """A fixed batch whose logits the CPU check compares (tests/hf/test_hf_distributed.py)."""
    return torch.tensor([[2, 4, 5, 6, 7, 8, 9, 10], [2, 11, 12, 13, 14, 15, 16, 4]])


def train(args: argparse.Namespace, model: AutoModelForCausalLM, tokenizer: PreTrainedTokenizerFast, out: Path,
          batch: int, use_cpu: bool = False) -> SFTTrainer:
    # ~25 tokens a text: enough text for the steps at the global batch (FSDP ranks x rows per rank).
    n_texts = args.steps * args.batch * args.fsdp * args.max_length // 25 + 1
    config = SFTConfig(output_dir=str(out / "run"), max_steps=args.steps, per_device_train_batch_size=batch,
                       learning_rate=5e-3, bf16=args.precision == "bf16", packing=True, packing_strategy="wrapped",
                       max_length=args.max_length, logging_steps=1, report_to=[], save_strategy="no", seed=0,
                       disable_tqdm=True, use_cpu=use_cpu)
    trainer = SFTTrainer(model=model, args=config, train_dataset=Dataset.from_dict({"text": tiny_hf.corpus(n_texts)}),
                         processing_class=tokenizer)
    trainer.train()
    return trainer


def print_losses(trainer: SFTTrainer) -> None:
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    for step, loss in enumerate(losses, 1):
        print(f"step {step} loss {loss:.6f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel size")
    parser.add_argument("--fsdp", type=int, default=2, help="FSDP (data-parallel) size")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=2, help="rows per FSDP rank and step")
    parser.add_argument("--max-length", type=int, default=256, help="tokens per packed row")
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--out", type=Path, default=None, help="where trainer.save_model writes (default: a temp dir)")
    parser.add_argument("--init-process-group", action="store_true",
                        help="start the process group in the script (by default from_pretrained starts it)")
    parser.add_argument("--cpu-reference", action="store_true",
                        help="no torchrun: the same training in one CPU process, with the global batch")
    args = parser.parse_args()

    if args.cpu_reference:
        out = args.out or Path(tempfile.mkdtemp(prefix="hf_sft_cpu_"))
        save_checkpoint(out / "base", args.max_length)
        model = AutoModelForCausalLM.from_pretrained(out / "base")
        tokenizer = PreTrainedTokenizerFast.from_pretrained(out / "base")
        print_losses(train(args, model, tokenizer, out, batch=args.batch * args.fsdp, use_cpu=True))
        return

    if args.init_process_group:
        # The "neuron" process group (the accelerator's default), started by the script; transformers uses it.
        dist.init_process_group()
        shared = [str(args.out or Path(tempfile.mkdtemp(prefix="hf_sft_tp_fsdp_")))]
        dist.broadcast_object_list(shared, src=0)
        out = Path(shared[0])
        if dist.get_rank() == 0:
            save_checkpoint(out / "base", args.max_length)
        dist.barrier()
    else:
        # The announcement's flow: no process group yet; from_pretrained starts it (after binding the process to
        # neuron:LOCAL_RANK with torch.accelerator.set_device_index).
        out = args.out or Path(tempfile.gettempdir()) / f"hf_sft_tp_fsdp_{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}"
        base_once(out / "base", args.max_length)

    model = AutoModelForCausalLM.from_pretrained(
        out / "base", distributed_config=DistributedConfig(tp_size=args.tp, fsdp_size=args.fsdp))
    rank, world = dist.get_rank(), dist.get_world_size()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(out / "base")
    # Each rank holds its own shard of every projection, on its own core.
    q_proj = model.model.layers[0].self_attn.q_proj.weight
    print(f"rank {rank}/{world} on neuron:{torch.neuron.current_device()}: q_proj {tuple(q_proj.shape)} "
          f"{q_proj.placements} over {q_proj.device_mesh.mesh_dim_names}, local {tuple(q_proj.to_local().shape)}",
          flush=True)

    trainer = train(args, model, tokenizer, out, batch=args.batch)
    trainer.save_model(str(out / "final"))
    model.eval()
    with torch.no_grad():  # every rank takes part: the forward runs its collectives
        logits = model(probe_ids().to(trainer.args.device)).logits
    if rank == 0:
        print_losses(trainer)
        torch.save({"input_ids": probe_ids(), "logits": logits.float().cpu()}, out / "probe_logits.pt")
        print(f"device {trainer.args.device}; the Trainer trained the model Transformers sharded, unwrapped: "
              f"{trainer.model_wrapped is model} ({type(model).__name__}); saved {out / 'final'}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
