"""Run one process of a migrated script and record its losses and gradients, for ``migrate --tp-invariance``.

    python -m torch_neuronx.tools.migrate.tp_probe OUT_DIR TP script.py [ARGS...]   (under torchrun)

A tensor-parallel rewrite is right when the script computes at TP = N what it computes at TP = 1, where nothing is
sharded and so nothing depends on the rewrite's assumptions about layouts. This probe runs the script unchanged
(``runpy``) and records, in ``OUT_DIR/rank<R>.pt``:

- every scalar that ``backward()`` starts from (the losses; a DTensor loss as its full value);
- before every optimizer step, each parameter's gradient as a full tensor (``DTensor.full_tensor()``: a
  collective every rank makes in the same order, as they all step).

The tensor-parallel size comes from TP: the (dp, tp) mesh that the migration's ``neuron_init_mesh`` helper asks
``init_device_mesh`` for is rebuilt with ``tp = TP`` (and ``dp = world // TP``), so that the same script runs at
TP = N and TP = 1 without being edited.
"""

from __future__ import annotations

import atexit
import os
import runpy
import sys
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook


def _full(t: torch.Tensor) -> torch.Tensor:
    full = t.full_tensor() if hasattr(t, "full_tensor") else t
    return full.detach().float().cpu().clone()


class Recorder:
    """The losses and the per-step gradients of this process."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.grads: list[list[torch.Tensor | None]] = []
        self.mesh = False  # whether neuron_init_mesh's (dp, tp) mesh was built (else there is no TP to change)

    def on_backward(self, root: torch.Tensor) -> None:
        if root.numel() == 1:
            self.losses.append(float(_full(root).reshape(())))

    def on_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.grads.append([None if p.grad is None else _full(p.grad)
                           for group in optimizer.param_groups for p in group["params"]])

    def save(self, path: str) -> None:
        torch.save({"losses": self.losses, "grads": self.grads, "mesh": self.mesh}, path)


def _install(recorder: Recorder, tp: int) -> None:
    backward = torch.Tensor.backward

    def recording_backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        recorder.on_backward(self)
        return backward(self, *args, **kwargs)

    torch.Tensor.backward = recording_backward  # type: ignore[method-assign]
    register_optimizer_step_pre_hook(recorder.on_step)

    import torch.distributed.device_mesh as device_mesh

    init_device_mesh = device_mesh.init_device_mesh

    def mesh_at_tp(device_type: str, mesh_shape: tuple[int, ...], *args: Any, **kwargs: Any) -> Any:
        if tuple(kwargs.get("mesh_dim_names") or ()) == ("dp", "tp"):
            world = torch.distributed.get_world_size()
            mesh_shape = (world // tp, tp)
            recorder.mesh = True
        return init_device_mesh(device_type, mesh_shape, *args, **kwargs)

    device_mesh.init_device_mesh = mesh_at_tp  # type: ignore[assignment]


def main(argv: list[str]) -> None:
    out_dir, tp, script, *script_args = argv
    os.makedirs(out_dir, exist_ok=True)
    recorder = Recorder()
    _install(recorder, int(tp))
    path = os.path.join(out_dir, f"rank{os.environ.get('RANK', '0')}.pt")
    atexit.register(recorder.save, path)  # a script that ends with sys.exit(0) still leaves its record
    sys.argv = [script, *script_args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
