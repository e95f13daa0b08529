"""Jobs with one planted fault each, for tests/tools/test_check.py: `python check_faults.py FAULT DEVICE OUT`.

Each is an ordinary training script with nothing of the checker in it; the
checker must find the fault in the right layer. "clean" has none.
"""

from __future__ import annotations

import os
import sys

import torch


def train(device: str, steps: int = 5, nan_at: int | None = None, growing: bool = False,
          lr: float = 0.05) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    run = torch.compile(model, backend="neuron") if growing else model
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        x = torch.randn(4 + (step if growing else 0), 8, generator=g).to(device)
        loss = run(x).pow(2).mean()
        if step == nan_at:
            loss = loss * float("nan")  # a planted numerical fault
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def distributed(fault: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    world = int(os.environ["WORLD_SIZE"])
    shape = (world // 2,) if fault == "small_mesh" else (world,)  # the fault: a mesh of half the world
    mesh = init_device_mesh("neuron", shape)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)).to("neuron")
    if fault == "small_mesh":
        if mesh.get_coordinate() is not None:
            fully_shard(model, mesh=mesh)
    else:
        fully_shard(model, mesh=mesh)
        if fault == "double_shard":
            fully_shard(model, mesh=mesh)  # the fault: the model is sharded a second time
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(3):
        loss = model(torch.ones(2, 8, device="neuron")).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


def main() -> None:
    fault, device, out = sys.argv[1], sys.argv[2], sys.argv[3]
    if fault in ("double_shard", "small_mesh", "dist_clean"):
        return distributed(fault)
    if fault == "oom":  # about 64 MiB of weights, on a core given 32 MiB (TORCH_NEURONX_HBM_PER_CORE)
        torch.nn.Linear(4096, 4096).to(device)
        return None
    if fault == "near_full":  # 30 MiB held on a core given 32 MiB (TORCH_NEURONX_HBM_PER_CORE): 94%
        held = torch.zeros(30 * 2**18, device=device)  # noqa: F841  (kept alive through training)
    # "diverge": a Neuron-only assumption that changes the numbers (a learning rate picked by device)
    lr = 0.2 if fault == "diverge" and device == "neuron" else 0.05
    model = train(device, nan_at=3 if fault == "nan" else None, growing=fault == "recompile", lr=lr)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    if fault == "neuron_state":
        state["device"] = torch.device(device)  # the fault: a device object that only a neuron host can rebuild
    else:
        state = {k: v.cpu() for k, v in state.items()}
    torch.save(state, os.path.join(out, "model.pt"))
    return None


if __name__ == "__main__":
    main()
