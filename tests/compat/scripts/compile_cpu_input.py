"""TorchNeuron usage: a CPU tensor into a compiled model (autocopy), and the compile metrics."""

import re

import torch

import torch_neuronx

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
x = torch.randn(4, 8)
expected = model(x)
compiled = torch.compile(model, backend="neuron")
out = compiled(x)  # CPU input: copied to the device; the output stays there
assert out.device.type == "neuron", out.device
torch.testing.assert_close(out.cpu(), expected)

metrics = torch_neuronx.get_dynamo_metrics()
assert len(metrics) == 1
assert re.fullmatch(r"model_default_\d+_\w+_\d+", metrics[0].graph_name), metrics[0].graph_name
assert metrics[0].graph_node_count > 0
torch_neuronx.reset_dynamo_metrics()
assert torch_neuronx.get_dynamo_metrics() == []
print("ok")
