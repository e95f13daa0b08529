"""``torch-neuronx migrate``: rewrite PyTorch/XLA, Optimum Neuron and NeuronX Distributed training code into
native PyTorch on the ``neuron`` device, flag what needs a person, and report both.

AWS ended PyTorch/XLA training support in Neuron 2.30, so every Trainium training script written for the older
stack has to move. The rewrite is static (libcst codemods: comments and formatting survive, imports and aliases
are followed); neither torch_xla nor optimum-neuron needs to be installed. Modules, one job each:

- ``names``: which imported name means what (``xm`` -> ``torch_xla.core.xla_model``), and where each reference is;
- ``registry``: the rule registry (``Rules``, ``Ctx``, ``Target``) and the shared expression helpers (arguments
  bound by a published signature, literals); the ``rules_*`` modules depend on it alone;
- ``python``: the codemod driver (statement expansions, removals, TODO comments, imports, helpers); the only
  module that imports the rules;
- ``rules_xla``, ``rules_optimum``, ``rules_nxd``: the rewrites of each family; ``flags``: what is flagged and why;
- ``tp_invariance`` and ``tp_probe``: ``--tp-invariance N``, the migrated script at TP = N against TP = 1;
- ``helpers``: the few native helper functions a rewritten script gets inlined (it must not depend on this
  emulator: the migrated script is meant to run on a real Trainium instance too);
- ``shell`` and ``notebook``: ``.sh`` launchers and ``.ipynb`` code cells; ``engine``: files in, files and report
  out; ``report``: the per-file report (text and JSON); ``cli``: the sub-command.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FileReport", "Flag", "Rewrite", "migrate_file", "migrate_paths", "migrate_source"]


def __getattr__(name: str) -> Any:  # lazy: `torch-neuronx info` builds the parser without importing libcst
    if name in ("migrate_file", "migrate_paths", "migrate_source"):
        from torch_neuronx.tools.migrate import engine

        return getattr(engine, name)
    if name in ("FileReport", "Flag", "Rewrite"):
        from torch_neuronx.tools.migrate import report

        return getattr(report, name)
    raise AttributeError(name)
