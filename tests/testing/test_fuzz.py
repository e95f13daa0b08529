"""The differential fuzzer (torch_neuronx.testing.fuzz) in CI: a fixed-seed slice of random programs, each run on
neuron and on CPU, must agree. Set TORCH_NEURONX_FUZZ_EXAMPLES to run more (any count, same seed)."""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from torch_neuronx.testing import fuzz

EXAMPLES = int(os.environ.get("TORCH_NEURONX_FUZZ_EXAMPLES", "400"))


@seed(20261203)
@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=False,
          suppress_health_check=list(HealthCheck))
@given(st.data())
def test_random_programs_agree_with_cpu(data: Any) -> None:
    fuzz.run_program(data)
