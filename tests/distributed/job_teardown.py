"""Rank side of test_teardown.py: tearing a neuron process group down while Gloo still finishes a collective.

Destroying the backend joins Gloo's worker thread, and that worker may need the GIL to finish its last Work (a
Python callback on the Work's future; a Python object, such as a torch function mode, captured in the Work's
thread-local state). When the last reference to the group goes from a path that holds the GIL (DDP's Reducer
freed with the module, the backend's own Python object, the garbage collector), the join used to wait forever for
a thread waiting for the GIL (seen in `torch-neuronx check` DDP jobs). Each check repeats the pattern; a
faulthandler watchdog turns a deadlock into a fast failure with every thread's stack, instead of a hang.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.overrides import TorchFunctionMode

from torch_neuronx.testing.jobs import Checks

checks = Checks()
RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "2"))
ROUNDS = 3
LATE_S = 0.3  # rank 1 joins the last collective late, so that rank 0 tears down while it is in flight
WATCHDOG_S = 90


class PassThrough(TorchFunctionMode):
    """A Python mode that changes nothing: the Works created under it hold it in their thread-local state."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def dev() -> torch.device:
    return torch.device("neuron", torch.neuron.current_device())


def teardown_round(last_holder: str) -> str:
    """A DDP step with dropout, then an all-reduce still in flight when the group is destroyed and its last
    reference dropped from `last_holder` ("reducer": the DDP module; "backend": the backend's Python object)."""
    group = dist.new_group(list(range(WORLD)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1)).to(dev())
    ddp = DistributedDataParallel(model, process_group=group)
    backend = group._get_backend(dev()) if last_holder == "backend" else None
    finished: list[float] = []
    with PassThrough():
        ddp(torch.randn(4, 8).to(dev())).pow(2).mean().backward()
        if RANK == 1:
            time.sleep(LATE_S)
        total = torch.full((4,), float(RANK + 1), device=dev())
        work = dist.all_reduce(total, group=group, async_op=True)
        work.get_future().then(lambda fut: finished.append(float(fut.value()[0].sum())))
    del work
    dist.destroy_process_group(group)
    del group
    if last_holder == "backend":
        del ddp
        gc.collect()
        del backend  # the last reference: ProcessGroupNeuron's Python object
    else:
        del ddp  # the last reference: DDP's Reducer, freed with the module
    gc.collect()
    expected = float(sum(range(1, WORLD + 1)))
    assert finished == [expected * 4], finished  # the in-flight all-reduce finished, right, before the join
    assert torch.equal(total.cpu(), torch.full((4,), expected)), total
    return "ok"


def rounds(last_holder: str) -> str:
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True, file=sys.stderr)
    try:
        for _ in range(ROUNDS):
            teardown_round(last_holder)
    finally:
        faulthandler.cancel_dump_traceback_later()
    return f"{ROUNDS} rounds"


@checks
def ddp_reducer_holds_the_last_reference() -> str:
    return rounds("reducer")


@checks
def backend_object_holds_the_last_reference() -> str:
    return rounds("backend")


def setup() -> None:
    dist.init_process_group("neuron")


def teardown() -> None:
    """The world group goes the same way: DDP on it, destroyed, the module freed last (at the job's end)."""
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True, file=sys.stderr)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.3)).to(dev())
    ddp = DistributedDataParallel(model)
    with PassThrough():
        ddp(torch.randn(4, 8).to(dev())).sum().backward()
    dist.destroy_process_group()
    del ddp
    gc.collect()
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    checks.main(setup=setup, teardown=teardown)
