"""TorchNeuron usage: profiling a training step with torch_neuronx.profiling.NeuronProfiler (April-2026 form:
a context manager with PyTorch activities), then reading the PyTorch trace and its device (NEURON) time."""

import json
import os

import torch
from torch.profiler import ProfilerActivity

import torch_neuronx
from torch_neuronx.profiling import NeuronProfiler

model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).to("neuron")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(16, 32, device="neuron")

with NeuronProfiler(pytorch_activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                    neuron_output_dir="./profiles") as prof:
    model(x).square().mean().backward()
    opt.step()
    torch_neuronx.synchronize()

rows = {row.key: row for row in prof.pytorch_profiler.key_averages()}
assert rows["aten::addmm"].self_device_time_total > 0, "matmuls ran on the NeuronCore: they have device time"
trace = json.load(open(os.path.join("profiles", "pytorch_trace.json")))
device_events = [e for e in trace["traceEvents"] if e.get("args", {}).get("device") == "neuron:0"]
assert any(e["name"].startswith("aten::addmm") for e in device_events), sorted({e["name"] for e in device_events})
print("ok")
