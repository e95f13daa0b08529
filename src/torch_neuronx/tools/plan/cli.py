"""The ``plan`` sub-command of ``torch-neuronx``: arguments in, table / JSON / plots out, an exit code back.

``add_parser`` adds it to the tool's sub-commands; ``run`` executes it. Bad
input exits with status 2 and a message that says what to change.
"""

from __future__ import annotations

import argparse
import sys

from torch_neuronx.tools.plan.layouts import PlanError


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("plan", help="choose the TP x FSDP x DP layout and padding policy before renting",
                              description="Estimate memory per core, communication and step time of every parallel "
                              "layout of MODEL on the instances, and compare padding policies (docs/plan.md).")
    p.add_argument("model", help="a Hugging Face config.json or model directory, or module:function")
    p.add_argument("--instance", required=True, help="instance type, e.g. trn1.32xlarge or trn2.48xlarge")
    p.add_argument("--instances", type=int, default=1, help="number of instances (multi-node over EFA)")
    p.add_argument("--lnc", type=int, choices=(1, 2), default=None, help="logical NeuronCore config (Trn2: 1 or 2)")
    p.add_argument("--global-batch", type=int, required=True, help="sequences per optimizer step")
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per core per forward")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default: the longest of --lengths)")
    p.add_argument("--lengths", default=None, help="file of sequence lengths (one per line, or a JSON list)")
    p.add_argument("--dataset", default=None, help="lengths from a data set's text column instead: a save_to_disk "
                   "directory or a .json/.jsonl/.csv/.parquet file (with --column and --tokenizer)")
    p.add_argument("--column", default="text", help="the data set's text column (default %(default)s)")
    p.add_argument("--tokenizer", default=None, help="the tokenizer directory for --dataset (default: MODEL)")
    p.add_argument("--max-graphs", type=int, default=4, help="bucket budget: at most this many compiled graphs")
    p.add_argument("--precision", choices=("fp32", "bf16-mixed", "bf16"), default="bf16-mixed")
    p.add_argument("--checkpointing", choices=("none", "selective", "full"), default="none")
    p.add_argument("--layout", action="append", default=None, metavar="TPxFSDPxDP",
                   help="plan only this layout, e.g. 8x4x1 (repeatable)")
    p.add_argument("--measure", nargs="?", const=3, type=int, default=0, metavar="N",
                   help="run the N best layouts (default 3) for one real step on emulated cores")
    p.add_argument("--json", dest="json_path", default=None, metavar="PATH", help="write the plan as JSON")
    p.add_argument("--plots", default=None, metavar="DIR", help="write PNG plots and plan.html here")


def _parse_layout(text: str) -> tuple[int, int, int]:
    parts = text.lower().replace("×", "x").split("x")
    if len(parts) not in (2, 3) or not all(p.strip().isdigit() for p in parts):
        raise PlanError(f"--layout {text!r}: write TPxFSDP or TPxFSDPxDP, e.g. 8x4 or 8x2x2")
    tp, fsdp, *dp = (int(p) for p in parts)
    return tp, fsdp, dp[0] if dp else 1


def run(args: argparse.Namespace) -> int:
    from torch_neuronx.tools.plan import plan
    from torch_neuronx.tools.plan.padding import lengths_from_files, read_lengths
    from torch_neuronx.tools.plan.report import table, write_json, write_plots

    try:
        if args.lengths and args.dataset:
            raise ValueError("give --lengths FILE or --dataset PATH, not both")
        lengths = read_lengths(args.lengths) if args.lengths else None
        if args.dataset:
            lengths = lengths_from_files(args.dataset, args.column, args.tokenizer or args.model)
        result = plan(args.model, instance=args.instance, instances=args.instances, lnc=args.lnc,
                      global_batch=args.global_batch, seq_len=args.seq_len, lengths=lengths,
                      max_graphs=args.max_graphs, precision=args.precision, checkpointing=args.checkpointing,
                      micro_batch=args.micro_batch, measure=args.measure,
                      layouts=[_parse_layout(t) for t in args.layout] if args.layout else None)
    except (PlanError, ValueError) as exc:
        print(f"torch-neuronx plan: error: {exc}", file=sys.stderr)
        return 2
    data = result.as_dict()
    print(table(data))
    if args.json_path:
        print(f"wrote {write_json(data, args.json_path)}")
    if args.plots:
        print("wrote " + ", ".join(str(p) for p in write_plots(data, args.plots)))
    return 0
