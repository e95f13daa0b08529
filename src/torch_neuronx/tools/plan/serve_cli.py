"""``torch-neuronx plan MODEL --serve``: arguments in, a serving plan (table / JSON / plots) out, an exit code back.

Why it exists: the serving planner has its own options (traffic, buckets,
SLOs), so it parses them itself; ``torch-neuronx plan`` hands it the
command line when ``--serve`` is on it. Bad input exits 2 with one line;
outputs are checked writable before anything is computed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from torch_neuronx.tools.plan.layouts import PlanError

PROG = "torch-neuronx plan --serve"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise PlanError(message)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Plan serving MODEL on Inf2/Trn1/Trn2: buckets from traffic, TTFT and TPOT "
                "p50/p99, throughput, HBM per core, compile count (docs/serve.md).")
    p.add_argument("model", nargs="?", help="a Hugging Face config.json or model directory, or module:function")
    p.add_argument("--serve", action="store_true", help="(this mode)")
    p.add_argument("--instance", default=None, help="instance type, e.g. inf2.48xlarge, trn1.32xlarge, trn2.48xlarge")
    p.add_argument("--lnc", type=int, choices=(1, 2), default=None, help="logical NeuronCore config (Trn2)")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel degree (default: search the even ones)")
    p.add_argument("--batch", type=int, default=1, help="requests decoded together (default %(default)s)")
    p.add_argument("--input-len", type=int, default=None, help="one fixed request shape: prompt tokens")
    p.add_argument("--output-len", type=int, default=None, help="one fixed request shape: output tokens")
    p.add_argument("--lengths", default=None, help="traffic: [prompt_len, output_len] pairs (.json, .jsonl, .csv)")
    p.add_argument("--dataset", default=None, help="traffic from a data set's prompt and output text columns")
    p.add_argument("--column", default="prompt", help="the data set's prompt column (default %(default)s)")
    p.add_argument("--output-column", default="completion", help="its output column (default %(default)s)")
    p.add_argument("--tokenizer", default=None, help="the tokenizer directory for --dataset (default: MODEL)")
    p.add_argument("--buckets", default="auto", help="auto, or bucket lengths for both phases: 512,1024,2048")
    p.add_argument("--max-buckets", type=int, default=4, help="auto: at most K buckets per phase (default 4)")
    p.add_argument("--precision", default="bf16", help="compute dtype: bf16 or fp16")
    p.add_argument("--weights", default="bf16", help="weight storage dtype: bf16 or int8")
    p.add_argument("--slo-ttft-ms", type=float, default=None, help="p99 time-to-first-token target")
    p.add_argument("--slo-tpot-ms", type=float, default=None, help="p99 time-per-output-token target")
    p.add_argument("--json", dest="json_path", default=None, metavar="PATH", help="write the plan as JSON")
    p.add_argument("--plots", default=None, metavar="DIR", help="write PNG plots here (needs matplotlib)")
    p.add_argument("--calibration", action="store_true", help="print the model against AWS's published decoder "
                   "tables (Inf2 fitted, Trn1/Trn2 held out), and exit")
    p.add_argument("--measure", action="store_true", help="run MODEL (or a tiny config) through each bucket on "
                   "the emulated device: compiles, recompiles, tokens vs CPU, peak memory, host time")
    p.add_argument("--decode-steps", type=int, default=4, help="--measure: decode steps per bucket")
    return p


def check_output(path: str, kind: str) -> None:
    """Refuse an output path that cannot be written, before anything runs (nothing is left behind)."""
    target = Path(path)
    if kind == "json":
        if target.is_dir():
            raise PlanError(f"--json {path} is a directory: give a file name")
        if target.exists() and not target.is_file():
            raise PlanError(f"--json {path} is not a regular file")
        _probe(target, f"--json {path}")
    else:
        if target.exists() and not target.is_dir():
            raise PlanError(f"--plots {path} is not a folder")
        if not target.exists() and not target.parent.is_dir():
            raise PlanError(f"--plots {path}: the folder {target.parent} does not exist")
        _probe(target / ".torch-neuronx-probe", f"--plots {path}", make_parent=True)


def refuse_input_as_output(path: str, inputs: list[str | None]) -> None:
    """Refuse --json naming one of the inputs (the model's config.json, the traffic file): it would be overwritten."""
    target = Path(path).resolve()
    for given in inputs:
        if not given:
            continue
        source = Path(given)
        candidates = [source, source / "config.json"] if source.is_dir() else [source]
        for candidate in candidates:
            if candidate.exists() and candidate.resolve() == target:
                raise PlanError(f"--json {path} is an input ({candidate}): give another file name")


def _probe(target: Path, label: str, make_parent: bool = False) -> None:
    """Open `target` for appending (creating the --plots folder first); remove it again if it was not there."""
    existed = target.exists()
    try:
        if make_parent:
            target.parent.mkdir(exist_ok=True)
        with open(target, "a"):
            pass
        if not existed:
            target.unlink()
    except OSError as exc:
        raise PlanError(f"{label}: cannot write there ({exc.strerror or exc.__class__.__name__})") from None


def parse_buckets(text: str) -> list[int] | None:
    if text.strip().lower() == "auto":
        return None
    parts = [t.strip() for t in text.split(",") if t.strip()]
    # ASCII digits only ('²' is a digit to str.isdigit but not to int()), and few enough for int() to take
    if not parts or not all(t.isascii() and t.isdigit() and len(t) <= 8 and 1 <= int(t) <= 1 << 22 for t in parts):
        shown = repr(text) if len(text) <= 60 else repr(text[:60] + "...")
        raise PlanError(f"--buckets {shown}: give auto or whole lengths separated by commas, e.g. 512,1024,2048")
    return [int(t) for t in parts]


def traffic(args: argparse.Namespace) -> list[tuple[int, int]]:
    given = [flag for flag, v in (("--lengths", args.lengths), ("--dataset", args.dataset)) if v]
    fixed = args.input_len is not None or args.output_len is not None
    if len(given) + int(fixed) != 1:
        raise PlanError("give the traffic once: --input-len L --output-len O, or --lengths FILE, or --dataset PATH")
    if fixed:
        if args.input_len is None or args.output_len is None:
            raise PlanError("give both --input-len and --output-len")
        if not (1 <= args.input_len <= 1 << 22 and 1 <= args.output_len <= 1 << 22):
            raise PlanError("--input-len and --output-len must be from 1 to 4194304 tokens")
        return [(args.input_len, args.output_len)]
    if args.lengths:
        from torch_neuronx.tools.plan.serve_traffic import read_traffic

        return read_traffic(args.lengths)
    from torch_neuronx.tools.plan.padding import lengths_from_files

    tokenizer = args.tokenizer or args.model
    prompts = lengths_from_files(args.dataset, args.column, tokenizer)
    outputs = lengths_from_files(args.dataset, args.output_column, tokenizer)
    return [(p, max(1, o)) for p, o in zip(prompts, outputs, strict=True)]


def _join_negative_values(argv: list[str]) -> list[str]:
    """``--buckets -1,256`` as ``--buckets=-1,256``: argparse takes a value starting with '-' for an option and
    would answer "expected one argument" instead of the bucket message."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] == "--buckets" and arg[:1] == "-" and arg[1:2].isdigit():
            out[-1] = f"--buckets={arg}"
        else:
            out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["plan"]:
        argv = argv[1:]
    from torch_neuronx.runtime.processes import Interrupted

    try:
        return _main(_join_negative_values(argv))
    except (PlanError, ValueError) as exc:
        message = (str(exc).splitlines() or [repr(exc)])[0]
        print(f"torch-neuronx plan --serve: error: {message}", file=sys.stderr)
        return 2
    except Interrupted as exc:  # SIGINT / SIGTERM inside processes.guarded(): what it started is stopped already
        print(f"torch-neuronx plan --serve: {exc}; every process it started was stopped", file=sys.stderr)
        return 128 + exc.signum
    except KeyboardInterrupt:  # Ctrl-C outside --measure (nothing was started)
        print("torch-neuronx plan --serve: stopped by SIGINT", file=sys.stderr)
        return 130
    except BrokenPipeError:
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 0


def _main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.calibration:
        ignored = [flag for flag, value in (("MODEL", args.model), ("--instance", args.instance),
                                            ("--measure", args.measure), ("--lengths", args.lengths),
                                            ("--dataset", args.dataset), ("--input-len", args.input_len),
                                            ("--output-len", args.output_len), ("--tp", args.tp),
                                            ("--plots", args.plots)) if value not in (None, False)]
        if ignored:
            raise PlanError(f"--calibration prints AWS's published rows against the model and takes only --json; "
                            f"drop {', '.join(ignored)}")
    if args.json_path:
        refuse_input_as_output(args.json_path, [args.model, args.lengths, args.dataset])
        check_output(args.json_path, "json")
    if args.plots:
        check_output(args.plots, "plots")
    if args.calibration:
        from torch_neuronx.tools.plan.serve_calibration import calibration_json, calibration_table

        print(calibration_table())
        if args.json_path:
            _write_json(calibration_json(), args.json_path)
        return 0
    missing = [flag for flag, value in (("MODEL", args.model), ("--instance", args.instance)) if value is None]
    if missing:
        raise PlanError(f"give {' and '.join(missing)} (or --calibration)")
    from torch_neuronx.tools.plan.serve_plan import plan_serving
    from torch_neuronx.tools.plan.serve_report import table, write_plots

    plan = plan_serving(args.model, args.instance, traffic(args), tp=args.tp, batch=args.batch,
                        buckets=parse_buckets(args.buckets), max_buckets=args.max_buckets,
                        precision=args.precision, weights=args.weights, slo_ttft_ms=args.slo_ttft_ms,
                        slo_tpot_ms=args.slo_tpot_ms, lnc=args.lnc)
    if args.measure:
        from torch_neuronx.runtime import processes
        from torch_neuronx.tools.plan.serve_measure import measure_plan

        if not 1 <= args.decode_steps <= 1024:
            raise PlanError("--decode-steps must be from 1 to 1024")
        with processes.guarded():  # SIGINT / SIGTERM: stop what it started, raise Interrupted (exit 128 + N)
            plan["measured"] = measure_plan(args.model, plan, decode_steps=args.decode_steps)
    print(table(plan))
    if args.json_path:
        _write_json(plan, args.json_path)
    if args.plots:
        written = write_plots(plan, args.plots)
        print("wrote " + ", ".join(str(p) for p in written) if written else "plots skipped: matplotlib not installed")
    sys.stdout.flush()
    return 0


def _write_json(data: Any, path: str) -> None:
    try:
        Path(path).write_text(json.dumps(data, indent=2, default=str) + "\n")
    except OSError as exc:
        raise PlanError(f"--json {path}: cannot write it ({exc.strerror or exc.__class__.__name__})") from None
    print(f"wrote {path}")
