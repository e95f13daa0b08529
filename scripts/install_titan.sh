#!/usr/bin/env bash
# Installs the optional TorchTitan test group (tests/titan): torchtitan 0.3.0 and the dependencies its llama3
# training path imports. Idempotent; run after scripts/install.sh.
#
# TorchTitan 0.3.0 declares datasets<4.8 (the HF stack here pins datasets 5.x) and several of its dependencies
# declare torch>=2.11 (pip could replace torch==2.13.0+cpu by a CUDA build). So the packages that depend on torch
# or on datasets go in with --no-deps, and everything else is installed under a constraints file that holds torch
# and the Hugging Face pins where they are. The versions match the "titan" extra in pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
python - "$constraints" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version

pins = ["torch", "transformers", "accelerate", "trl", "peft", "diffusers", "datasets", "tokenizers", "numpy"]
with open(sys.argv[1], "w") as f:
    for name in pins:
        try:
            v = version(name).split("+")[0]
        except PackageNotFoundError:
            continue
        f.write(f"{name}=={v}\n")
PY
# Plain dependencies (none of them needs torch).
python -m pip install -c "$constraints" "tyro==1.0.17" "einops==0.8.2" "tensorboard==2.21.0" "safetensors" "pillow"
# Packages that declare torch (or datasets<4.8) as a dependency: no resolver, their other needs are present.
# triton: torchtitan's llama3 path imports it unconditionally (models/common/moe.py -> minimal_async_ep/kernels.py)
# although nothing on a neuron run calls it; on a host without a GPU Inductor does not use it (has_triton() is
# False), so the C++ backend stays the one neuron runs.
python -m pip install --no-deps "torchdata==0.11.0" "spmd_types==0.2.3" "torch_checkpointing==0.1.1" \
  "triton==3.9.0" "torchtitan==0.3.0"
python - <<'PY'
import torch
import torchtitan.train  # noqa: F401  (imports the whole llama3 training path)
from importlib.metadata import version

assert torch.__version__.startswith("2.13.0"), f"torch changed to {torch.__version__}"
print("torch", torch.__version__, "| torchtitan", version("torchtitan"), "| datasets", version("datasets"))
PY
