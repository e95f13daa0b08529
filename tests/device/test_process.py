"""Processes and threads: autoload, fork safety, thread-safe allocation and copies, visible cores."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import torch

ENV = {k: v for k, v in os.environ.items() if not k.startswith(("NEURON_", "TORCH_NEURONX_", "TORCH_DEVICE_"))}


def run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env={**ENV, **env}, capture_output=True, text=True,
                          timeout=120)


def test_autoload_on_import_torch() -> None:
    r = run("import torch; print(torch.neuron.device_count(), torch.ones(2, device='neuron').device)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["64", "neuron:0"]


def test_autoload_can_be_disabled() -> None:
    r = run("import sys, torch; print(hasattr(torch, 'neuron'), 'torch_neuronx' in sys.modules)",
            TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False"]


def test_visible_cores_and_instance_from_environment() -> None:
    r = run("import torch; p = torch.neuron.get_device_properties(1); "
            "print(torch.neuron.device_count(), p.name, p.logical_core_id, p.total_memory)",
            TORCH_NEURONX_INSTANCE_TYPE="trn1.32xlarge", NEURON_RT_VISIBLE_CORES="4-7")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["4", "trn1", "5", str(16 << 30)]


def test_bad_environment_gives_clear_error() -> None:
    r = run("import torch; torch.ones(1, device='neuron')", TORCH_NEURONX_INSTANCE_TYPE="trn9.huge")
    assert r.returncode != 0 and "not a known instance" in r.stderr and "Segmentation" not in r.stderr


def test_hbm_override_from_environment() -> None:
    r = run("import torch\ntry:\n    torch.empty(2**20, device='neuron')\nexcept torch.OutOfMemoryError as e:\n"
            "    print('OOM', 'neuron:0' in str(e))", TORCH_NEURONX_HBM_PER_CORE="1MiB")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["OOM", "True"]


def child_exit_code(parent_setup: str, child_body: str) -> int:
    """Run `parent_setup`, fork, run `child_body` in the child (it calls os._exit), return its exit code."""
    code = f"import os, torch\n{parent_setup}\npid = os.fork()\nif pid == 0:\n"
    code += "".join(f"    {line}\n" for line in child_body.splitlines())
    code += "_, status = os.waitpid(pid, 0)\nprint(os.waitstatus_to_exitcode(status))\n"
    r = run(code)
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip())


def test_forked_child_cannot_use_initialised_device() -> None:
    child = (
        "try:\n"
        "    torch.ones(1, device='neuron')\n"
        "    os._exit(3)\n"
        "except RuntimeError as e:\n"
        "    os._exit(0 if 'spawn' in str(e) and torch.neuron._is_in_bad_fork() else 4)"
    )
    assert child_exit_code("torch.ones(1, device='neuron')", child) == 0


def test_fork_before_initialisation_is_fine() -> None:
    child = "os._exit(0 if torch.ones(2, device='neuron').sum().item() == 2 else 5)"
    assert child_exit_code("", child) == 0


def test_allocation_and_copies_from_threads() -> None:
    # Transformers materialises weights from 4 threads.
    sources = [torch.randn(64, 64) for _ in range(32)]
    results: list[torch.Tensor | None] = [None] * len(sources)
    base = torch.neuron.memory_allocated()

    def load(i: int) -> None:
        for j in range(i, len(sources), 4):
            t = sources[j].to("neuron")
            results[j] = (t * 2).to("neuron")

    threads = [threading.Thread(target=load, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r, s in zip(results, sources, strict=True):
        assert r is not None and torch.equal(r.cpu(), s * 2)
    assert torch.neuron.memory_allocated() - base == 32 * 64 * 64 * 4


def test_importing_the_plugin_before_torch() -> None:
    r = run("import torch_neuronx, torch; print(torch.ones(2, device='neuron').sum().item())")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "2.0"


def test_command_line_info() -> None:
    r = subprocess.run([sys.executable, "-m", "torch_neuronx", "info", "--json"], capture_output=True, text=True,
                       env={**ENV, "TORCH_NEURONX_INSTANCE_TYPE": "trn1.2xlarge"}, timeout=120)
    assert r.returncode == 0, r.stderr
    import json

    data = json.loads(r.stdout)
    assert (data["instance_type"], data["visible_cores"], data["hbm_per_core_bytes"]) == ("trn1.2xlarge", 2, 16 << 30)


LAZY = r"""
import torch
torch.manual_seed(0)
assert not torch.neuron.is_initialized(), "seeding initialised the device"
assert torch.neuron.device_count() == 64 and torch.neuron.get_device_properties(3).name == "trn2"
assert torch.neuron.is_available() and not torch.neuron._initialized
torch.neuron.manual_seed(7)  # queued too: the latest seeding call for the current core wins there
assert not torch.neuron.is_initialized()
x = torch.randn(4, device="neuron")
assert torch.neuron.is_initialized() and torch.neuron._initialized
assert torch.neuron.initial_seed() == 7 and torch.neuron.default_generators[5].initial_seed() == 0
torch.manual_seed(7)
assert torch.equal(x.cpu(), torch.randn(4)), "the first draw on neuron is the CPU's draw after the same seed"
print("ok")
"""


def test_seeding_is_queued_until_the_device_is_used() -> None:
    """torch.cuda's contract: torch.manual_seed does not initialise the device; the seed applies at first use."""
    r = run(LAZY)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def test_a_failing_queued_call_reports_where_it_was_made() -> None:
    code = ("import torch\nfrom torch_neuronx.device import _lazy_call\n"
            "def broken():\n    raise ValueError('queued and broken')\n"
            "_lazy_call(broken)\n"
            "try:\n    torch.zeros(1, device='neuron')\nexcept Exception as e:\n    print(type(e).__name__, e)\n")
    r = run(code)
    assert r.returncode == 0, r.stderr
    assert "queued and broken" in r.stdout and "It was made at" in r.stdout


def test_exit_after_a_backward_pass_never_aborts() -> None:
    """torch 2.13 keeps a Python object in each backward pass's thread-local state; an autograd worker thread of
    the device that still held the last pass when Python finalized aborted the process ("terminate called
    without an active exception") in about a third of the exits. Several exits, each after a backward pass."""
    code = ("import torch\n"
            "x = torch.randn(3, device='neuron', requires_grad=True)\n"
            "(x * 2).sum().backward()\n"
            "assert x.grad.tolist() == [2.0, 2.0, 2.0]\n")
    codes = [run(code).returncode for _ in range(6)]
    assert codes == [0] * 6, codes
