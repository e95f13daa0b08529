"""Runs ``python -m torchtitan.train`` unmodified, with one bridge for torch 2.13 and an optional probe.

Bridge: TorchTitan 0.3.0 targets a PyTorch nightly that has ``torch.distributed.set_timeout``; torch 2.13 does
not, and the trainer calls it right after the first step (``torchtitan.distributed.utils.set_pg_timeouts``). Only
when the attribute is missing, this launcher supplies it: the timeout goes to every backend of the group that has
``_set_default_timeout`` (what torch's own ``_set_pg_timeout`` does for Gloo and NCCL; torch_neuronx's
ProcessGroupNeuron has it too), else it stays as set at init (``--comm.init_timeout_seconds``). Everything
else (arguments, the torchrun environment) goes to ``torchtitan.train`` as is.

Probe (only when ``TITAN_PROBE_DIR`` is set; test_torchtitan.py uses it): an Inductor pre-grad pass that only
reads the graphs records every FlexAttention call Inductor compiles (device, whether it needs gradients), and
after training ``rank<RANK>.json`` in that folder holds them with the device TorchTitan trained on. Pre-grad
passes run after Inductor's cache lookup, so a probed run needs a fresh ``TORCHINDUCTOR_CACHE_DIR``.

Usage: ``[torchrun ...] tests/titan/titan_launch.py --module llama3 --config llama3_debugmodel ...``
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist


def _set_timeout(timeout: timedelta, group: dist.ProcessGroup | None = None) -> None:
    from torch.distributed import distributed_c10d as c10d

    group = c10d._get_default_group() if group is None else group
    for device in group._device_types:
        try:
            backend = group._get_backend(device)
        except RuntimeError:
            continue
        if hasattr(backend, "_set_default_timeout"):
            backend._set_default_timeout(timeout)


if not hasattr(dist, "set_timeout"):
    dist.set_timeout = _set_timeout


def _install_probe() -> list[dict[str, object]]:
    import torch._inductor.config as inductor_config
    from torch._inductor.custom_graph_pass import CustomGraphPass, get_custom_graph_passes

    seen: list[dict[str, object]] = []

    class FlexProbe(CustomGraphPass):
        def __call__(self, graph: torch.fx.Graph) -> None:
            for node in graph.nodes:
                if node.op == "call_function" and node.target is torch.ops.higher_order.flex_attention:
                    query = node.args[0].meta.get("example_value", node.args[0].meta.get("val"))
                    seen.append({"device": query.device.type, "requires_grad": bool(query.requires_grad),
                                 "shape": list(query.shape), "dtype": str(query.dtype)})

        def uuid(self) -> str:
            return "tests/titan/titan_launch.py:FlexProbe/1"

    passes = list(get_custom_graph_passes(inductor_config.pre_grad_custom_pass))
    inductor_config.pre_grad_custom_pass = [FlexProbe(), *passes]
    return seen


def _write_probe(folder: Path, seen: list[dict[str, object]]) -> None:
    from torchtitan.tools import utils

    from torch_neuronx.compile import flex

    report = {
        "rank": int(os.environ.get("RANK", "0")),
        "device_type": utils.device_type,
        "current_device": torch.neuron.current_device(),
        "flex_calls_compiled": seen,
        "neuron_flex_rewrite_installed": flex.installed(),
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank{report['rank']}.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    torch.set_num_threads(1)
    probe_dir = os.environ.get("TITAN_PROBE_DIR")
    seen = _install_probe() if probe_dir else []
    sys.argv[0] = "torchtitan.train"
    runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)
    if probe_dir:
        _write_probe(Path(probe_dir), seen)
