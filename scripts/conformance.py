#!/usr/bin/env python
"""Differential OpInfo conformance of the neuron device against CPU.

    python scripts/conformance.py                      # all of op_db
    python scripts/conformance.py --subset ci          # the CI slice, a few minutes
    python scripts/conformance.py --ops add nn.functional.conv2d --dtypes float32 bfloat16
    python scripts/conformance.py --subset ci --json out.json --markdown out.md --min-pass-rate 0.99

Prints the pass rate and the failures; exits 1 on a regression (a failure not
listed in the expected-failures file, or a pass rate under --min-pass-rate),
2 on a usage error.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from pathlib import Path

from torch_neuronx.testing import conformance as h

DEFAULT_EXPECTED = h.EXPECTED_FAILURES


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", nargs="+", metavar="NAME",
                   help="OpInfo names: a full name (div.no_rounding_mode), a name (all its variants) or a glob")
    p.add_argument("--subset", choices=["ci"], help="a fixed representative subset")
    p.add_argument("--dtypes", nargs="+", choices=sorted(h.DTYPE_NAMES), metavar="DTYPE",
                   help=f"dtypes to test (default: all of {', '.join(h.DTYPE_NAMES)})")
    p.add_argument("--json", type=Path, metavar="PATH", help="write the full results as JSON")
    p.add_argument("--markdown", type=Path, metavar="PATH", help="write a Markdown report")
    p.add_argument("--min-pass-rate", type=float, default=0.0,
                   help="a pass rate (neuron passes / compared CPU passes) below this is a regression")
    p.add_argument("--expected", type=Path, default=DEFAULT_EXPECTED,
                   help="expected failures, JSON {'op/dtype': reason} (default: %(default)s)")
    p.add_argument("--in-process", action="store_true",
                   help="run here instead of in worker processes (faster to start; a crash ends the run)")
    p.add_argument("--chunk-ops", type=int, default=25, help="OpInfos per worker process")
    p.add_argument("--threads", type=int, default=1, help="CPU threads per worker (0: torch's default)")
    p.add_argument("--max-failures-shown", type=int, default=40)
    p.add_argument("--list", action="store_true", help="list the selected op/dtype units and exit")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    return p.parse_args(argv)


def _select(table: dict[str, object], ops: list[str] | None, subset: str | None) -> list[str]:
    if subset == "ci":
        names = list(h.CI_SUBSET)
    elif not ops:
        return list(table)
    else:
        names = []
    for pattern in ops or []:
        hits = [n for n, op in table.items()
                if n == pattern or getattr(op, "name", None) == pattern or fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            raise SystemExit(f"conformance.py: no OpInfo matches {pattern!r}")
        names += [n for n in hits if n not in names]
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"conformance.py: unknown OpInfos {unknown}")
    return names


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    h.import_device()
    table = h.op_table()
    try:
        names = _select(table, args.ops, args.subset)
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    dtypes = [h.DTYPE_NAMES[d] for d in args.dtypes] if args.dtypes else list(h.DEVICE_DTYPES)
    units = h.units_for([table[n] for n in names], dtypes)
    if args.list:
        print("\n".join(f"{n}/{d}" for n, d in units))
        return 0

    def log(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    log(f"{len(names)} OpInfos, {len(units)} op/dtype units")
    if args.in_process:
        report = h.run_in_process(units, threads=args.threads, progress=log)
    else:
        report = h.run_in_subprocesses(units, chunk_ops=args.chunk_ops, threads=args.threads, log=log)
    expected = h.load_expected(args.expected)
    verdict = h.judge(report, expected, args.min_pass_rate, ran=[f"{n}/{d}" for n, d in units])

    s = report.summary()
    print(f"samples: {s['samples_attempted']} attempted, {s['samples_cpu_pass']} pass on CPU, "
          f"{s['samples_compared']} compared, {s['samples_neuron_pass']} pass on neuron "
          f"({s['gradients_checked']} with gradients); skipped {s['skipped']}; "
          f"random ops differing: {s['samples_random_differ']}")
    print(f"pass rate: {report.pass_rate:.4%} (neuron passes / compared CPU passes), {s['seconds']}s")
    cats = h.category_counts(report.failures)
    if cats:
        print("failure categories:")
        for c, n in cats.most_common():
            print(f"  {n:6d}  {c}")
    for title, items in (("unexpected failures", [(f, "") for f in verdict.regressions]),
                         ("expected failures", verdict.explained)):
        if not items:
            continue
        by_key: dict[str, list[str]] = {}
        for f, reason in items:
            by_key.setdefault(f.key, []).append(f.describe() + (f"  [{reason}]" if reason else ""))
        print(f"{title}: {len(items)} samples in {len(by_key)} op/dtypes")
        for key, lines in list(by_key.items())[: args.max_failures_shown]:
            print(f"  {key} ({len(lines)}): {lines[0].split(': ', 1)[1][:240]}")
        if len(by_key) > args.max_failures_shown:
            print(f"  ... {len(by_key) - args.max_failures_shown} more op/dtypes")
    if verdict.stale:
        print(f"expected failures that passed: {', '.join(verdict.stale)}")
    for note in report.notes:
        print(f"note: {note}")
    if not verdict.rate_ok:
        print(f"pass rate {report.pass_rate:.4%} is below the minimum {args.min_pass_rate:.2%}")
    print("OK" if verdict.ok else "REGRESSION")

    if args.json:
        args.json.write_text(json.dumps(h.to_json(report, verdict), indent=1))
    if args.markdown:
        args.markdown.write_text(h.to_markdown(report, verdict))
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
