"""Rank side of test_hf_diffusers.py's tensor-parallel test, started by torchrun with 2 workers.

Diffusers shards FluxTransformer2DModel by its `_tp_plan` across a "tp" mesh
of neuron cores, by its two routes: `enable_parallelism` on a model in memory
(Diffusers' Neuron backend: pre-shard each weight locally, then register the
forward hooks) and `from_pretrained(parallel_config=...)` (each rank reads its
slice off disk). Each rank compares the transformer's output and a whole
FluxPipeline's images with the same model run unsharded on CPU.

    torchrun --nproc-per-node 2 tests/hf/job_flux_tp.py OUT_DIR
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import diffusers  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from diffusers import FluxTransformer2DModel, TensorParallelConfig  # noqa: E402

from torch_neuronx.testing import hf as hf_tiny  # noqa: E402


def transformer_inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    tokens, text = 16, 8  # a 4 x 4 latent of packed patches, 8 text tokens
    return {"hidden_states": torch.randn(2, tokens, 4, generator=g),
            "encoder_hidden_states": torch.randn(2, text, 32, generator=g),
            "pooled_projections": torch.randn(2, 32, generator=g),
            "timestep": torch.tensor([0.5, 0.25]),
            "img_ids": torch.stack([torch.zeros(4, 4), *torch.meshgrid(torch.arange(4.0), torch.arange(4.0),
                                                                       indexing="ij")], dim=-1).reshape(tokens, 3),
            "txt_ids": torch.zeros(text, 3)}


def forward(model: torch.nn.Module, device: torch.device) -> torch.Tensor:
    with torch.no_grad():
        return model(**{k: v.to(device) for k, v in transformer_inputs().items()}).sample.cpu()


def images(pipe: diffusers.FluxPipeline) -> torch.Tensor:
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        return pipe(generator=torch.Generator("cpu").manual_seed(0), output_type="pt", **hf_tiny.FLUX_CALL).images.cpu()


def local_shape(model: torch.nn.Module) -> list[int]:
    weight = model.transformer_blocks[0].attn.to_q.weight
    return [type(weight).__name__, list(weight.to_local().shape), str(weight.device)]


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    dist.init_process_group()  # backend "neuron": the accelerator's default
    rank = dist.get_rank()
    device = torch.device("neuron", torch.neuron.current_device())
    parts = hf_tiny.flux_parts()
    if rank == 0:
        parts["transformer"].save_pretrained(out / "transformer")
    dist.barrier()
    results: dict[str, object] = {"device": str(device)}

    reference = forward(parts["transformer"], torch.device("cpu"))
    in_memory = copy.deepcopy(parts["transformer"])  # on CPU, as Diffusers' Neuron backend requires
    in_memory.enable_parallelism(config=TensorParallelConfig(tp_degree=2))
    in_memory.to(device)
    results["in_memory_local_q"] = local_shape(in_memory)
    results["in_memory_max_diff"] = (forward(in_memory, device) - reference).abs().max().item()

    loaded = FluxTransformer2DModel.from_pretrained(out / "transformer",
                                                    parallel_config=TensorParallelConfig(tp_degree=2)).eval()
    loaded.to(device)
    results["loaded_local_q"] = local_shape(loaded)
    results["loaded_max_diff"] = (forward(loaded, device) - reference).abs().max().item()

    want = images(diffusers.FluxPipeline(**copy.deepcopy(parts)))
    pipe = diffusers.FluxPipeline(**{**copy.deepcopy(parts), "transformer": in_memory}).to(device)
    results["pipeline_max_diff"] = (images(pipe) - want).abs().max().item()
    (out / f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
