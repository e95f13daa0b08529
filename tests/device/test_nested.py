"""Nested tensors on neuron, strided and jagged, forward and backward, against the same code on CPU (issue 22:
they used to abort the process). Each case runs in a child process, so that an abort fails the test instead of
killing the run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from torch_neuronx.testing.workers import BASE_ENV

CASES = r"""
import json, sys, warnings
import torch
import torch.nn.functional as F
warnings.simplefilter("ignore")
case, device = sys.argv[1], sys.argv[2]

def leaves():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(3, 8, generator=g).to(device).requires_grad_()
    b = torch.randn(5, 8, generator=g).to(device).requires_grad_()
    return a, b

def out(*ts):
    return [t.detach().cpu().tolist() for t in ts]

a, b = leaves()
if case == "strided":
    nt = torch.nested.as_nested_tensor([a, b])                # strided layout
    w = torch.linspace(-1, 1, 32, device=device).reshape(4, 8)
    y = torch.nn.functional.softmax(F.linear(nt, w).relu(), dim=-1)
    padded = y.to_padded_tensor(0.0)
    (padded * torch.arange(4.0, device=device)).sum().backward()
    result = out(padded, a.grad, b.grad) + [[t.shape[0] for t in y.unbind()]]
elif case == "jagged_sdpa":
    nt = torch.nested.as_nested_tensor([a, b], layout=torch.jagged)
    q = nt.unflatten(-1, (2, 4)).transpose(1, 2)
    o = F.scaled_dot_product_attention(q, q, q)
    o.values().square().sum().backward()
    result = out(o.values(), a.grad, b.grad)
elif case == "jagged_no_grad":
    with torch.no_grad():
        nt = torch.nested.as_nested_tensor([a, b], layout=torch.jagged)
        q = nt.unflatten(-1, (2, 4)).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, q, q, is_causal=False)
    result = out(o.values())
elif case == "from_dense":
    t = torch.arange(24.0, device=device).reshape(2, 3, 4)
    nt = torch.nested.as_nested_tensor(t)                      # a view of the dense buffer
    nt2 = torch.nested.nested_tensor([torch.ones(2, 2, device=device), torch.zeros(1, 2, device=device)])
    result = out(nt.to_padded_tensor(-1.0), (nt2 * 3).to_padded_tensor(0.0)) + [str(nt.device), str(nt2.device)]
print(json.dumps(result))
"""


def run(case: str, device: str) -> list:
    r = subprocess.run([sys.executable, "-c", CASES, case, device], env=BASE_ENV, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, f"{device} rc={r.returncode}\n{r.stderr[-3000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", ["strided", "jagged_sdpa", "jagged_no_grad", "from_dense"])
def test_nested_tensors_match_cpu(case: str) -> None:
    cpu, neuron = run(case, "cpu"), run(case, "neuron")
    if case == "from_dense":
        assert neuron[-2:] == ["neuron:0", "neuron:0"] and cpu[-2:] == ["cpu", "cpu"]
        cpu, neuron = cpu[:-2], neuron[:-2]
    import torch

    for c, n in zip(cpu, neuron, strict=True):
        torch.testing.assert_close(torch.tensor(n), torch.tensor(c), rtol=1e-5, atol=1e-5)


def test_an_op_without_a_nested_kernel_raises_a_python_error() -> None:
    import torch

    nt = torch.nested.as_nested_tensor([torch.ones(2, 3, device="neuron"), torch.ones(1, 3, device="neuron")])
    with pytest.raises(NotImplementedError):  # CPU has no nested cumsum either
        torch.cumsum(nt, dim=1)
    cpu = torch.nested.as_nested_tensor([torch.ones(2, 3), torch.ones(1, 3)])
    with pytest.raises(NotImplementedError):
        torch.cumsum(cpu, dim=1)
