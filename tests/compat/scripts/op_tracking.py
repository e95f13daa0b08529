"""TorchNeuron usage: op tracking around a forward pass (torch_neuronx.get_fallback_ops / get_executed_ops /
clear_op_tracking), as TorchNeuron's own tests use it."""

import torch

import torch_neuronx

model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to("neuron")
x = torch.randn(8, 16, device="neuron")

torch_neuronx.clear_op_tracking()
out = model(x)
torch.neuron.synchronize()
executed, fallback = torch_neuronx.get_executed_ops(), torch_neuronx.get_fallback_ops()
assert isinstance(executed, list) and all(isinstance(n, str) for n in executed)
assert len(executed) == len(set(executed)), "names are deduplicated"
assert "aten::addmm" in executed and "aten::relu" in executed, executed
assert fallback == [], fallback

# A decomposition TorchNeuron runs on the CPU, and float64 work, are fallbacks.
torch_neuronx.clear_op_tracking()
q, r = torch.linalg.qr(torch.randn(6, 6, device="neuron"))
(x.double() * 2).sum()
torch.neuron.synchronize()
fallback = torch_neuronx.get_fallback_ops()
assert "aten::linalg_qr" in fallback and "aten::mul.Tensor" in fallback, fallback
assert q.device.type == "neuron"
torch_neuronx.clear_op_tracking()
assert torch_neuronx.get_fallback_ops() == [] and torch_neuronx.get_executed_ops() == []
print("ok")
