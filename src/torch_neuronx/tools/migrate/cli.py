"""The ``migrate`` sub-command of ``torch-neuronx``: paths in, migrated files and a report out, exit code for CI.

Building the parser imports nothing heavy (no libcst, no torch): ``torch-neuronx info`` stays fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

EPILOG = """examples:
  torch-neuronx migrate train.py                          # dry run: the report only, nothing written
  torch-neuronx migrate train.py --diff                   # ... and the unified diff
  torch-neuronx migrate scripts/ --out migrated/ --json migrate.json
  torch-neuronx migrate train.py --in-place
  torch-neuronx migrate train.py --out migrated/ --check -- --steps 5   # then torch-neuronx check against CPU
  torch-neuronx migrate tp_train.py --out migrated/ --tp-invariance 2 -- --steps 3   # TP = 2 against TP = 1
options are spelled out in full (no abbreviations: `--qu` is no `--quiet`).
exit code: 0 when nothing is flagged, 1 when flags remain (or --check fails), 2 for bad input."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "migrate", help="rewrite PyTorch/XLA, Optimum Neuron and NeuronX Distributed training code into native "
        "PyTorch on the neuron device, and flag what needs a person", epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)  # options spelled out (rv32f 9)
    p.add_argument("paths", nargs="+", metavar="PATH", help="Python files, notebooks (.ipynb), shell launchers "
                   "(.sh), or folders holding them")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out", metavar="DIR", help="write the migrated files here (folders mirrored)")
    where.add_argument("--in-place", action="store_true", help="overwrite the files that change")
    p.add_argument("--diff", action="store_true", help="print a unified diff of each changed file")
    p.add_argument("--json", metavar="PATH", help="write the report as JSON here")
    p.add_argument("--target", choices=("neuron", "cpu"), default="neuron",
                   help="neuron (default), or cpu: the portable CPU twin used as the reference by --check")
    p.add_argument("--quiet", action="store_true", help="print only the summary line")
    p.add_argument("--check-nproc-per-node", type=int, metavar="N",
                   help="--check: run the migrated script under torchrun with N processes (and its CPU twin too)")
    p.add_argument("--check-out", metavar="DIR", default="neuronx-check",
                   help="--check: where the check's events and report go (default %(default)s)")
    p.add_argument("--tp-invariance", type=int, metavar="N",
                   help="then run the migrated script under torchrun at tensor-parallel size N and at 1, and compare "
                   "every loss and gradient (the TP = 1 run shares none of the plan's layout assumptions); needs "
                   "--out or --in-place and one Python script; script ARGS after `--`")
    p.add_argument("--tp-invariance-out", metavar="DIR", default="neuronx-tp-invariance",
                   help="--tp-invariance: where the runs' records and logs go (default %(default)s)")
    p.add_argument("--check", action="store_true",
                   help="then run `torch-neuronx check` on the migrated script against its CPU twin; give it last: "
                   "--check -- ARGS (ARGS go to the script); needs --out or --in-place and one Python script")


# migrate's own options (add_parser): after `--check` without `--` one of them is a mistake, not the script's
OWN_OPTIONS = ("--out", "--in-place", "--diff", "--json", "--target", "--quiet", "--check-nproc-per-node",
               "--check-out", "--tp-invariance", "--tp-invariance-out", "--check")


def _names_own_option(arg: str) -> bool:
    """One of migrate's options, or the start of one (`--check-n`, `--qu`, `--tp`: argparse would have taken an
    abbreviation for the option before `--check`, rv32f item 9)."""
    return arg in OWN_OPTIONS or (arg.startswith("--") and len(arg) > 3 and any(o.startswith(arg) for o in OWN_OPTIONS))


def split_check(argv: list[str]) -> tuple[list[str], list[str]]:
    """`migrate ... --check -- ARGS` (or `--tp-invariance N -- ARGS`): ARGS belong to the script, not to argparse
    (which would take them for paths)."""
    if not argv or argv[0] != "migrate":
        return argv, []
    if "--check" not in argv:
        if "--" in argv and any(a == "--tp-invariance" or a.startswith("--tp-invariance=") for a in argv):
            i = argv.index("--")
            return argv[:i], argv[i + 1:]
        return argv, []
    i = argv.index("--check")
    rest = argv[i + 1:]
    if rest[:1] == ["--"]:  # `--check -- ARGS`: all the script's, even a name migrate has (`--out run`)
        return argv[: i + 1], rest[1:]
    own = [a for a in rest if _names_own_option(a.split("=", 1)[0])]
    if own:  # `--check --check-nproc-per-node 2` went to the script, silently (rv32e item 7)
        print(f"torch-neuronx migrate: {own[0]} after --check would go to the script: give migrate's options "
              "before --check, and the script's after `--check --`", file=sys.stderr)
        raise SystemExit(2)
    return argv[: i + 1], rest


def _run_check(args: argparse.Namespace, script_args: list[str], results: list,
               target_cpu: object) -> tuple[int, str | None]:
    from torch_neuronx.tools.check import report as check_report
    from torch_neuronx.tools.check.run import CheckConfig, check
    from torch_neuronx.tools.migrate.engine import migrate_source

    scripts = [m for m in results if m.report.kind == "python" and m.report.output and not m.report.error]
    if len(scripts) != 1:
        print(f"torch-neuronx migrate: --check needs exactly one migrated Python script, got {len(scripts)}",
              file=sys.stderr)
        return 2, None
    m = scripts[0]
    out = Path(m.report.output)
    twin = out.with_name(out.stem + "_cpu_reference.py")
    ref = migrate_source(m.source, "python", target_cpu, str(twin))  # type: ignore[arg-type]
    twin.write_text(ref.result or "", encoding=m.encoding)
    check_dir = Path(args.check_out)
    cfg = CheckConfig(command=[str(out), *script_args], reference=[str(twin), *script_args],
                      nproc_per_node=args.check_nproc_per_node, out_dir=check_dir, progress=False)
    try:
        doc = check(cfg)
    except ValueError as e:
        print(f"torch-neuronx migrate --check: {e}", file=sys.stderr)
        return 2, None
    json_path = check_dir / "check.json"
    check_report.write_json(doc, json_path)
    print(check_report.text(doc))
    m.report.check_report = str(json_path)
    return (1 if doc["verdict"] == "fail" else 0), str(json_path)


def _run_tp_invariance(args: argparse.Namespace, script_args: list[str], results: list) -> int:
    from torch_neuronx.tools.migrate import tp_invariance

    scripts = [m for m in results if m.report.kind == "python" and m.report.output and not m.report.error]
    if len(scripts) != 1:
        print("torch-neuronx migrate: --tp-invariance needs exactly one migrated Python script, got "
              f"{len(scripts)}", file=sys.stderr)
        return 2
    try:
        result = tp_invariance.run(Path(scripts[0].report.output), script_args, args.tp_invariance,
                                   Path(args.tp_invariance_out))
    except ValueError as e:
        print(f"torch-neuronx migrate: {e}", file=sys.stderr)
        return 2
    print(result.text())
    return 0 if result.verdict == "pass" else 1


def _json_unwritable(json_arg: str, out: str | None) -> str | None:
    """Why the JSON report could not be written, found by writing (and flushing) a byte there: a device such as
    /dev/full opens but refuses the write. An existing regular file is only checked for permission (it is replaced
    at the end anyway, and must stay as it is if the run stops before)."""
    json_path = Path(json_arg)
    if json_path.is_dir():
        return f"--json {json_arg}: a directory, not a file"
    if out is not None and json_path.resolve() == Path(out).resolve():
        return f"--json {json_arg}: the --out folder itself, not a file in it"
    if json_path.is_file():
        return None if os.access(json_path, os.W_OK) else f"--json {json_arg}: cannot write it: permission denied"
    existed = json_path.exists()
    try:
        with open(json_path, "ab") as f:
            f.write(b"\n")
            f.flush()
    except OSError as e:
        return f"--json {json_arg}: cannot write it: {e.strerror or e}"
    finally:
        if not existed and json_path.is_file():
            json_path.unlink()
    return None


def _unwritable_output(args: argparse.Namespace) -> str | None:
    """Why an output path cannot be written (checked before anything is written), or None."""
    if args.json:
        why = _json_unwritable(args.json, args.out)
        if why:
            return why
    if args.out:
        out = Path(args.out)
        ancestor = next((p for p in (out, *out.parents) if p.exists()), Path("."))
        if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
            return f"--out {args.out}: {ancestor} is not a writable folder"
    return None


def run(args: argparse.Namespace, check_args: list[str] | None = None) -> int:
    from torch_neuronx.tools.migrate import report
    from torch_neuronx.tools.migrate.engine import migrate_paths, unified_diff
    from torch_neuronx.tools.migrate.python import CPU, NEURON

    for option, given in (("--check", args.check), ("--tp-invariance", args.tp_invariance is not None)):
        if given and not (args.out or args.in_place):
            print(f"torch-neuronx migrate: {option} runs the migrated script: give --out DIR or --in-place",
                  file=sys.stderr)
            return 2
    if args.tp_invariance is not None and args.tp_invariance < 2:
        print(f"torch-neuronx migrate: --tp-invariance {args.tp_invariance}: give a tensor-parallel size of 2 or "
              "more", file=sys.stderr)
        return 2
    bad_output = _unwritable_output(args)
    if bad_output:
        print(f"torch-neuronx migrate: {bad_output} (nothing was written)", file=sys.stderr)
        return 2
    target = CPU if args.target == "cpu" else NEURON
    results = migrate_paths(args.paths, out_dir=args.out, in_place=args.in_place, target=target)
    files = [m.report for m in results]
    if args.diff:
        sys.stdout.write(unified_diff(results))
    text = report.text(files)
    print(text.splitlines()[-1] if args.quiet else text)
    code = report.exit_code(files)
    check_code = 0
    if args.check and code < 2:
        check_code, _ = _run_check(args, list(check_args or []), results, CPU)
    if args.tp_invariance is not None and code < 2:
        check_code = max(check_code, _run_tp_invariance(args, list(check_args or []), results))
    if args.json:
        try:
            report.write_json(files, args.json)
        except OSError as e:  # checked before anything was written; it can still fill up or vanish since
            print(f"torch-neuronx migrate: --json {args.json}: cannot write it: {e.strerror or e}", file=sys.stderr)
            return 2
        print(f"JSON report: {args.json}")
    if not args.out and not args.in_place and any(f.changed for f in files):
        print("(dry run: nothing written; use --out DIR or --in-place)")
    return max(code, check_code)
