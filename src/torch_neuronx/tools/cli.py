"""``torch-neuronx`` / ``python -m torch_neuronx``: what the emulated machine is and how it is doing."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from torch_neuronx.runtime.config import format_bytes


def collect() -> dict[str, Any]:
    """Everything `info` prints, as data."""
    import torch

    import torch_neuronx
    from torch_neuronx import _C, runtime
    from torch_neuronx.tools.nki import provider as nki_provider

    cfg = runtime.machine()
    cores = []
    for i in range(cfg.device_count):
        free, total = torch.neuron.mem_get_info(i)
        cores.append({"device": f"neuron:{i}", "logical_core_id": cfg.visible_cores[i],
                      "allocated_bytes": total - free, "capacity_bytes": total})
    return {
        "instance_type": cfg.instance.name,
        "chip": cfg.instance.chip.name,
        "neuroncore_version": cfg.instance.chip.core_version,
        "chips": cfg.instance.chips,
        "physical_cores": cfg.instance.physical_cores,
        "logical_nc_config": cfg.lnc,
        "logical_cores": cfg.logical_cores,
        "visible_cores": cfg.device_count,
        "hbm_per_core_bytes": cfg.hbm_per_core,
        "hbm_overridden": cfg.hbm_overridden,
        "cores": cores,
        "versions": {"torch_neuronx": torch_neuronx.__version__, "torch": torch.__version__,
                     "python": sys.version.split()[0]},
        "build": {"core": os.path.basename(_C.__file__), "autoload":
                  os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") != "0"},
        "nki": nki_provider(),
    }


def info(as_json: bool) -> int:
    data = collect()
    if as_json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"torch-neuronx {data['versions']['torch_neuronx']} (torch {data['versions']['torch']}, "
          f"Python {data['versions']['python']}) — emulated Neuron device")
    print(f"instance      {data['instance_type']}: {data['chips']} x {data['chip']} chip(s), "
          f"NeuronCore-{data['neuroncore_version']}, {data['physical_cores']} physical cores")
    print(f"logical cores {data['logical_cores']} at LNC={data['logical_nc_config']}, "
          f"{data['visible_cores']} visible to this process")
    note = " (overridden by TORCH_NEURONX_HBM_PER_CORE)" if data["hbm_overridden"] else ""
    print(f"HBM per core  {format_bytes(data['hbm_per_core_bytes'])}{note}")
    used = [c for c in data["cores"] if c["allocated_bytes"]]
    print(f"memory in use {sum(c['allocated_bytes'] for c in used)} bytes on {len(used)} core(s)")
    print(f"build         C++ core {data['build']['core']} loaded; autoload on import torch: "
          f"{'on' if data['build']['autoload'] else 'off'}")
    names = {"torch_neuronx": "this project's interpreter (docs/nki.md)", "aws": "AWS's package", "none": "none"}
    print(f"import nki    {names[data['nki']['provider']]} {data['nki']['location']}".rstrip())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torch-neuronx", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    p_info = sub.add_parser("info", help="the emulated instance, cores, HBM, memory in use, versions")
    p_info.add_argument("--json", action="store_true", help="print JSON")
    from torch_neuronx.tools.check import cli as check_cli
    from torch_neuronx.tools.migrate import cli as migrate_cli
    from torch_neuronx.tools.plan import cli as plan_cli

    check_cli.add_parser(sub)
    plan_cli.add_parser(sub)
    migrate_cli.add_parser(sub)
    argv, migrate_check_args = migrate_cli.split_check(list(sys.argv[1:] if argv is None else argv))
    if argv[:1] == ["plan"] and "--serve" in argv and "--help" not in argv[:2]:  # serving plans parse their own options
        from torch_neuronx.tools.plan import serve_cli

        return serve_cli.main(argv[1:])
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the subcommand's own error (plan's is one line), not the top-level usage and error
        chosen = sub.choices.get(args.command) if args.command else None
        (chosen or parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    from torch_neuronx.runtime.processes import Interrupted

    try:
        return _run(parser, args, migrate_check_args)
    except Interrupted as e:  # SIGINT / SIGTERM inside processes.guarded(): its processes are gone already
        print(f"torch-neuronx {args.command}: {e}; every process it started was stopped", file=sys.stderr)
        return 128 + e.signum


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace, migrate_check_args: Any) -> int:
    from torch_neuronx.tools.check import cli as check_cli
    from torch_neuronx.tools.migrate import cli as migrate_cli
    from torch_neuronx.tools.plan import cli as plan_cli

    if args.command in (None, "info"):
        return info(getattr(args, "json", False))
    if args.command == "check":
        return check_cli.run(args)
    if args.command == "plan":
        return plan_cli.run(args)
    if args.command == "migrate":
        return migrate_cli.run(args, migrate_check_args)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
