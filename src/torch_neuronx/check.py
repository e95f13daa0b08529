"""Markers a job may add for ``torch-neuronx check``; without the checker running they do nothing.

    import torch_neuronx.check as check
    for batch in loader:
        ...
        check.step(loss)                      # a step boundary (the optimizer's step is the default one)
    check.record("tokens", generated_ids)     # a value the checker compares with the reference run

The checker finds steps by itself when the job calls an optimizer's ``step``;
:func:`step` is for loops without one (generation, evaluation) and, once
called, is the only boundary. They live with the rest of the probe
(tools/check/probe.py); docs/check.md describes the checker.
"""

from torch_neuronx.tools.check.probe import record, step

__all__ = ["record", "step"]
