"""Every fenced Python sample of README.md and docs/*.md runs (torch_neuronx.testing.docs): a sample that no
longer works fails here, naming its file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from torch_neuronx.testing import docs

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = docs.blocks([ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])


def test_there_are_samples_to_run() -> None:
    assert len(BLOCKS) >= 20 and {b.path.name for b in BLOCKS} >= {"README.md", "memory.md", "attention.md"}


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=[b.name for b in BLOCKS])
def test_sample_runs(index: int, tmp_path: Path) -> None:
    block = BLOCKS[index]
    previous = [b for b in BLOCKS[:index] if b.path == block.path]
    r = docs.run(block, previous, tmp_path)
    assert r.returncode == 0, f"{block.name} ({' '.join(block.marks) or 'no fixtures'}) failed:\n" \
                              f"{docs.program(block, previous)}\n--- stdout\n{r.stdout[-2000:]}\n--- stderr\n" \
                              f"{r.stderr[-4000:]}"
