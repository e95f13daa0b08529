"""The op tracker counts what ran on the device, and reports (or forbids) CPU fallbacks."""

from __future__ import annotations

import pytest
import torch

from torch_neuronx.tools import op_tracker


def test_counts_ops_run_on_device() -> None:
    a = torch.randn(4, 4, device="neuron")
    with op_tracker.track() as ops:
        b = a + a
        a.mm(b)
        a.mm(b)
        torch.relu(a)
    counts = {r.name: r.executed for r in ops}
    assert counts["aten::add.Tensor"] == 1
    assert counts["aten::mm"] == 2
    assert counts["aten::relu"] == 1
    assert all(r.fallback == 0 for r in ops)
    assert "aten::mm" in op_tracker.report()


def test_low_precision_gap_is_widened_not_a_fallback() -> None:
    """The host has no float16 ndtri kernel; Trainium computes it on a core. The emulator runs it in float32
    (counted as widened), which is no CPU fallback: it neither warns nor is refused when fallbacks are."""
    x = torch.rand(8, 8) * 0.8 + 0.1
    with pytest.raises(RuntimeError, match="not implemented for 'Half'"):
        torch.special.ndtri(x.half())
    ref = torch.special.ndtri(x.half().float()).half()
    op_tracker.allow_fallback(False)
    try:
        with op_tracker.track() as ops:
            out = torch.special.ndtri(x.half().neuron())
    finally:
        op_tracker.allow_fallback(True)
    assert out.dtype == torch.float16 and torch.equal(out.cpu(), ref)
    (rec,) = [r for r in ops if r.name == "aten::special_ndtri"]
    assert (rec.executed, rec.fallback, rec.widened) == (1, 0, 1)


def test_forbidden_fallback_raises_with_the_variable_to_unset() -> None:
    x = torch.ones(3, dtype=torch.float64, device="neuron")
    op_tracker.allow_fallback(False)
    try:
        with pytest.raises(RuntimeError, match="aten::mul.Tensor would fall back.*TORCH_NEURONX_FORBID_CPU_FALLBACK"):
            x * 2
    finally:
        op_tracker.allow_fallback(True)


WARN_ONCE = r"""
import warnings, torch
x = torch.rand(8, device="neuron").double()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(3):
        torch.exp(x)
        torch.sin(x)
print(sorted(str(w.message).split()[1] for w in caught if "falls back" in str(w.message)))
"""


def test_each_fallback_warns_once_per_op() -> None:
    """As TorchNeuron's fallbacks do: one warning per op for the process, however often it runs."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", WARN_ONCE], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "['aten::exp', 'aten::sin']"
