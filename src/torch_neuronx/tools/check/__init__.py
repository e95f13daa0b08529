"""``torch-neuronx check``: a migration's acceptance checklist (correctness, compilation, distribution,
operations) for one job, run on the emulated device against a reference path. docs/check.md.

``probe`` runs inside the job's processes (with ``rng``: random ops on neuron
draw from the CPU's stream); ``run`` launches them (the Python API:
:func:`torch_neuronx.tools.check.run.check`) under the guardian of
torch_neuronx.runtime.processes, which kills every process of theirs; ``results`` reads what they wrote;
``verdicts`` judges it;
``report`` prints and plots it. ``config`` holds the types they share
(CheckConfig, Thresholds, Side), below both ``run`` and ``verdicts``. The job-side
markers are in :mod:`torch_neuronx.check`. Nothing here is imported unless the
checker runs.
"""
