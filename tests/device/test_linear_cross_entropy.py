"""F.linear_cross_entropy's chunked path in bf16/fp16: neuron matches CPU once both compute the same thing.

Upstream resolves the chunked path's "auto" options by device type (CPU:
the "accurate" policy with float32 accumulation; any other device: "compact"
in the input dtype, with another chunk size). Given the same concrete
options, neuron must match CPU bit for bit; the OpInfo conformance harness
therefore runs both sides with the options resolved as for neuron
(:func:`torch_neuronx.testing.conformance.resolve_per_device_choices`), and
the samples that used to differ pass without an expected-failure entry.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn import LinearCrossEntropyOptions

from torch_neuronx.testing import conformance as h


def _run(device: str, x: torch.Tensor, w: torch.Tensor, t: torch.Tensor, options: LinearCrossEntropyOptions,
         reduction: str) -> list[torch.Tensor]:
    xx = x.detach().to(device).requires_grad_()
    ww = w.detach().to(device).requires_grad_()
    loss = F.linear_cross_entropy(xx, ww, t.to(device), options=options, reduction=reduction)
    loss.float().sum().backward()
    return [loss.detach().cpu(), xx.grad.cpu(), ww.grad.cpu()]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("policy", ["compact", "accurate", "balanced"])
def test_same_options_give_the_same_bits(dtype: torch.dtype, reduction: str, policy: str) -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(13, 24, generator=gen).to(dtype)  # 13: chunks of 4 leave a ragged last chunk
    w = torch.randn(37, 24, generator=gen).to(dtype)
    t = torch.randint(0, 37, (13,), generator=gen)
    t[5] = -100  # an ignored target
    options = LinearCrossEntropyOptions(acc_policy=policy, batch_chunk_size=4)
    for cpu, dev in zip(_run("cpu", x, w, t, options, reduction), _run("neuron", x, w, t, options, reduction),
                        strict=True):
        assert torch.equal(cpu, dev), (cpu - dev).abs().max()


def test_auto_options_resolve_as_on_neuron() -> None:
    sample = type("Sample", (), {})()
    sample.kwargs = {"options": LinearCrossEntropyOptions(), "reduction": "sum"}
    resolved = h.resolve_per_device_choices(sample, torch.bfloat16)
    opts = resolved.kwargs["options"]
    # upstream's picks for a device that is neither CPU nor CUDA: what a script gets on TorchNeuron
    assert (opts.acc_policy, opts.acc_dtype, opts.chunking_method) == ("compact", torch.bfloat16, "aspect_ratio:2")
    assert sample.kwargs["options"] == LinearCrossEntropyOptions() and resolved.kwargs["reduction"] == "sum"
    fp32 = h.resolve_per_device_choices(sample, torch.float32).kwargs["options"]
    assert fp32.acc_dtype == torch.float32
    explicit = type("Sample", (), {})()
    explicit.kwargs = {"options": LinearCrossEntropyOptions(acc_policy="accurate", batch_chunk_size=2)}
    assert h.resolve_per_device_choices(explicit, torch.bfloat16) is explicit  # nothing left to resolve
    plain = type("Sample", (), {})()
    plain.kwargs = {"reduction": "mean"}
    assert h.resolve_per_device_choices(plain, torch.bfloat16) is plain


def test_opinfo_chunked_samples_match_cpu() -> None:
    units = [("nn.functional.linear_cross_entropy.chunked", "bfloat16"),
             ("nn.functional.linear_cross_entropy.chunked_none", "bfloat16")]
    report = h.run_in_process(units)
    assert not report.notes, report.notes
    assert report.compared > 40, report.summary()
    failures = [o.describe() for o in report.failures]
    assert not failures, "\n".join(failures[:10])
