#!/bin/bash
# Corpus (torch-neuronx migrate): an XLA-era launcher.
set -e
export NEURON_RT_VISIBLE_CORES=0-1
export XLA_USE_BF16=1
export NEURON_CC_FLAGS="--model-type=transformer -O1 --enable-saturate-infinity"
export PJRT_DEVICE=NEURON
STEPS=${STEPS:-4}

# extract and compile the graphs ahead of time, then train
neuron_parallel_compile python xla_spawn.py --steps $STEPS --out out
python xla_spawn.py --steps $STEPS --out out
XLA_DOWNCAST_BF16=1 torchrun --nproc_per_node=2 xla_torchrun.py --steps $STEPS --out out
pip install torch-xla==2.1.0
