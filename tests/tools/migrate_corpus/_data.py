"""Corpus (torch-neuronx migrate): the model and data the data-parallel corpus scripts share (plain PyTorch)."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

GLOBAL_BATCH = 16


class MLP(nn.Module):
    def __init__(self, d_in=32, hidden=64, classes=10):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def dataset(steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    n = steps * GLOBAL_BATCH
    return TensorDataset(torch.randn(n, 32, generator=g), torch.randint(0, 10, (n,), generator=g))


def loader(steps, rank, world_size):
    """This rank's shard of each global batch (GLOBAL_BATCH // world_size rows), in order."""
    ds = dataset(steps)
    sampler = DistributedSampler(ds, num_replicas=world_size, rank=rank, shuffle=False)
    return DataLoader(ds, batch_size=GLOBAL_BATCH // world_size, sampler=sampler)
