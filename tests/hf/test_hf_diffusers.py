"""Diffusers pipelines on neuron, unmodified: tiny UNet (DDPM, DDIM), DiT and Flux pipelines match CPU under one seed,
eager and compiled, and Flux shards over two cores with Diffusers' Neuron tensor-parallel backend."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from torch_neuronx.testing import hf as hf_tiny
from torch_neuronx.testing.workers import run_processes, torchrun_argv

diffusers = pytest.importorskip("diffusers")


def test_diffusers_detects_neuron() -> None:
    """Diffusers looks for the installed *distribution* torch-neuronx, then asks torch.neuron."""
    from diffusers.utils import is_torch_neuronx_available
    from diffusers.utils.torch_utils import get_device

    assert is_torch_neuronx_available()
    assert get_device() == "neuron"


def _unet(minimal: bool = False) -> Any:
    torch.manual_seed(0)
    if minimal:  # one block, no attention: the fewest ops that still compile convolutions
        return diffusers.UNet2DModel(
            sample_size=16, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(16,),
            down_block_types=("DownBlock2D",), up_block_types=("UpBlock2D",), norm_num_groups=8,
            add_attention=False,
        ).eval()
    return diffusers.UNet2DModel(
        sample_size=16, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(32, 64),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8, attention_head_dim=8,
    ).eval()


def _dit_parts() -> tuple[Any, Any]:
    torch.manual_seed(0)
    # num_embeds_ada_norm=1000: the pipeline's classifier-free guidance uses class id 1000 as "no class".
    transformer = diffusers.DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=8, num_layers=2, sample_size=8,
        patch_size=2, num_embeds_ada_norm=1000, norm_num_groups=32,
    )
    vae = diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(32, 32), latent_channels=4,
        layers_per_block=1, norm_num_groups=8, sample_size=16,
    )
    # eval(): in train mode DiT's label embedding drops class labels at random.
    return transformer.eval(), vae.eval()


def _on(device: str, make: Callable[[], Any]) -> Any:
    pipe = make().to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _unet_pipeline(scheduler: str, minimal: bool = False) -> Callable[[], Any]:
    pipe_cls = {"ddpm": diffusers.DDPMPipeline, "ddim": diffusers.DDIMPipeline}[scheduler]
    sched_cls = {"ddpm": diffusers.DDPMScheduler, "ddim": diffusers.DDIMScheduler}[scheduler]
    unet = _unet(minimal)
    return lambda: pipe_cls(unet=copy.deepcopy(unet), scheduler=sched_cls(num_train_timesteps=100))


def _dit_pipeline() -> Callable[[], Any]:
    transformer, vae = _dit_parts()
    return lambda: diffusers.DiTPipeline(transformer=copy.deepcopy(transformer), vae=copy.deepcopy(vae),
                                         scheduler=diffusers.DDIMScheduler(num_train_timesteps=100))


def _images(pipe: Any, seed_mode: str, **kwargs: Any) -> torch.Tensor:
    if seed_mode == "generator":
        # A CPU generator: diffusers then draws on CPU and moves to the device, so the noise is identical.
        kwargs["generator"] = torch.Generator("cpu").manual_seed(0)
    else:
        torch.manual_seed(0)
    with torch.no_grad():
        out = pipe(output_type="pt", **kwargs).images
    return out.cpu()


@pytest.mark.parametrize("seed_mode", ["generator", "manual_seed"])
@pytest.mark.parametrize("scheduler", ["ddpm", "ddim"])
def test_unet_pipeline_matches_cpu(scheduler: str, seed_mode: str) -> None:
    make = _unet_pipeline(scheduler)
    kwargs = {"batch_size": 2, "num_inference_steps": 8}
    got = _images(_on("neuron", make), seed_mode, **kwargs)
    want = _images(_on("cpu", make), seed_mode, **kwargs)
    assert got.shape == (2, 3, 16, 16)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_dit_pipeline_matches_cpu() -> None:
    make = _dit_pipeline()
    kwargs = {"class_labels": [1, 3], "num_inference_steps": 5}
    pipe = _on("neuron", make)
    assert pipe.device.type == "neuron"
    got = _images(pipe, "generator", **kwargs)
    want = _images(_on("cpu", make), "generator", **kwargs)
    assert got.shape == (2, 3, 16, 16)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_dit_pipeline_bf16_close_to_cpu() -> None:
    transformer, vae = _dit_parts()

    def make() -> Any:
        return diffusers.DiTPipeline(transformer=copy.deepcopy(transformer).to(torch.bfloat16),
                                     vae=copy.deepcopy(vae).to(torch.bfloat16),
                                     scheduler=diffusers.DDIMScheduler(num_train_timesteps=100))

    kwargs = {"class_labels": [1, 3], "num_inference_steps": 3}
    got = _images(_on("neuron", make), "generator", **kwargs)
    want = _images(_on("cpu", make), "generator", **kwargs)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


def _flux_pipeline() -> Callable[[], Any]:
    parts = hf_tiny.flux_parts()
    return lambda: diffusers.FluxPipeline(**copy.deepcopy(parts))


def test_flux_pipeline_matches_cpu() -> None:
    """An MMDiT (Flux) pipeline: CLIP and T5 text encoders, the transformer, the VAE and a flow-match scheduler."""
    make = _flux_pipeline()
    pipe = _on("neuron", make)
    assert {p.device.type for p in pipe.transformer.parameters()} == {"neuron"}
    got = _images(pipe, "generator", **hf_tiny.FLUX_CALL)
    want = _images(_on("cpu", make), "generator", **hf_tiny.FLUX_CALL)
    assert got.shape == (2, 3, 32, 32)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_flux_tensor_parallel_on_two_cores_matches_cpu(tmp_path: Path) -> None:
    """Diffusers' Neuron tensor-parallel backend and its sharded from_pretrained, under torchrun (job_flux_tp.py)."""
    job = Path(__file__).resolve().parent / "job_flux_tp.py"
    (proc,) = run_processes([(torchrun_argv("--standalone", "--nproc-per-node", "2", str(job), str(tmp_path)), {})],
                        tmp_path, timeout=300)
    assert proc.rc == 0, proc.log()
    for rank in range(2):
        r = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert r["device"] == f"neuron:{rank}"
        # to_q (32 -> 32, colwise): each of the 2 cores holds half of the output features.
        for route in ("in_memory", "loaded"):
            assert r[f"{route}_local_q"] == ["DTensor", [16, 32], f"neuron:{rank}"], r
            assert r[f"{route}_max_diff"] < 1e-5, r
        assert r["pipeline_max_diff"] < 1e-5, r


_COMPILED = {
    # One block, no attention: cold compiles cost ~1 s per op group on 2 cores.
    "unet": (lambda: _unet_pipeline("ddim", minimal=True), "unet", {"batch_size": 2, "num_inference_steps": 4}),
    "dit": (_dit_pipeline, "transformer", {"class_labels": [1, 3], "num_inference_steps": 3}),
    "flux": (_flux_pipeline, "transformer", hf_tiny.FLUX_CALL),
}


@pytest.mark.parametrize("family", list(_COMPILED))
def test_compiled_pipeline_matches_cpu(family: str) -> None:
    """The denoiser compiled with backend "neuron" (fullgraph), the rest of the pipeline eager."""
    factory, denoiser, kwargs = _COMPILED[family]
    torch._dynamo.reset()
    make = factory()
    want = _images(_on("cpu", make), "generator", **kwargs)
    pipe = _on("neuron", make)
    setattr(pipe, denoiser, torch.compile(getattr(pipe, denoiser), backend="neuron", fullgraph=True))
    got = _images(pipe, "generator", **kwargs)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    torch._dynamo.reset()

