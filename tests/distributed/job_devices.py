"""Rank side of test_devices.py: TorchNeuron's per-rank device model under a "neuron" process group.

Each rank checks, before ``init_process_group``, that ``set_device(LOCAL_RANK)``
does not start the device and that every visible core counts; then, after it,
that the process owns exactly neuron:LOCAL_RANK with the messages TorchNeuron's
``NeuronDevice.cpp`` and ``torch_neuronx.set_device`` give for other indices.
With a 1 MB ``COLLECTIVE_BUCKETSIZE_IN_MB``, large all-gathers and
reduce-scatters run in bucket-sized pieces and still match the reference.
"""

from __future__ import annotations

import os
import threading

import torch
import torch.distributed as dist

from torch_neuronx.testing.jobs import Checks

checks = Checks()
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
LOCAL_WORLD = int(os.environ.get("LOCAL_WORLD_SIZE", "2"))
OTHER = 1 - LOCAL_RANK  # the other rank's device index (2 ranks)
before: dict[str, object] = {}


def setup() -> None:
    before["visible_cores_env"] = os.environ.get("NEURON_RT_VISIBLE_CORES")
    before["device_count"] = torch.neuron.device_count()
    torch.neuron.set_device(LOCAL_RANK)  # CUDA-style scripts and Transformers do this first
    before["initialized_after_set_device"] = torch.neuron.is_initialized()
    before["current_after_set_device"] = torch.neuron.current_device()
    torch.manual_seed(0)  # queued, does not start the device
    dist.init_process_group("neuron")


@checks
def before_the_process_group_every_core_counts() -> None:
    assert before["visible_cores_env"] is None, before
    assert before["device_count"] == 64, before  # trn2.48xlarge at LNC=2
    assert before["initialized_after_set_device"] is False, before
    assert before["current_after_set_device"] == LOCAL_RANK, before


@checks
def the_process_owns_neuron_local_rank() -> str:
    assert os.environ["NEURON_RT_VISIBLE_CORES"] == str(LOCAL_RANK)
    assert torch.neuron.device_count() == LOCAL_WORLD
    assert torch.accelerator.device_count() == LOCAL_WORLD
    assert torch.neuron.current_device() == LOCAL_RANK
    assert torch.accelerator.current_device_index() == LOCAL_RANK
    t = torch.ones(2, device="neuron")
    assert t.device == torch.device("neuron", LOCAL_RANK), t.device
    props = torch.neuron.get_device_properties()
    assert props.logical_core_id == LOCAL_RANK, props
    return f"{t.device}, {props}"


@checks
def set_device_refuses_other_indices() -> None:
    torch.neuron.set_device(LOCAL_RANK)  # its own index: fine
    for index, message in (
        (OTHER, f"Device index {OTHER} is out of range. Valid range is {LOCAL_RANK} to {LOCAL_RANK} for this process"),
        (LOCAL_WORLD, f"Invalid device id: {LOCAL_WORLD}. Valid range is 0 to {LOCAL_WORLD - 1}"),
        (-1, f"Invalid device id: -1. Valid range is 0 to {LOCAL_WORLD - 1}"),
    ):
        try:
            torch.neuron.set_device(index)
        except ValueError as e:
            assert message in str(e), e
        else:
            raise AssertionError(f"set_device({index}) was accepted")
    assert torch.neuron.current_device() == LOCAL_RANK


@checks
def other_indices_do_not_attach() -> None:
    attempts = {
        "empty": lambda: torch.empty(2, device=f"neuron:{OTHER}"),
        "to": lambda: torch.ones(2).to(f"neuron:{OTHER}"),
        "memory_allocated": lambda: torch.neuron.memory_allocated(OTHER),
        "get_device_properties": lambda: torch.neuron.get_device_properties(OTHER),
        "stream": lambda: torch.neuron.current_stream(OTHER),
    }
    for name, attempt in attempts.items():
        try:
            attempt()
        except (ValueError, RuntimeError) as e:
            assert "Attempted to access device that doesn't attach to this process" in str(e), (name, e)
            assert f"received {OTHER}" in str(e), (name, e)
        else:
            raise AssertionError(f"{name} on neuron:{OTHER} was accepted by rank {LOCAL_RANK}")
    try:
        torch.empty(2, device=f"neuron:{LOCAL_WORLD + 3}")
    except (ValueError, RuntimeError, IndexError) as e:
        assert f"Device index {LOCAL_WORLD + 3} is out of range. Valid range is 0 to {LOCAL_WORLD - 1}" in str(e), e
    else:
        raise AssertionError("an index beyond the node was accepted")


@checks
def new_threads_start_on_local_rank() -> None:
    seen: list[int] = []
    thread = threading.Thread(target=lambda: seen.append(torch.neuron.current_device()))
    thread.start()
    thread.join()
    assert seen == [LOCAL_RANK], seen


@checks
def training_step_and_rng_work() -> None:
    gen = torch.Generator().manual_seed(1)
    w_cpu = torch.randn(4, 3, generator=gen, requires_grad=True)
    x_cpu = torch.randn(5, 4, generator=gen)
    w = w_cpu.detach().to("neuron").requires_grad_()
    (x_cpu.to("neuron") @ w).square().sum().backward()  # autograd's per-device threads cover every index
    (x_cpu @ w_cpu).square().sum().backward()
    torch.testing.assert_close(w.grad.cpu(), w_cpu.grad)
    assert len(torch.neuron.default_generators) == 1
    torch.manual_seed(7)
    a = torch.rand(3, device="neuron")
    torch.manual_seed(7)
    assert torch.equal(a, torch.rand(3, device="neuron"))
    t = torch.full((2,), float(LOCAL_RANK + 1), device="neuron")
    dist.all_reduce(t)
    assert t.tolist() == [3.0, 3.0], t


# ---------------------------------------------------------------- bucketing (COLLECTIVE_BUCKETSIZE_IN_MB=1 here)

N = 300_001  # elements of one rank's shard: 1.2 MB in fp32, so a gathered fp32 tensor is 2.4 MB, 3 buckets of 1 MB
PER_PIECE = (1 << 20) // (4 * 2)  # fp32 elements of one rank's shard in one bucket (2 ranks)


def shard(rank: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (torch.arange(N, dtype=torch.float64) * (rank + 1) % 1000).to(dtype)


def stats() -> dict[str, dict[str, int]]:
    import torch_neuronx.distributed as nd

    return nd.comm_stats()


@checks
def large_all_gather_runs_in_buckets() -> str:
    import torch_neuronx.distributed as nd

    nd.reset_comm_stats()
    for dtype in (torch.float32, torch.bfloat16):
        out = torch.empty(2 * N, dtype=dtype, device="neuron")
        dist.all_gather_into_tensor(out, shard(LOCAL_RANK, dtype).to("neuron"))
        assert torch.equal(out.cpu(), torch.cat([shard(0, dtype), shard(1, dtype)]))
    stacked = torch.empty(2, N, device="neuron")  # NCCL's stacked form
    dist.all_gather_into_tensor(stacked, shard(LOCAL_RANK).to("neuron"))
    assert torch.equal(stacked.cpu(), torch.stack([shard(0), shard(1)]))
    small = torch.empty(4, device="neuron")
    dist.all_gather_into_tensor(small, torch.full((2,), float(LOCAL_RANK), device="neuron"))
    assert small.cpu().tolist() == [0.0, 0.0, 1.0, 1.0]
    s = stats()
    fp32_pieces = -(-N // PER_PIECE)
    bf16_pieces = -(-N // (2 * PER_PIECE))
    assert s["all_gather_into_tensor"]["calls"] == 4, s
    assert s["all_gather_into_tensor_pieces"]["calls"] == 2 * fp32_pieces + bf16_pieces, s
    assert s["all_gather_into_tensor_pieces"]["bytes"] == 2 * (2 * N * 4) + 2 * N * 2, s
    return str(s)


@checks
def large_reduce_scatter_runs_in_buckets() -> str:
    import torch_neuronx.distributed as nd

    nd.reset_comm_stats()
    full = [torch.cat([shard(r), shard(r + 5)]) for r in range(2)]  # each rank's 2 * N input
    out = torch.empty(N, device="neuron")
    dist.reduce_scatter_tensor(out, full[LOCAL_RANK].to("neuron"))
    expected = (full[0] + full[1]).view(2, N)[LOCAL_RANK]
    assert torch.equal(out.cpu(), expected)
    premul = torch.empty(N, device="neuron")  # FSDP2's gradient division
    dist.reduce_scatter_tensor(premul, full[LOCAL_RANK].to("neuron"), op=dist._make_nccl_premul_sum(0.5))
    torch.testing.assert_close(premul.cpu(), expected * 0.5)
    s = stats()
    assert s["reduce_scatter_tensor"]["calls"] == 2, s
    assert s["reduce_scatter_tensor_pieces"]["calls"] == 2 * -(-N // PER_PIECE), s
    return str(s)


if __name__ == "__main__":
    checks.main(setup=setup, teardown=dist.destroy_process_group)
