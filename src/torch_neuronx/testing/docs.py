"""The Python samples of README.md and docs/*.md, as tests: every fenced ``python`` block is extracted and run.

A sample shows the few lines that matter and leaves out what any script has
(a model, a batch, a tokenizer): the comment line right above its fence names
the fixtures that provide them, and how to run it::

    <!-- doctest: model -->                 the fixture "model" runs first (MyModel, model, x, dataloader, ...)
    <!-- doctest: qkv torchrun=2 -->        under torchrun with 2 processes (a short form of a larger launch)
    <!-- doctest: continue -->              after the previous block of the same file, in one process
    <!-- doctest: parse-only torch_xla -->  only parsed: code for another stack (the reason follows)

A block without a comment runs as it is. Each block runs in a fresh process
in an empty folder (tests/test_docs.py); a failure names the file and line. A
block and the ``continue`` blocks after it run in one process (one launch),
which prints a line after each block's code: each block's test reads whether
its line came. Blocks that run alone on the same fixtures in plain Python (no
torchrun, no ``env=``, no chain) share one process too (:func:`group_program`),
to pay torch's import once rather than per block; each still runs as a script
of its own (``runpy``: its own ``__main__`` namespace, folder and fixtures).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from torch_neuronx.testing.workers import BASE_ENV, torchrun_argv

_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```", re.S | re.M)
_MARK = re.compile(r"<!--\s*doctest:(.*?)-->")
_START = re.compile(r"^<doctest \S+ start>$", re.M)  # the line a group's run writes as each block starts

# What the samples leave out. Sizes are small: these run in CI.
FIXTURES: dict[str, str] = {
    "torch": "import torch, torch_neuronx\n",
    "model": '''
import torch, torch_neuronx
torch.manual_seed(0)
class MyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    def forward(self, x):
        return self.net(x)
dataloader = [(torch.randn(8, 16), torch.randint(0, 4, (8,))) for _ in range(3)]
model = MyModel().to("neuron")
x = torch.randn(8, 16, device="neuron")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
def train_step():
    loss = model(x).square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
''',
    "lm": '''
import torch, torch_neuronx
from torch_neuronx.testing.models import TinyLM, lm_batch
torch.manual_seed(0)
class MyModel(TinyLM):
    def __init__(self):
        super().__init__(vocab=128, dim=32, heads=2, layers=1)
    def forward(self, ids):
        from types import SimpleNamespace
        logits = super().forward(ids)
        return SimpleNamespace(logits=logits, loss=logits.float().square().mean())
x = lm_batch(2, 16, 128, seed=0).to("neuron")
model = MyModel().to("neuron")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
''',
    "qkv": '''
import torch, torch_neuronx
import torch.nn.functional as F
torch.manual_seed(0)
q, k, v = (torch.randn(1, 2, 1024, 16, device="neuron", requires_grad=True) for _ in range(3))
''',
    "buckets": '''
import random, torch, torch_neuronx
rng = random.Random(0)
dataset_lengths = [rng.randint(16, 1024) for _ in range(2000)]
token_lists = [[rng.randrange(1, 100) for _ in range(n)] for n in (5, 130, 70)]
input_ids = [torch.randint(1, 100, (n,)) for n in (200, 300)]
mask = [torch.ones(n, dtype=torch.long) for n in (200, 300)]
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(128, 8)
    def forward(self, input_ids, attention_mask):
        return (self.embed(input_ids) * attention_mask[..., None]).sum(1)
compiled = torch.compile(Model().to("neuron"), backend="neuron")
''',
    "hf": '''
import os, torch, torch_neuronx
from torch_neuronx.testing.hf import save_checkpoint
# one decoder layer: what the samples show (loading, generate, SFT) does not depend on the depth
path = str(save_checkpoint(f"tiny-llama-{os.environ.get('RANK', '0')}", layers=1))  # one per rank under torchrun
from transformers import AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained(path)
inputs = tokenizer(["the cat sat on"], return_tensors="pt")
''',
    "dist": '''
import datetime, os, torch, torch_neuronx
import torch.distributed as dist
import torch.nn.functional as F
world_size = int(os.environ.get("WORLD_SIZE", "1"))
''',
}


@dataclass
class Block:
    """One fenced python block: where it is, its code, and its comment's words."""

    path: Path
    line: int
    code: str
    marks: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.path.name}:{self.line}"

    def option(self, key: str) -> str | None:
        return next((m.split("=", 1)[1] for m in self.marks if m.startswith(key + "=")), None)


def blocks(paths: list[Path]) -> list[Block]:
    """Every fenced python block of the files, with the words of the doctest comment just above it."""
    found = []
    for path in paths:
        text = path.read_text()
        for m in _FENCE.finditer(text):
            before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            mark = _MARK.search(before)
            marks = mark.group(1).split() if mark else []
            unknown = [w for w in marks if w not in FIXTURES and w not in ("continue", "parse-only")
                       and not w.startswith(("torchrun=", "env="))]
            if unknown and "parse-only" not in marks:
                raise ValueError(f"{path}:{text[: m.start()].count(chr(10)) + 1}: unknown doctest words {unknown}")
            found.append(Block(path, text[: m.start()].count("\n") + 1, m.group(1), marks))
    return found


def program(block: Block, previous: list[Block]) -> str:
    """The source that runs `block`: its fixtures, the blocks it continues, then its own code."""
    parts = [FIXTURES[w] for w in block.marks if w in FIXTURES]
    if "continue" in block.marks:
        chain = []
        for b in reversed(previous):
            chain.insert(0, b)
            if "continue" not in b.marks:
                break
        parts = [FIXTURES[w] for w in chain[0].marks if w in FIXTURES] + [b.code for b in chain]
    return "\n".join(parts + [block.code])


def chain(block: Block, following: list[Block]) -> list[Block]:
    """`block` and the blocks after it in its file that continue it (``continue``), in order."""
    blocks = [block]
    for b in following:
        if b.path != block.path or "continue" not in b.marks or "parse-only" in b.marks + block.marks \
                or (b.option("torchrun"), b.option("env")) != (block.option("torchrun"), block.option("env")):
            break
        blocks.append(b)
    return blocks


def done_marker(block: Block) -> str:
    """The line a chain's program prints once `block`'s code has run (see :func:`chain_program`)."""
    return f"<doctest {block.name} done>"


def chain_program(blocks: list[Block]) -> str:
    """One program for a chain (:func:`chain`): the first block's fixtures, then each block's code followed by a
    line naming it, so one process (one launch) runs what a process per block would, in the same order."""
    parts = [FIXTURES[w] for w in blocks[0].marks if w in FIXTURES]
    for b in blocks:
        parts += [b.code, f"print({done_marker(b)!r}, flush=True)\n"]
    return "\n".join(parts)


def group_key(block: Block) -> tuple[str, ...] | None:
    """The fixtures a block runs on when it may share a process with the other blocks on the same fixtures (it runs
    by itself, in plain Python), or None when it needs a process of its own (torchrun, ``env=``, parse-only, or
    ``continue``: a chain has its own run)."""
    if any(w in block.marks for w in ("continue", "parse-only")) or block.option("torchrun") or block.option("env"):
        return None
    return tuple(w for w in block.marks if w in FIXTURES)


# The program of a group: each block's script (its fixtures and code, in a folder of its own) run as `python
# sample.py` would run it (runpy: a fresh __main__ namespace, __file__, argv[0]), then a line naming it once it ran
# to its end; a block that raises prints its traceback and the next block runs.
_GROUP_RUNNER = """\
import os, runpy, sys, traceback
def _run_block(name, folder, done):
    script = os.path.join(folder, "sample.py")
    os.chdir(folder)
    print(f"<doctest {name} start>", file=sys.stderr, flush=True)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            traceback.print_exc()
            return
    except KeyboardInterrupt:
        raise
    except BaseException:
        traceback.print_exc()
        return
    print(done, flush=True)
"""


def group_program(blocks: list[Block], workdir: Path) -> str:
    """One program for blocks that each run alone (:func:`group_key`): writes each block's script into a folder
    of its own under `workdir`, and returns the program that runs them one after another in one process."""
    calls = []
    for i, b in enumerate(blocks):
        folder = workdir / f"block{i}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "sample.py").write_text(program(b, []))
        calls.append(f"_run_block({b.name!r}, {str(folder.absolute())!r}, {done_marker(b)!r})\n")
    return _GROUP_RUNNER + "".join(calls)


def run_group(blocks: list[Block], workdir: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run a group (:func:`group_program`) in one process. Past the timeout the process is killed and what it
    printed comes back with return code -9: the blocks that had not run fail, and the group is not run again."""
    try:
        return run(blocks[0], [], workdir, timeout, source=group_program(blocks, workdir))
    except subprocess.TimeoutExpired as exc:
        def text(out: str | bytes | None) -> str:
            return out.decode(errors="replace") if isinstance(out, bytes) else out or ""
        return subprocess.CompletedProcess(exc.cmd, -9, text(exc.stdout),
                                           text(exc.stderr) + f"\n<killed after {timeout:g} s>")


def section(block: Block, stderr: str) -> str:
    """What a group's run wrote to stderr while `block` ran (all of it when the block has no start line)."""
    start = stderr.find(f"<doctest {block.name} start>")
    if start < 0:
        return stderr
    following = _START.search(stderr, start + 1)
    return stderr[start:following.start()] if following else stderr[start:]


def ran(block: Block, result: subprocess.CompletedProcess[str]) -> bool:
    """Whether `block`'s code ran to its end in a chain's or a group's run: its line printed by every process."""
    return result.stdout.count(done_marker(block)) >= int(block.option("torchrun") or 1)


def run(block: Block, previous: list[Block], workdir: Path, timeout: float = 600,
        source: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run one block (under torchrun when it asks) in `workdir`; raises for a parse-only block that does not parse.
    `source`: run this program in place of the block's own (a chain's, :func:`chain_program`)."""
    source = program(block, previous) if source is None else source
    if "parse-only" in block.marks:
        compile(source, block.name, "exec")
        return subprocess.CompletedProcess([], 0, "", "")
    script = workdir / "sample.py"
    script.write_text(source)
    env = {**BASE_ENV, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    for item in (block.option("env") or "").split(","):
        if "=" in item:
            key, value = item.split("=", 1)
            env[key] = value
    nproc = block.option("torchrun")
    # --standalone: torchrun binds a port the OS assigns (a port asked for beforehand may be taken meanwhile)
    argv = ([*torchrun_argv("--standalone", "--nproc-per-node", nproc), str(script)]
            if nproc else [sys.executable, str(script)])
    return subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
