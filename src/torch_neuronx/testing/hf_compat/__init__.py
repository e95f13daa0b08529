"""Which transformers causal-LM architectures run on the neuron device, and do they match CPU?

:mod:`.configs` makes tiny configs, :mod:`.check` checks one architecture
(and is the worker process), :mod:`.report` runs them all and writes the
report; ``python scripts/hf_compat_report.py`` is its command line.
"""
