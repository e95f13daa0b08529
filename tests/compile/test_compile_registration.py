"""Registration is lazy: importing the package costs no Dynamo/Inductor import, and still works.

One path in for each consumer: Dynamo loads the backend through its entry point
(which registers the device interface before tracing), and Inductor finds the
code generator through the device module's attributes.
"""

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
import torch._dynamo
from torch._dynamo.device_interface import get_interface_for_device
assert torch._dynamo.lookup_backend("neuron").__name__ == "neuron_backend"  # the entry point
assert get_interface_for_device("neuron").device_count() == torch.neuron.device_count()
assert not any(type(f).__module__.startswith("torch_neuronx") for f in sys.meta_path)  # no import hooks
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
backend = torch._dynamo.lookup_backend("neuron")  # loads the package
assert backend.__name__ == "neuron_backend"
print("ok")
"""


def test_entry_point_loads_the_backend_without_autoload() -> None:
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    out = subprocess.run([sys.executable, "-c", ENTRY_POINT], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


SCOPED = r"""
import sys, torch
import torch._inductor.config as config
import torch_neuronx.compile  # noqa: F401

def f(x):  # a pointwise feeding a reduction over a reshape: what Inductor's re-indexing pass rewrites
    y = (x * 2).reshape(64, 128)
    return (y * y).mean(-1)

x = torch.randn(128, 64)
{neuron}
torch._dynamo.reset()
import re
from torch._inductor.utils import run_and_get_code
out, code = run_and_get_code(torch.compile(f), x)
assert torch.allclose(out, f(x), atol=1e-5)
code = re.sub(r"/tmp/\S+|[a-z0-9]{52}|AOT ID: \S+", "<id>", "\n".join(code))  # paths, hashes, compile ids
print(repr((config.loop_reindexing_after_fusion, config.max_pointwise_cat_inputs, code)))
"""


def test_neuron_compiles_leave_cpu_compiles_as_they_were() -> None:
    """The same CPU compile, in a process where neuron compiles ran and in one without the plugin."""
    neuron_first = "torch.compile(f, backend='neuron')(x.to('neuron')); torch.compile(f)(x.to('neuron'))"
    with_plugin = subprocess.run([sys.executable, "-c", SCOPED.replace("{neuron}", neuron_first)],
                                 capture_output=True, text=True, timeout=600)
    assert with_plugin.returncode == 0, with_plugin.stderr[-3000:]
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    plain = subprocess.run([sys.executable, "-c", SCOPED.replace("import torch_neuronx.compile  # noqa: F401", "")
                            .replace("{neuron}", "")], capture_output=True, text=True, timeout=600, env=env)
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert with_plugin.stdout.strip().splitlines()[-1] == plain.stdout.strip().splitlines()[-1]
