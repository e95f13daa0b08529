"""TorchNeuron usage: TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS=1 keeps the artifacts of each compiled graph
under TORCH_NEURONX_DEBUG_DIR, one folder per kind, proc_{rank} per process (the runner sets both variables)."""

import os
import pathlib

import torch

import torch_neuronx  # noqa: F401

root = pathlib.Path(os.environ["TORCH_NEURONX_DEBUG_DIR"])
model = torch.compile(torch.nn.Linear(4, 4).to("neuron"), backend="neuron")
model(torch.randn(2, 4, device="neuron")).sum().backward()
for kind in ("fx_graphs", "stablehlo", "neff"):
    files = list((root / kind / "proc_0").iterdir())
    assert files, kind
    assert all(f.name.startswith("model_default_") for f in files), files
print("ok")
