"""The ``check`` sub-command of ``torch-neuronx``: arguments in, report out, exit code for CI."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

EPILOG = """examples:
  torch-neuronx check -- train.py --device {device}          # reference: the same command on cpu
  torch-neuronx check --nproc-per-node 4 --json check.json -- train.py
  torch-neuronx check --hf-model ./my-model --task sft
  torch-neuronx check --hf-model ./my-model --task generate --buckets-from plan.json   # plan --serve's buckets
exit code: 0 when no layer fails, 1 when one does, 2 for bad arguments (refused before anything runs),
128 + N when stopped by signal N (the job is killed first)."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from torch_neuronx.tools.check.config import Thresholds

    th = Thresholds()
    p = subparsers.add_parser("check", help="run a job on the emulated device and on a reference path, and judge "
                              "correctness, compilation, distribution and operations", epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--instance", help="the Neuron instance to emulate (default: TORCH_NEURONX_INSTANCE_TYPE)")
    p.add_argument("--nproc-per-node", type=int, help="run the script under torchrun with this many processes")
    p.add_argument("--reference-nproc-per-node", type=int, default=-1, help="the reference's process count "
                   "(default: as the job; 0: one plain process, e.g. a CPU run with the global batch)")
    p.add_argument("--hf-model", metavar="DIR", help="check a Hugging Face model directory with the built-in "
                   "workload (static-cache generate and SFT steps) instead of a command")
    p.add_argument("--task", default="all", choices=("generate", "sft", "all"), help="the built-in workload's tasks")
    p.add_argument("--buckets", metavar="LIST", help="--hf-model: run generate at each of these prompt "
                   "lengths (e.g. 128,512), a padded prompt per bucket, against CPU (docs/check.md)")
    p.add_argument("--buckets-from", metavar="PLAN_JSON", help="--hf-model: the context buckets of a "
                   "`torch-neuronx plan MODEL --serve --json PLAN_JSON` output")
    p.add_argument("--reference", nargs=argparse.REMAINDER, help="the reference command (give it last: "
                   "--reference -- ref.py ...); default: the job with {device} replaced by cpu")
    p.add_argument("--out", default="neuronx-check", help="where events, logs and reports go (default %(default)s)")
    p.add_argument("--json", metavar="PATH", help="write the report document here (docs/check.md#json-schema)")
    p.add_argument("--html", metavar="PATH", help="write a self-contained HTML report with plots here")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds for the whole check (default %(default)s)")
    p.add_argument("--checkpoint", action="append", default=[], help="also load this file or directory on CPU")
    p.add_argument("--loss-rtol", type=float, default=th.loss_rtol)
    p.add_argument("--loss-atol", type=float, default=th.loss_atol)
    p.add_argument("--warmup-steps", type=int, default=th.warmup_steps,
                   help="steps that may compile; a recompilation after them fails (default %(default)s)")
    p.add_argument("--max-shapes", type=int, default=th.max_shapes)
    p.add_argument("--memory-warn", type=float, default=th.memory_warn)
    p.add_argument("--max-startup", type=float, default=th.max_startup_s)
    p.add_argument("--no-progress", action="store_true", help="no status line while the job runs")
    p.add_argument("job", nargs=argparse.REMAINDER, help="-- then the job: script.py args, or -m module args")


def _split(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """`job` and `--reference` as argparse leaves them: drop the leading `--`."""
    argv = list(argv or [])
    if argv and argv[0] == "--":
        argv = argv[1:]
    reference = None
    if "--reference" in argv:  # `-- job.py --reference -- ref.py`: argparse left both in the job
        i = argv.index("--reference")
        argv, reference = argv[:i], [a for a in argv[i + 1:]]
        if reference and reference[0] == "--":
            reference = reference[1:]
    return argv, reference


def run(args: argparse.Namespace) -> int:
    from torch_neuronx.runtime import processes
    from torch_neuronx.tools.check import report
    from torch_neuronx.tools.check.config import (
        CheckConfig,
        Thresholds,
        buckets_from_plan,
        check_plan_model,
        check_writable_file,
        parse_buckets,
    )
    from torch_neuronx.tools.check.run import check

    command, reference = _split(args.job)
    if args.reference:
        reference = _split(args.reference)[0]
    try:
        if args.reference is not None and not args.reference:  # `check --reference -- ref.py`: argparse put
            raise ValueError("--reference was given but no job: put the job first, then the reference, e.g. "
                             "`torch-neuronx check -- train.py --reference -- ref.py`")  # ref.py in the job
        if args.buckets is not None and args.buckets_from is not None:  # checked here: argparse prints its usage
            raise ValueError("--buckets and --buckets-from both give the buckets: give one, not both")
        buckets = parse_buckets(args.buckets) if args.buckets is not None else \
            buckets_from_plan(args.buckets_from) if args.buckets_from is not None else None
        cfg = CheckConfig(command=command, reference=reference, nproc_per_node=args.nproc_per_node,
                          reference_nproc_per_node=args.reference_nproc_per_node,
                          instance=args.instance, hf_model=args.hf_model, task=args.task, buckets=buckets,
                          out_dir=Path(args.out),
                          timeout=args.timeout, checkpoints=args.checkpoint, progress=not args.no_progress,
                          thresholds=Thresholds(args.loss_rtol, args.loss_atol, args.warmup_steps, args.max_shapes,
                                                args.memory_warn, args.max_startup))
        cfg.validate()
        if args.buckets_from is not None:
            check_plan_model(args.buckets_from, args.hf_model)
        if args.json and args.html and Path(args.json).resolve() == Path(args.html).resolve():
            raise ValueError(f"--json and --html both name {args.json}: give each report its own file")
        for flag, path in (("--json", args.json), ("--html", args.html)):
            if path:
                check_writable_file(flag, path)
        if args.html:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise ValueError("--html: the HTML report's plots need matplotlib: pip install "
                                 "'torch-neuronx[report]'") from None
        for path in (args.json, args.html):  # an older report must not look like this run's
            if path:
                Path(path).unlink(missing_ok=True)
        doc = check(cfg)
    except ValueError as e:
        print(f"torch-neuronx check: {e}", file=sys.stderr)
        return 2
    except processes.Interrupted as e:
        partial = getattr(e, "doc", None)
        if partial is not None:  # the report of what was seen, marked interrupted
            _write(report, partial, args)
        print(f"torch-neuronx check: {e}; every process of the job was killed", file=sys.stderr)
        return 128 + e.signum
    _write(report, doc, args)
    return 1 if doc["verdict"] == "fail" else 0


def _write(report: Any, doc: dict[str, Any], args: argparse.Namespace) -> None:
    print(report.text(doc))
    if args.json:
        report.write_json(doc, args.json)
        print(f"\nJSON report: {args.json}")
    if args.html:
        report.write_html(doc, args.html)
        print(f"HTML report: {args.html}")
