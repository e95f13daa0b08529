"""RNG: the same seed gives the same numbers on neuron as on CPU; state save/restore is exact."""

from __future__ import annotations

import pytest
import torch


def test_same_seed_same_numbers_as_cpu() -> None:
    def draw(device: str) -> list[torch.Tensor]:
        torch.manual_seed(1234)
        out = [torch.randn(5, device=device), torch.rand(3, 3, device=device)]
        out.append(torch.randint(0, 10, (6,), device=device))
        out.append(torch.empty(4, device=device).uniform_(-1, 1))
        out.append(torch.nn.functional.dropout(torch.ones(16, device=device), 0.5))
        out.append(torch.randperm(8, device=device))
        return [t.cpu() for t in out]

    for a, b in zip(draw("neuron"), draw("cpu"), strict=True):
        assert torch.equal(a, b)


def test_module_init_on_device_matches_cpu() -> None:
    torch.manual_seed(7)
    ref = torch.nn.Linear(8, 8)
    torch.manual_seed(7)
    dev = torch.nn.Linear(8, 8, device="neuron")
    assert torch.equal(dev.weight.cpu(), ref.weight) and torch.equal(dev.bias.cpu(), ref.bias)


def test_get_set_rng_state_replays() -> None:
    torch.neuron.manual_seed(3)
    torch.randn(10, device="neuron")
    state = torch.neuron.get_rng_state()
    assert state.dtype == torch.uint8 and state.numel() == 16  # CUDA-style (seed, offset)
    a = torch.randn(10, device="neuron")
    torch.neuron.set_rng_state(state)
    b = torch.randn(10, device="neuron")
    assert torch.equal(a.cpu(), b.cpu())
    seed, offset = state.view(torch.int64).tolist()
    assert seed == 3 and offset == 12  # 10 draws, rounded up to 4 as Philox counts


def test_offset_states_are_deterministic_across_generators() -> None:
    # DTensor's RNG tracker moves the offset to each shard's start: any generator
    # given the same (seed, offset) must produce the same numbers.
    state = torch.tensor([11, 400], dtype=torch.int64).view(torch.uint8)
    g1, g2 = torch.Generator(device="neuron"), torch.Generator(device="neuron")
    g1.set_state(state)
    g2.set_state(state)
    assert torch.equal(torch.randn(6, device="neuron", generator=g1).cpu(),
                       torch.randn(6, device="neuron", generator=g2).cpu())


def test_fork_rng_and_checkpoint_recompute() -> None:
    x = torch.randn(4, 8, device="neuron", requires_grad=True)
    lin = torch.nn.Linear(8, 8).neuron()

    def block(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(lin(t), 0.5, training=True).sum()

    torch.manual_seed(0)
    torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False).backward()
    g_ckpt = x.grad.clone()
    x.grad = None
    torch.manual_seed(0)
    block(x).backward()
    assert torch.equal(g_ckpt.cpu(), x.grad.cpu())


def test_generators_are_per_device_and_seeded_by_manual_seed() -> None:
    torch.manual_seed(5)
    assert torch.neuron.initial_seed() == 5
    assert all(s.view(torch.int64)[0].item() == 5 for s in torch.neuron.get_rng_state_all()[:3])
    torch.neuron.manual_seed(9)
    assert torch.neuron.initial_seed() == 9
    assert torch.neuron.default_generators[1].initial_seed() == 5


def test_bad_state_is_refused() -> None:
    with pytest.raises(TypeError, match="16 bytes"):
        torch.neuron.set_rng_state(torch.zeros(5056, dtype=torch.uint8))


def test_cpu_generator_with_device_tensor_is_refused() -> None:
    with pytest.raises(RuntimeError, match="Expected a 'neuron' device type for generator"):
        torch.randn(3, device="neuron", generator=torch.Generator())


def test_a_state_replays_however_many_were_taken_since() -> None:
    torch.neuron.manual_seed(11)
    torch.rand(5, device="neuron")  # off the seed's own point (offset 0 is reached by reseeding too)
    first = torch.neuron.get_rng_state()
    expected = torch.randn(8, device="neuron").cpu()
    for _ in range(100):  # more states than any cache would hold
        torch.neuron.get_rng_state()
        torch.rand(3, device="neuron")
    torch.neuron.set_rng_state(first)
    assert torch.equal(torch.randn(8, device="neuron").cpu(), expected)
    for _ in range(3):  # and again: restoring does not consume the state
        torch.neuron.set_rng_state(first)
        assert torch.equal(torch.randn(8, device="neuron").cpu(), expected)


def test_copied_or_edited_states_reseed_deterministically() -> None:
    torch.neuron.manual_seed(5)
    torch.rand(10, device="neuron")
    state = torch.neuron.get_rng_state()
    copy = state.clone()
    torch.neuron.set_rng_state(copy)
    a = torch.rand(4, device="neuron").cpu()
    torch.neuron.set_rng_state(state.clone())
    b = torch.rand(4, device="neuron").cpu()
    assert torch.equal(a, b)  # a copy names (seed, offset): the same numbers each time
    edited = torch.neuron.get_rng_state()
    edited.view(torch.int64)[1] += 4  # an in-place shift (DTensor moves offsets): no longer the snapshot's point
    torch.neuron.set_rng_state(edited)
    c = torch.rand(4, device="neuron").cpu()
    torch.neuron.set_rng_state(edited)
    assert torch.equal(torch.rand(4, device="neuron").cpu(), c)


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_checkpointing_forty_dropout_layers_matches_plain_backward(device: str) -> None:
    """Activation checkpointing restores the RNG state of every layer: with more layers than states any
    cache holds, recomputed dropout masks must still be the forward's (gradients equal to no checkpointing)."""
    layers = 40
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(layers)).to(device)
    x = torch.randn(4, 16, device=device)

    def run(checkpointed: bool) -> list[torch.Tensor]:
        blocks.zero_grad()
        torch.manual_seed(123)
        h = x
        for block in blocks:
            def step(t: torch.Tensor, block: torch.nn.Module = block) -> torch.Tensor:
                return torch.nn.functional.dropout(torch.tanh(block(t)), 0.3, training=True)
            h = torch.utils.checkpoint.checkpoint(step, h, use_reentrant=False) if checkpointed else step(h)
        h.sum().backward()
        return [b.weight.grad.cpu().clone() for b in blocks]

    plain, ckpt = run(False), run(True)
    wrong = [i for i, (a, b) in enumerate(zip(plain, ckpt, strict=True)) if not torch.equal(a, b)]
    assert wrong == []


def _state(seed: int, offset: int) -> torch.Tensor:
    return torch.tensor([seed, offset], dtype=torch.int64).view(torch.uint8)


@pytest.mark.parametrize("offset", [0, 4, 32, 1000])
def test_a_named_state_is_that_position_of_the_seeds_stream(offset: int) -> None:
    """(seed, offset) with no snapshot behind it puts the engine `offset` draws into manual_seed(seed)'s stream:
    rand draws once per element, so it continues CPU's rand(…) of the same seed at element `offset`."""
    torch.manual_seed(3)
    stream = torch.rand(offset + 64)  # CPU, the reference
    torch.neuron.set_rng_state(_state(3, offset))
    assert torch.equal(torch.rand(64, device="neuron").cpu(), stream[offset:])
    # again, from a point behind the last one set (the walk restarts from the seed), and from one ahead of it
    torch.neuron.set_rng_state(_state(3, offset // 2))
    assert torch.equal(torch.rand(8, device="neuron").cpu(), stream[offset // 2: offset // 2 + 8])


def test_a_state_too_far_to_walk_reseeds_deterministically() -> None:
    far = _state(3, 1 << 40)  # a long run's state, loaded from a file: no walk of 2^40 draws
    torch.neuron.set_rng_state(far)
    a = torch.rand(8, device="neuron").cpu()
    torch.neuron.set_rng_state(far)
    assert torch.equal(torch.rand(8, device="neuron").cpu(), a)
    torch.manual_seed(3)
    assert not torch.equal(torch.rand(8), a)
