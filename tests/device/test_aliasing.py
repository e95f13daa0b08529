"""Overlapping and aliased arguments: neuron must raise where CPU raises, and compute what CPU computes elsewhere.

The fallback hands CPU kernels CPU views of device memory; views of one device
storage must share one alias storage within a call, or ATen's overlap checks
and clone-before-write guards go blind (running sums instead of errors).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

OVERLAP = "unsupported operation: some elements of the input tensor and the written-to tensor refer to a single"

Case = Callable[[torch.Tensor], object]

# Each case gets a fresh arange(8.) (or a 4x4 matrix) on the device and on CPU.
PARTIAL_OVERLAP: dict[str, Case] = {
    "add_ shifted": lambda x: x[1:].add_(x[:-1]),
    "copy_ shifted": lambda x: x[1:].copy_(x[:-1]),
    "copy_ shifted back": lambda x: x[:-1].copy_(x[1:]),
    "mul out= shifted": lambda x: torch.mul(x[:-1], 2, out=x[1:]),
    "add out= shifted": lambda x: torch.add(x[:-2], x[2:], out=x[1:-1]),
    "sub_ shifted": lambda x: x[2:].sub_(x[:-2]),
    "addcmul_ shifted": lambda x: x[1:].addcmul_(x[:-1], x[:-1]),
    "exp out= shifted": lambda x: torch.exp(x[:-1], out=x[1:]),
    "clamp out= shifted": lambda x: torch.clamp(x[:-1], 0, 3, out=x[1:]),
    "where out= shifted": lambda x: torch.where(x[:-1] > 2, x[:-1], x[1:], out=x[1:]),
}

# Aliasing that CPU accepts: the results must be CPU's, element for element.
ALLOWED: dict[str, Case] = {
    "add_ itself": lambda x: x.add_(x),
    "mul_ same view": lambda x: x.view(2, 4).mul_(x.view(2, 4)),
    "copy_ itself": lambda x: x.copy_(x),
    "copy_ same data other view": lambda x: x.view(8).copy_(x.view(2, 4).view(8)),
    "add out=input": lambda x: torch.add(x, 1, out=x),
    "copy_ disjoint halves": lambda x: x[:4].copy_(x[4:]),
    "add_ disjoint halves": lambda x: x[4:].add_(x[:4]),
    "interleaved": lambda x: x[::2].copy_(x[1::2]),
    "reversed via flip": lambda x: x.copy_(x.flip(0)),
    "index_copy_ from own slice": lambda x: x.index_copy_(0, torch.tensor([0, 1], device=x.device), x[6:]),
    "cumsum out= itself": lambda x: torch.cumsum(x, 0, out=x),
    "transpose add_": lambda x: x.view(2, 4)[:, :2].add_(x.view(2, 4)[:, 2:]),
}

MATRIX: dict[str, Case] = {
    "t() add_ (full overlap, other order)": lambda m: m.add_(m.t()),
    "mm out=input": lambda m: torch.mm(m, m, out=m),
    "addmm_ with self as mat": lambda m: m.addmm_(m, m),
    "cat out= input": lambda m: torch.cat([m[:2], m[2:]], out=m),
    "triu_ then view": lambda m: m.triu_().view(16).add_(1),
}


def _run(case: Case, make: Callable[[str], torch.Tensor], device: str) -> tuple[str, object]:
    x = make(device)
    try:
        case(x)
    except RuntimeError as exc:
        return "raise", str(exc).split("\n")[0]
    return "ok", x.cpu()


def _compare(case: Case, make: Callable[[str], torch.Tensor]) -> None:
    cpu = _run(case, make, "cpu")
    dev = _run(case, make, "neuron")
    assert dev[0] == cpu[0], (cpu, dev)
    if cpu[0] == "raise":
        assert dev[1] == cpu[1]
    else:
        assert torch.equal(dev[1], cpu[1]), (cpu[1], dev[1])  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(PARTIAL_OVERLAP))
def test_partial_overlap_raises_like_cpu(name: str) -> None:
    x = torch.arange(8.0, device="neuron")
    before = x.cpu()
    with pytest.raises(RuntimeError, match=OVERLAP):
        PARTIAL_OVERLAP[name](x)
    assert torch.equal(x.cpu(), before)  # nothing was written
    _compare(PARTIAL_OVERLAP[name], lambda d: torch.arange(8.0, device=d))


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_allowed_aliasing_matches_cpu(name: str) -> None:
    _compare(ALLOWED[name], lambda d: torch.arange(8.0, device=d))


@pytest.mark.parametrize("name", sorted(MATRIX))
def test_matrix_aliasing_matches_cpu(name: str) -> None:
    _compare(MATRIX[name], lambda d: torch.arange(16.0, device=d).view(4, 4) / 7)


def test_views_of_one_storage_share_an_alias_in_one_call() -> None:
    """Kernels' own aliasing checks (is_alias_of, overlap asserts) see device views of one storage as aliases."""
    idx = {d: torch.tensor([1, 2, 3], device=d) for d in ("cpu", "neuron")}
    cases: list[Case] = [
        lambda x: x.index_put_((idx[x.device.type],), x[0:3]),
        lambda x: x.index_put_((idx[x.device.type],), x[0:3], accumulate=True),
        lambda x: x.masked_scatter_(x > 3, x.flip(0)),
        lambda x: x.masked_fill_(x > 3, x[0]),
        lambda x: torch.index_select(x, 0, idx[x.device.type], out=x[:3]),
        lambda x: torch.gather(x, 0, idx[x.device.type], out=x[2:5]),
        lambda x: x.scatter_(0, idx[x.device.type], x[:3]),
        lambda x: torch.sort(x.flip(0), out=(x, torch.empty(8, dtype=torch.long, device=x.device))),
    ]
    for case in cases:
        _compare(case, lambda d: torch.arange(8.0, device=d))


def test_distinct_storages_with_equal_values_do_not_alias() -> None:
    a = torch.arange(8.0, device="neuron")
    b = a.clone()
    a[1:].add_(b[:-1])
    assert torch.equal(a.cpu(), torch.arange(8.0) + torch.cat([torch.zeros(1), torch.arange(7.0)]))


def test_out_resized_over_its_own_input() -> None:
    """An empty out= view of the input's storage is resized onto it, then written: CPU's result, both ways."""

    def grow_in_place(x: torch.Tensor) -> None:
        torch.add(x, 1, out=x[:0])

    def grow_past_storage(x: torch.Tensor) -> None:
        torch.add(torch.cat([x, x]), 1, out=x[:0])  # 16 elements: the storage is reallocated

    for case in (grow_in_place, grow_past_storage):
        _compare(case, lambda d: torch.arange(8.0, device=d))


# Found by the differential fuzzer (torch_neuronx.testing.fuzz); each failed before its fix.


def test_a_tensor_passed_twice_is_one_alias() -> None:
    """self and values are the same (empty) tensor: CPU sees one TensorImpl and reports full overlap."""
    _compare(lambda x: x.index_put_((torch.tensor([0], device=x.device),), x, accumulate=True),
             lambda d: torch.empty(0, device=d))


def test_out_resized_before_the_op_raises_keeps_the_new_shape() -> None:
    """cat(out=) resizes its output, then finds it overlaps an input and raises: the device tensor keeps the
    resize, as the CPU tensor does (the grown part is uninitialised on both)."""
    for device in ("cpu", "neuron"):
        t = torch.ones(1, device=device)
        with pytest.raises(RuntimeError, match=OVERLAP):
            torch.cat([t, t], out=t)
        assert t.shape == (2,) and t.untyped_storage().nbytes() == 8
