"""Fixtures of the compile tests: a private compile cache and a clean Dynamo per test."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

import torch_neuronx.compile  # noqa: F401  (registers the "neuron" backend)
from torch_neuronx.compile import cache, metrics


@pytest.fixture(scope="session", autouse=True)
def neff_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One cache directory for the session: graphs compiled by one test are disk hits for the next."""
    saved = {k: os.environ.get(k) for k in ("TORCH_NEURONX_NEFF_CACHE_DIR", "TORCH_NEURONX_DISABLE_NEFF_CACHE")}
    path = str(tmp_path_factory.mktemp("neff"))
    os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"] = path
    os.environ.pop("TORCH_NEURONX_DISABLE_NEFF_CACHE", None)
    yield path
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    cache.clear_memory()
    metrics.reset()
    yield
    torch._dynamo.reset()
