"""How long `torch-neuronx migrate` takes on a tree of 200 files (the target: under 30 s), beside a bare libcst
parse-and-print of the same files (the floor any libcst codemod pays).

The tree is built from the test corpus (tests/tools/migrate_corpus: XLA single-device, xmp.spawn, torchrun,
Optimum Neuron, NxD, a notebook, a launcher), cycled to `--files` files, each made distinct; every file needs
migrating, so this is the worst case (a real repository holds mostly files the migration skips after one text
scan). Both variants run in alternating rounds; the figures are medians.

    python benchmarks/bench_migrate.py [--files 200] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from torch_neuronx.testing.bench import interleaved, medians, report

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "tools" / "migrate_corpus"


def build_tree(root: Path, n: int) -> list[Path]:
    sources = sorted(p for p in CORPUS.iterdir() if p.suffix in (".py", ".ipynb", ".sh"))
    files = []
    for i in range(n):
        src = sources[i % len(sources)]
        dest = root / f"pkg{i // 20}" / f"{src.stem}_{i}{src.suffix}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        text = src.read_text()
        if src.suffix == ".py":
            text += f"\nBENCH_FILE_ID = {i}\n"
        elif src.suffix == ".sh":
            text += f"# file {i}\n"
        dest.write_text(text)
        files.append(dest)
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()

    import libcst as cst

    from torch_neuronx.tools.migrate.engine import migrate_paths

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "tree"
        files = build_tree(root, args.files)
        out = Path(tmp) / "out"
        py = [f for f in files if f.suffix == ".py"]

        def migrate() -> None:
            shutil.rmtree(out, ignore_errors=True)
            results = migrate_paths([root], out_dir=out)
            assert len(results) == args.files and not any(m.report.error for m in results)

        def libcst_roundtrip() -> None:
            for f in py:
                cst.parse_module(f.read_text()).code  # noqa: B018

        samples = interleaved({"migrate": migrate, "libcst_roundtrip_py_only": libcst_roundtrip}, args.rounds,
                              inner=1, warmup=1)
        m = medians(samples)
        size = sum(f.stat().st_size for f in files)
    report({
        "files": args.files, "python_files": len(py), "bytes": size,
        "migrate_s": round(m["migrate"], 2), "files_per_s": round(args.files / m["migrate"], 1),
        "libcst_roundtrip_py_only_s": round(m["libcst_roundtrip_py_only"], 2),
        "ratio_migrate_to_roundtrip": round(m["migrate"] / m["libcst_roundtrip_py_only"], 2),
        "target_s": 30.0, "within_target": m["migrate"] < 30.0,
        "samples": {k: [round(v, 2) for v in vs] for k, vs in samples.items()},
    }, args.json)


if __name__ == "__main__":
    main()
