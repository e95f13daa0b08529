"""TorchNeuron usage: TORCH_NEURONX_RETAIN_DEVICE_MODE=1 returns outputs to the inputs' device (the runner sets it)."""

import torch

import torch_neuronx  # noqa: F401

model = torch.nn.Linear(4, 2)
x = torch.randn(3, 4)
out = torch.compile(model, backend="neuron")(x)
assert out.device.type == "cpu"
torch.testing.assert_close(out, model(x))
print("ok")
