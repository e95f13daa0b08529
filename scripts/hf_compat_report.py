#!/usr/bin/env python
"""Which transformers causal-LM architectures run on the neuron device, and do they match CPU?

    python scripts/hf_compat_report.py [--subset ci|all] [--models llama,gpt2] [--compiled auto|on|off]
                                       [--timeout 180] [--out-dir build/hf_compat]

See torch_neuronx.testing.hf_compat.report.
"""

import sys

from torch_neuronx.testing.hf_compat.report import main

if __name__ == "__main__":
    sys.exit(main())
