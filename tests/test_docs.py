"""Every fenced Python sample of README.md and docs/*.md runs (torch_neuronx.testing.docs): a sample that no
longer works fails here, naming its file and line."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from torch_neuronx.testing import docs

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = docs.blocks([ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])


def test_there_are_samples_to_run() -> None:
    assert len(BLOCKS) >= 20 and {b.path.name for b in BLOCKS} >= {"README.md", "memory.md", "attention.md"}


# A block with `continue` blocks after it: one run of them all, shared by their tests (a process, or a torchrun
# launch, per block would rerun the blocks before it).
CHAINS = {i: docs.chain(b, BLOCKS[i + 1:]) for i, b in enumerate(BLOCKS) if "continue" not in b.marks}
HEAD = {i + k: i for i, blocks in CHAINS.items() if len(blocks) > 1 for k in range(len(blocks))}
_chain_runs: dict[int, subprocess.CompletedProcess[str]] = {}


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=[b.name for b in BLOCKS])
def test_sample_runs(index: int, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    block = BLOCKS[index]
    previous = [b for b in BLOCKS[:index] if b.path == block.path]
    if index in HEAD:
        head = HEAD[index]
        if head not in _chain_runs:
            _chain_runs[head] = docs.run(BLOCKS[head], [], tmp_path_factory.mktemp("chain"),
                                         source=docs.chain_program(CHAINS[head]))
        r = _chain_runs[head]
        last = index == head + len(CHAINS[head]) - 1
        ok = docs.ran(block, r) and (r.returncode == 0 or not last)
        source = docs.chain_program(CHAINS[head])
    else:
        r = docs.run(block, previous, tmp_path)
        ok, source = r.returncode == 0, docs.program(block, previous)
    assert ok, f"{block.name} ({' '.join(block.marks) or 'no fixtures'}) failed:\n" \
               f"{source}\n--- stdout\n{r.stdout[-2000:]}\n--- stderr\n{r.stderr[-4000:]}"


def test_a_chain_runs_each_block_once_and_names_the_block_that_failed(tmp_path: Path) -> None:
    # the twin pair for the shared run above: a chain whose second block raises passes its first block's test only
    md = tmp_path / "sample.md"
    md.write_text("```python\nx = 1\n```\n\n<!-- doctest: continue -->\n```python\n"
                  "raise SystemExit(f'boom {x}')\n```\n\n<!-- doctest: continue -->\n```python\ny = x\n```\n")
    first, second, third = docs.blocks([md])
    assert docs.chain(first, [second, third]) == [first, second, third]
    r = docs.run(first, [], tmp_path, source=docs.chain_program([first, second, third]))
    assert r.returncode == 1 and "boom 1" in r.stderr
    assert [docs.ran(b, r) for b in (first, second, third)] == [True, False, False]
