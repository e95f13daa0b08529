"""``python -m torch_neuronx``: the command line (see torch_neuronx.tools.cli)."""

from torch_neuronx.tools.cli import main

raise SystemExit(main())
