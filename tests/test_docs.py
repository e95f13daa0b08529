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

# Blocks that run alone on the same fixtures in plain Python: one process for each set of fixtures (docs.group_key),
# each block still a script of its own; the first block's test runs them all, every test reads its block's line.
_BY_FIXTURES: dict[tuple[str, ...], list[int]] = {}
for _i, _b in enumerate(BLOCKS):
    if _i not in HEAD and (_key := docs.group_key(_b)) is not None:
        _BY_FIXTURES.setdefault(_key, []).append(_i)
GROUP = {i: tuple(members) for members in _BY_FIXTURES.values() if len(members) > 1 for i in members}
_group_runs: dict[tuple[int, ...], subprocess.CompletedProcess[str]] = {}


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
    elif index in GROUP:
        members = [BLOCKS[i] for i in GROUP[index]]
        if GROUP[index] not in _group_runs:
            _group_runs[GROUP[index]] = docs.run_group(members, tmp_path_factory.mktemp("group"))
        r = _group_runs[GROUP[index]]
        r = subprocess.CompletedProcess(r.args, r.returncode, r.stdout, docs.section(block, r.stderr))
        # the last block's test also fails when the process did not exit cleanly (a crash at exit)
        ok = docs.ran(block, r) and (r.returncode == 0 or index != GROUP[index][-1])
        source = docs.program(block, [])
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


def test_a_group_runs_each_block_as_its_own_script_and_names_the_block_that_failed(tmp_path: Path) -> None:
    # the twin pair for the shared process above: blocks on the same fixtures share a process, yet each runs in
    # its own namespace and folder, and one that raises fails its own test only
    md = tmp_path / "sample.md"
    md.write_text("```python\nx = 1\nopen('mine', 'w').close()\n```\n\n"
                  "```python\nraise ValueError('boom')\n```\n\n"
                  "```python\nimport os\nassert 'x' not in globals() and __name__ == '__main__', 'shared namespace'\n"
                  "assert os.listdir() == ['sample.py'], os.listdir()\n```\n")
    blocks = docs.blocks([md])
    assert [docs.group_key(b) for b in blocks] == [(), (), ()]
    alone = [docs.Block(md, 1, "", marks) for marks in (["dist", "torchrun=2"], ["continue"], ["model", "env=A=1"])]
    assert [docs.group_key(b) for b in alone] == [None, None, None]
    r = docs.run_group(blocks, tmp_path)
    assert [docs.ran(b, r) for b in blocks] == [True, False, True], r.stderr
    failed = docs.section(blocks[1], r.stderr)
    assert "ValueError: boom" in failed and f"<doctest {blocks[1].name} start>" in failed
    assert "ValueError" not in docs.section(blocks[0], r.stderr) + docs.section(blocks[2], r.stderr)


def test_a_group_past_its_timeout_fails_the_blocks_that_had_not_run(tmp_path: Path) -> None:
    # a hung block costs its group one timeout, not one per block: what ran before it still passes
    md = tmp_path / "sample.md"
    md.write_text("```python\nprint('first')\n```\n\n```python\nimport time\ntime.sleep(60)\n```\n")
    blocks = docs.blocks([md])
    r = docs.run_group(blocks, tmp_path, timeout=3)
    assert r.returncode == -9 and "killed after 3 s" in r.stderr
    assert [docs.ran(b, r) for b in blocks] == [True, False]
