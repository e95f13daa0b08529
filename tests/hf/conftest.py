"""Fixtures of the Hugging Face tests: offline hub, one thread, a tiny saved model, clean accelerate state."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Before transformers is imported anywhere: nothing may reach the network.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import pytest  # noqa: E402
import torch  # noqa: E402

from torch_neuronx.testing import hf as hf_tiny  # noqa: E402

# The models are tiny; extra threads only contend with the other jobs on the runner.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    return hf_tiny.tokenizer()


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> Path:
    """A tiny random Llama saved with its tokenizer, as a Hub checkpoint would be."""
    path = tmp_path_factory.mktemp("tiny_llama")
    hf_tiny.llama().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(autouse=True)
def _quiet_transformers() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


@pytest.fixture
def clean_accelerate(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Accelerate keeps process-wide singletons and env vars; each training test starts from scratch."""
    from accelerate.state import AcceleratorState, GradientState

    for var in ("ACCELERATE_MIXED_PRECISION", "ACCELERATE_DYNAMO_BACKEND", "ACCELERATE_DYNAMO_MODE",
                "ACCELERATE_DYNAMO_USE_DYNAMIC", "ACCELERATE_DYNAMO_USE_FULLGRAPH"):
        monkeypatch.delenv(var, raising=False)
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
