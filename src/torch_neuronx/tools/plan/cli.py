"""The ``plan`` sub-command of ``torch-neuronx``: arguments in, table / JSON / plots out, an exit code back.

``add_parser`` adds it to the tool's sub-commands; ``run`` executes it. Bad
input exits with status 2 and a message that says what to change.
"""

from __future__ import annotations

import argparse
import sys

from torch_neuronx.tools.plan.layouts import PlanError


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("plan", help="choose the TP x PP x FSDP x DP layout and padding policy before renting",
                              description="Estimate memory per core, communication and step time of every parallel "
                              "layout of MODEL on the instances, and compare padding policies (docs/plan.md).")
    p.add_argument("model", nargs="?", help="a Hugging Face config.json or model directory, or module:function")
    p.add_argument("--instance", default=None, help="instance type, e.g. trn1.32xlarge or trn2.48xlarge (required)")
    p.add_argument("--instances", type=_whole, default=1, help="number of instances (multi-node over EFA)")
    p.add_argument("--lnc", type=_whole, choices=(1, 2), default=None, help="logical NeuronCore config (Trn2: 1 or 2)")
    p.add_argument("--global-batch", type=_whole, default=None, help="sequences per optimizer step (required)")
    p.add_argument("--micro-batch", type=_whole, default=1, help="sequences per core per forward")
    p.add_argument("--seq-len", type=_whole, default=None,
                   help="tokens per sequence (default: the longest of --lengths)")
    p.add_argument("--lengths", default=None, help="file of sequence lengths (one per line, or a JSON list)")
    p.add_argument("--dataset", default=None, help="lengths from a data set's text column instead: a save_to_disk "
                   "directory or a .json/.jsonl/.csv/.parquet file (with --column and --tokenizer)")
    p.add_argument("--column", default="text", help="the data set's text column (default %(default)s)")
    p.add_argument("--tokenizer", default=None, help="the tokenizer directory for --dataset (default: MODEL)")
    p.add_argument("--max-graphs", type=_whole, default=4, help="bucket budget: at most this many compiled graphs")
    p.add_argument("--precision", choices=("fp32", "bf16-mixed", "bf16"), default="bf16-mixed")
    p.add_argument("--checkpointing", choices=("none", "selective", "full"), default="none")
    p.add_argument("--zero1", action="store_true", help="shard the optimizer state over DP (ZeRO-1) instead of FSDP")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="split activations over TP (all-gather / reduce-scatter in place of all-reduce)")
    p.add_argument("--no-pipeline", action="store_true", help="leave pipeline-parallel layouts (PP > 1) out")
    p.add_argument("--autocast", choices=("matmult", "none"), default="matmult",
                   help="the compiler's FP32 matmul policy: matmult (neuronx-cc's default: cast to BF16) or none")
    p.add_argument("--hbm-reserve", default=None, metavar="SIZE",
                   help="HBM the Neuron runtime keeps per core, e.g. 1GiB (default: 96 MB micro-code per physical "
                   "core + one 512 MiB scratchpad page)")
    p.add_argument("--layout", action="append", default=None, metavar="TPxFSDPxDP",
                   help="plan only this layout: TPxFSDP, TPxFSDPxDP or TPxPPxFSDPxDP, e.g. 8x4 (repeatable)")
    p.add_argument("--measure", nargs="?", const=3, type=_whole, default=0, metavar="N",
                   help="run the N best layouts (default 3) for one real step on emulated cores")
    p.add_argument("--json", dest="json_path", default=None, metavar="PATH", help="write the plan as JSON")
    p.add_argument("--plots", default=None, metavar="DIR", help="write PNG plots and plan.html here")
    p.add_argument("--calibration", action="store_true",
                   help="print the time model against AWS's published Trn1/Trn1n training tables (SDK 2.5-2.28; "
                   "with --json PATH also write them as JSON), and exit")
    p.add_argument("--serve", action="store_true", help="plan serving instead: buckets from traffic, TTFT/TPOT "
                   "p50/p99, HBM per core (its own options: torch-neuronx plan --serve --help; docs/serve.md)")
    p.error = _one_line_error  # type: ignore[method-assign]


def _whole(text: str) -> int:
    """argparse type of the whole-number options: a one-line reason instead of argparse's "invalid int value"."""
    try:
        return int(text.strip().replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (write 4096, not 4k or 4,096)") from None


def _one_line_error(message: str) -> None:
    """The plan parser's error: one line and exit 2, as every other refusal of ``plan`` (argparse prints its
    usage, 14 lines, before the message)."""
    if message.endswith("expected one argument"):  # argparse reads a value that starts with '-' as an option
        message += " (a value that starts with '-' goes after '=', e.g. --hbm-reserve=-1GiB)"
    print(f"torch-neuronx plan: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _parse_layout(text: str) -> tuple[int, int, int, int]:
    """(tp, fsdp, dp, pp) from TPxFSDP, TPxFSDPxDP or TPxPPxFSDPxDP."""
    parts = text.lower().replace("×", "x").split("x")
    if len(parts) not in (2, 3, 4) or not all(p.strip().isdigit() for p in parts):
        raise PlanError(f"--layout {text!r}: write TPxFSDP, TPxFSDPxDP or TPxPPxFSDPxDP, e.g. 8x4, 8x2x2 or 8x2x2x1")
    values = [int(p) for p in parts]
    if min(values) < 1:
        raise PlanError(f"--layout {text!r}: every degree must be at least 1")
    if len(values) == 4:
        tp, pp, fsdp, dp = values
    else:
        tp, fsdp, *rest = values
        dp, pp = (rest[0] if rest else 1), 1
    return tp, fsdp, dp, pp


def _check_output(path: str, what: str) -> None:
    """:func:`_probe_output`, with a path the system refuses outright (longer than PATH_MAX) said in one line."""
    try:
        _probe_output(path, what)
    except OSError as exc:
        shown = path if len(path) <= 120 else f"{path[:60]}...{path[-40:]} ({len(path):,} characters)"
        flag = "--json" if what == "json" else "--plots"
        raise PlanError(f"{flag} {shown} cannot be written ({exc.strerror or exc})") from None


def _probe_output(path: str, what: str) -> None:
    """Refuse an output path before anything is computed or printed: try the write (root passes every permission
    check, so only a real write tells), without clobbering what is there."""
    import errno
    import os
    import tempfile
    from pathlib import Path

    flag = "--json" if what == "json" else "--plots"
    if not path.strip():
        raise PlanError(f"{flag} was given an empty path: give a {'file name' if what == 'json' else 'folder'}")
    target = Path(path)
    if what == "json":
        if target.is_dir():
            raise PlanError(f"{flag} {path} is a directory: give a file name, e.g. {target / 'plan.json'}")
        if not target.parent.is_dir():
            raise PlanError(f"{flag} {path}: the folder {target.parent} does not exist; create it first")
        if target.exists() and not target.is_file():
            # a device, FIFO or socket: opening it passes (/dev/full), and the write fails only after the plan (and a
            # --measure run) is done, or blocks (a FIFO no one reads)
            raise PlanError(f"{flag} {path} is not a regular file (a device, FIFO or socket): give a file name")
        try:
            if target.exists():  # open for appending: a permission or read-only file system shows, nothing is cut
                # O_NONBLOCK: a FIFO no one reads fails at once (ENXIO) instead of blocking the open forever
                os.close(os.open(target, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK))
                # and a byte written beside it: a full file system shows before the plan is computed
                with tempfile.NamedTemporaryFile(dir=target.parent, prefix=".plan-probe-") as f:
                    f.write(b"{")
                    f.flush()
                    os.fsync(f.fileno())
            else:  # create it, write a byte (a full disk shows), and take it away again
                with open(target, "xb") as f:
                    f.write(b"{")
                    f.flush()
                    os.fsync(f.fileno())
                target.unlink()
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                raise PlanError(f"{flag} {path} is not a regular file (a FIFO that no process reads): give a file "
                                "name") from None
            raise PlanError(f"{flag} {path} cannot be written ({exc.strerror or exc})") from None
        return
    if target.exists() and not target.is_dir():
        raise PlanError(f"{flag} {path} is a file: give a folder")
    # probe the nearest folder that exists: the new folders are made only when the plots are written, so a command
    # refused later (a bad MODEL, a layout that cannot exist) leaves none behind
    existing = target.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise PlanError(f"{flag} {path}: {existing} is a file, not a folder")
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".plan-probe-") as f:
            f.write(b"x")
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise PlanError(f"{flag} {path} cannot be written ({exc.strerror or exc})") from None


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM under processes.guarded(), or a builder raising it
        signum = getattr(e, "signum", None)  # processes.Interrupted names its signal (its processes are gone)
        if signum is None:
            print("torch-neuronx plan: interrupted", file=sys.stderr)
            return 130
        print(f"torch-neuronx plan: {e}; every process it started was stopped", file=sys.stderr)
        return 128 + signum
    except BrokenPipeError:
        # the reader (head, less) closed the pipe: not an error; keep Python from complaining at exit
        import os

        try:  # later flushes (at exit) go nowhere instead of raising again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 0


def _run(args: argparse.Namespace) -> int:
    from torch_neuronx.tools.plan import plan
    from torch_neuronx.tools.plan.padding import lengths_from_files, read_lengths
    from torch_neuronx.tools.plan.report import table, write_json, write_plots

    try:
        if args.calibration:
            return _calibration(args)
        missing = [flag for flag, value in (("MODEL", args.model), ("--instance", args.instance),
                                            ("--global-batch", args.global_batch)) if value is None]
        if missing:
            raise PlanError(f"give {', '.join(missing)} (or --calibration)")
        if args.json_path is not None:
            _check_output(args.json_path, "json")
        if args.plots is not None:
            _check_output(args.plots, "plots")
        if args.measure < 0:
            raise PlanError(f"--measure {args.measure}: give how many of the best layouts to run (1 or more), or "
                            "leave it out")
        if args.lengths and args.dataset:
            raise PlanError("give --lengths FILE or --dataset PATH, not both")
        reserve = _size(args.hbm_reserve) if args.hbm_reserve is not None else None
        layouts = [_parse_layout(t) for t in args.layout] if args.layout else None
        lengths = read_lengths(args.lengths) if args.lengths else None
        if args.dataset:
            lengths = lengths_from_files(args.dataset, args.column, args.tokenizer or args.model)
        result = plan(args.model, instance=args.instance, instances=args.instances, lnc=args.lnc,
                      global_batch=args.global_batch, seq_len=args.seq_len, lengths=lengths,
                      max_graphs=args.max_graphs, precision=args.precision, checkpointing=args.checkpointing,
                      micro_batch=args.micro_batch, measure=args.measure, hbm_reserve=reserve, zero1=args.zero1,
                      sequence_parallel=args.sequence_parallel, pipeline=not args.no_pipeline,
                      autocast=args.autocast, layouts=layouts)
    except (PlanError, ValueError) as exc:
        print(f"torch-neuronx plan: error: {exc}", file=sys.stderr)
        return 2
    data = result.as_dict()
    written = []
    try:  # the files first: a write that fails exits 2 before the table prints
        if args.json_path is not None:
            written.append(str(write_json(data, args.json_path)))
        if args.plots is not None:
            written += [str(p) for p in write_plots(data, args.plots)]
    except OSError as exc:
        where = exc.filename or args.json_path or args.plots
        print(f"torch-neuronx plan: error: cannot write {where} ({exc.strerror or exc})", file=sys.stderr)
        return 2
    print(table(data))
    if written:
        print("wrote " + ", ".join(written))
    sys.stdout.flush()  # a closed pipe shows here, inside run's handler, not at interpreter exit
    return 0


def _calibration(args: argparse.Namespace) -> int:
    """``--calibration``: the table on stdout, and with ``--json PATH`` its rows and summary as JSON."""
    import json

    from torch_neuronx.tools.plan.calibration import calibration_table, summary
    from torch_neuronx.tools.plan.calibration import results as calibration_rows

    if args.json_path is not None:
        _check_output(args.json_path, "json")
        try:
            with open(args.json_path, "w") as f:
                json.dump({"rows": calibration_rows(), "summary": summary()}, f, indent=2)
        except OSError as exc:
            print(f"torch-neuronx plan: error: cannot write {args.json_path} ({exc.strerror or exc})",
                  file=sys.stderr)
            return 2
    print(calibration_table())
    if args.json_path is not None:
        print(f"wrote {args.json_path}")
    return 0


def _size(text: str) -> int:
    """Bytes from 512MiB, 1GiB, 2GB, 0 or a plain number of bytes."""
    units = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
    t = text.strip().lower().replace(" ", "")
    number = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(number):]
    try:
        value = float(number)
    except ValueError:
        value = float("nan")
    if unit not in units or not value >= 0 or value * units[unit] >= 1 << 50:
        raise PlanError(f"--hbm-reserve {text!r}: give a size such as 0, 768MiB or 1GiB")
    return int(value * units[unit])
