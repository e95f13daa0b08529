#!/usr/bin/env bash
# Installs torch-neuronx, its test tools and the Hugging Face stack it is tested with on a fresh machine (Python 3.11).
# torch comes first and the C++ core is built without build isolation, so pip
# never downloads another (CUDA) torch build.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --upgrade "pip>=23" setuptools wheel ninja
python -m pip install "torch==2.13.0"
python -m pip install --no-build-isolation -e ".[test,hf,report]"
python -c "import torch, torch_neuronx; print('torch', torch.__version__, '| torch_neuronx', torch_neuronx.__version__, '|', torch.neuron.device_count(), 'NeuronCores')"
