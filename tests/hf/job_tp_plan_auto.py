"""Rank side of test_hf_distributed.py's process-group test, started by torchrun with 2 workers.

The script never calls ``init_process_group``: Transformers starts the "neuron"
process group itself when ``from_pretrained(..., tp_plan="auto")`` runs under
torchrun, after binding the process to its core with
``torch.accelerator.set_device_index(LOCAL_RANK)`` (``_bind_local_device``).
Before that, every way of choosing the current device must leave the runtime
untouched, or the process group refuses to start (TorchNeuron's assertion).
Each rank writes what it saw to OUT_DIR/rank{RANK}.json.

    torchrun --nproc-per-node 2 tests/hf/job_tp_plan_auto.py CHECKPOINT OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import torch_neuronx  # noqa: E402

LOCAL_RANK = int(os.environ["LOCAL_RANK"])
OTHER = 1 - LOCAL_RANK
IDS = torch.tensor([[2, 4, 5, 6, 7, 8, 9, 10], [2, 11, 12, 13, 14, 15, 16, 4]])


def select_devices_before_the_process_group() -> dict[str, object]:
    """Each way of choosing the current device, before any process group: none may start the runtime."""
    seen: dict[str, object] = {}
    torch.accelerator.set_device_index(OTHER)  # the device guard, through PyTorch's accelerator API
    seen["after_set_device_index"] = (torch.neuron.current_device(), torch_neuronx.is_neuron_runtime_initialized())
    with torch.neuron.device(LOCAL_RANK):  # torch.neuron's context manager
        seen["in_device_context"] = torch.neuron.current_device()
    with torch.accelerator.device_index(LOCAL_RANK):  # the C++ device guard's exchangeDevice
        seen["in_accelerator_context"] = torch.accelerator.current_device_index()
    torch.neuron.set_device(LOCAL_RANK)
    seen["after_set_device"] = (torch.neuron.current_device(), torch.accelerator.current_device_index())
    seen["initialized"] = torch_neuronx.is_neuron_runtime_initialized()
    return seen


def main() -> None:
    checkpoint, out = Path(sys.argv[1]), Path(sys.argv[2])
    torch.set_num_threads(1)
    result: dict[str, object] = {"before": select_devices_before_the_process_group()}
    model = AutoModelForCausalLM.from_pretrained(checkpoint, tp_plan="auto")  # starts the process group
    result["backend"] = dist.get_backend()
    result["device"] = str(torch.device("neuron", torch.neuron.current_device()))
    q_proj = model.model.layers[0].self_attn.q_proj.weight
    result["q_proj"] = [type(q_proj).__name__, list(q_proj.to_local().shape), str(q_proj.device)]
    with torch.no_grad():
        logits = model(IDS.to(model.device)).logits.float()
        reference = AutoModelForCausalLM.from_pretrained(checkpoint)(IDS).logits  # one CPU process's model
    result["max_diff_vs_cpu"] = (logits.cpu() - reference).abs().max().item()
    gathered = [torch.empty_like(logits) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, logits)
    result["max_diff_between_ranks"] = max((g - logits).abs().max().item() for g in gathered)
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
