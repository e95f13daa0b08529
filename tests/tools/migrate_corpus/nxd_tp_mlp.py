"""Corpus (torch-neuronx migrate): a tensor-parallel MLP with NeuronX Distributed's parallel layers.

    torchrun --nproc-per-node 2 nxd_tp_mlp.py --steps 3 --out OUT
"""
import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch_xla.core.xla_model as xm
from neuronx_distributed.parallel_layers import ColumnParallelLinear, RowParallelLinear, parallel_state


class TPMLP(nn.Module):
    def __init__(self, d=32, hidden=64, classes=8):
        super().__init__()
        # the hidden dim is split over the tensor-parallel ranks
        self.up = ColumnParallelLinear(d, hidden, bias=True, gather_output=False)
        self.down = RowParallelLinear(hidden, classes, bias=True, input_is_parallel=True)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default="out")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dist.init_process_group("xla")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    device = xm.xla_device()
    torch.manual_seed(0)
    model = TPMLP().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(args.steps):
        x, y = torch.randn(8, 32, generator=g), torch.randint(0, 8, (8,), generator=g)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
        xm.mark_step()
        losses.append(loss.item())
    with open(os.path.join(args.out, f"losses_rank{tp_rank}.json"), "w") as f:
        json.dump(losses, f)


if __name__ == "__main__":
    main()
