"""docs/plan.md's example outputs, regenerated from the tool itself: each ``$ torch-neuronx plan`` block is run in
process on the example inputs (the shared configs of :mod:`torch_neuronx.testing.plan`), so the docs never drift.
"""

from __future__ import annotations

from pathlib import Path

from torch_neuronx.testing.plan import EXAMPLE_MODELS, example_lengths


def write_example_inputs(workdir: Path) -> None:
    """The model directories and lengths file the docs' example commands name, under `workdir`."""
    import json

    for name, config in EXAMPLE_MODELS.items():
        (workdir / name).mkdir(parents=True, exist_ok=True)
        (workdir / name / "config.json").write_text(json.dumps(config))
    (workdir / "lengths.txt").write_text("\n".join(map(str, example_lengths())) + "\n")


def run_example(command: str, workdir: Path) -> list[str]:
    """The output lines of one docs example ``torch-neuronx plan ...`` (``| head -N`` applied, ``--measure``
    left out), run in process from `workdir`."""
    import argparse
    import contextlib
    import io
    import os
    import shlex

    from torch_neuronx.tools.plan import cli as plan_cli

    command, _, tail = command.partition("|")
    argv = shlex.split(command)[1:]  # after "torch-neuronx"
    if "--measure" in argv:
        i = argv.index("--measure")
        del argv[i:i + (2 if i + 1 < len(argv) and argv[i + 1].isdigit() else 1)]
    parser = argparse.ArgumentParser()
    plan_cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    out = io.StringIO()
    cwd = os.getcwd()
    try:
        os.chdir(workdir)
        with contextlib.redirect_stdout(out):
            code = plan_cli.run(args)
    finally:
        os.chdir(cwd)
    if code:
        raise RuntimeError(f"the docs example {command!r} exited {code}")
    lines = out.getvalue().splitlines()
    head = tail.split()
    if head[:1] == ["head"]:
        lines = lines[:int(head[1].lstrip("-n"))]
    return lines


def regenerate_examples(text: str, workdir: Path) -> str:
    """`text` (docs/plan.md) with every ``$ torch-neuronx plan`` example block's output replaced by the tool's.
    A --measure example keeps its measured lines after their layout's row; the notes only a run adds ("--measure
    skipped ...") are not regenerated, so such an example must rank a measurable layout first."""
    write_example_inputs(workdir)
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        out.append(lines[i])
        if lines[i] == "```text" and i + 1 < len(lines) and lines[i + 1].startswith("$ torch-neuronx plan"):
            i += 1
            command_lines = [lines[i]]
            while command_lines[-1].endswith("\\"):
                i += 1
                command_lines.append(lines[i])
            end = lines.index("```", i)
            old = lines[i + 1:end]
            command = " ".join(c.rstrip("\\").strip() for c in command_lines)[2:]
            new = run_example(command, workdir)
            if "--measure" in command:
                new = _keep_measured(old, new)
            out += command_lines + new
            i = end
            out.append(lines[i])
        i += 1
    return "\n".join(out)


def _keep_measured(old: list[str], new: list[str]) -> list[str]:
    measured: dict[str, list[str]] = {}
    row = ""
    for line in old:
        if line.strip().startswith("measured:"):
            measured.setdefault(row, []).append(line)
        elif line[:3].strip().isdigit():
            row = line.split()[1]
    merged: list[str] = []
    for line in new:
        merged.append(line)
        if line[:3].strip().isdigit():
            merged += measured.get(line.split()[1], [])
    return merged
