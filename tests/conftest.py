"""Shared fixtures: the neuron device and a CPU reference for every test."""

from __future__ import annotations

import pytest
import torch

import torch_neuronx  # noqa: F401  (registers the device even with autoload off)


@pytest.fixture
def dev() -> torch.device:
    return torch.device("neuron:0")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
