"""Registration is lazy: importing the package costs no Dynamo/Inductor import, and still works."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = r"""
import sys, time
import torch
start = time.perf_counter()
import torch_neuronx.compile
elapsed = time.perf_counter() - start
assert "torch._dynamo" not in sys.modules and "torch._inductor" not in sys.modules, "heavy import at import time"
import torch._dynamo  # loading Dynamo registers the backend and the device interface
from torch._dynamo.device_interface import get_interface_for_device
assert torch._dynamo.lookup_backend("neuron").__name__ == "neuron_backend"
assert get_interface_for_device("neuron").device_count() == torch.neuron.device_count()
assert callable(torch.neuron.Scheduling)  # Inductor's lazy hook for the device's code generator
print(elapsed)
"""


def test_import_is_cheap_and_registration_lazy() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert float(out.stdout.strip().splitlines()[-1]) < 0.05  # seconds (measured: ~3 ms)


ENTRY_POINT = r"""
import torch
import torch._dynamo
from importlib.metadata import EntryPoint
from torch._dynamo.backends import registry
registry._lazy_import()  # Dynamo has discovered entry points; ours is not installed here: add it
registry._BACKENDS["neuron"] = EntryPoint(
    name="neuron", value="torch_neuronx.compile.backend:neuron_backend", group="torch_dynamo_backends")
backend = torch._dynamo.lookup_backend("neuron")  # loads the package, which must not register twice
assert backend.__name__ == "neuron_backend"
print("ok")
"""


def test_entry_point_load_does_not_collide_with_the_import_hook() -> None:
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    out = subprocess.run([sys.executable, "-c", ENTRY_POINT], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
