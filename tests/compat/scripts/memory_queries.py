"""TorchNeuron usage: the memory functions at the top level of torch_neuronx, and their torch.neuron twins."""

import torch

import torch_neuronx

torch_neuronx.empty_cache()
torch_neuronx.reset_peak_memory_stats()
base = torch_neuronx.memory_allocated()
x = torch.empty(1 << 20, dtype=torch.float32, device="neuron")  # 4 MiB
torch.neuron.synchronize()
assert torch_neuronx.memory_allocated() - base == 4 << 20
assert torch_neuronx.max_memory_allocated() >= base + (4 << 20)
assert torch_neuronx.memory_reserved() >= torch_neuronx.memory_allocated()
assert torch_neuronx.max_memory_reserved() >= torch_neuronx.memory_reserved()
stats = torch_neuronx.memory_stats()
assert stats["allocated_bytes.all.current"] == torch_neuronx.memory_allocated()
assert "Allocated memory" in torch_neuronx.memory_summary()
del x
torch_neuronx.empty_cache()
assert torch_neuronx.memory_allocated() == base
torch_neuronx.reset_accumulated_memory_stats()
assert torch_neuronx.memory_stats().get("allocation.all.allocated", 0) == 0
assert torch_neuronx.memory_allocated is torch.neuron.memory_allocated

# Devices and streams, as TorchNeuron's README shows them.
assert torch_neuronx.device_count() == torch.neuron.device_count() >= 1
torch_neuronx.set_device(0)
assert torch_neuronx.current_device() == 0
assert torch_neuronx.is_neuron_runtime_initialized()
props = torch_neuronx.get_device_properties(0)
assert props.total_memory > 0
with torch_neuronx.device(0):
    s = torch_neuronx.Stream()
    with torch_neuronx.stream(s):
        assert torch_neuronx.current_stream() == s
    e = torch_neuronx.Event()
    e.record()
    torch_neuronx.synchronize()
try:
    torch_neuronx.set_device(torch_neuronx.device_count())
except ValueError as err:  # TorchNeuron raises ValueError("Invalid device id: ...")
    assert "Invalid device id" in str(err)
else:
    raise AssertionError("an invalid device id was accepted")
print("ok")
