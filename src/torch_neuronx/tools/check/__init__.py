"""``torch-neuronx check``: a migration's acceptance checklist (correctness, compilation, distribution,
operations) for one job, run on the emulated device against a reference path. docs/check.md.

``probe`` runs inside the job's processes; ``run`` launches them (the Python
API: :func:`torch_neuronx.tools.check.run.check`); ``results`` reads what they
wrote; ``verdicts`` judges it; ``report`` prints and plots it. The job-side
markers are in :mod:`torch_neuronx.check`. Nothing here is imported unless the
checker runs.
"""
