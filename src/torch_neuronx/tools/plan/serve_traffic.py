"""Read a serving traffic distribution: ``[prompt_len, output_len]`` pairs from a JSON, JSON Lines or CSV file.

Why it exists: buckets and latency percentiles are only as good as the
request shapes they are chosen for; this module turns a file of real
traffic into validated pairs, or says in one line what is wrong with it.

* ``.json``: a list of two-element lists, ``[[812, 128], [90, 40], ...]``;
* ``.jsonl``: one such pair (or an object with ``prompt_len`` and ``output_len``) per line;
* ``.csv``: two columns, with or without a header row; a header naming ``prompt_len`` and ``output_len`` is read
  by name (in any order, other columns ignored), a header without those names is refused.

Only a regular file of at most :data:`MAX_BYTES` is read (a FIFO would block, ``/dev/zero`` never ends).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from torch_neuronx.tools.plan.padding import _whole

MAX_TOKENS = 1 << 22  # no model serves a context near 4M tokens; larger is a broken file
MAX_REQUESTS = 10_000_000
MAX_BYTES = 512 << 20  # 10M requests at ~20 bytes each is ~200 MB; more is not a traffic sample
COLUMNS = ("prompt_len", "output_len")


class TrafficError(ValueError):
    """A traffic file that cannot be read as request shapes."""


def _pair(value: Any, where: str) -> tuple[int, int]:
    if isinstance(value, dict):
        value = [value.get("prompt_len"), value.get("output_len")]
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise TrafficError(f"{where}: {value!r} is not a [prompt_len, output_len] pair")
    prompt, output = _whole(value[0]), _whole(value[1])
    if prompt is None or output is None or not (1 <= prompt <= MAX_TOKENS and 1 <= output <= MAX_TOKENS):
        raise TrafficError(f"{where}: {value!r}: prompt and output lengths must be whole numbers from 1 to "
                           f"{MAX_TOKENS}")
    return prompt, output


def read_traffic(path: str | Path) -> list[tuple[int, int]]:
    """(prompt_len, output_len) of every request in the file."""
    p = Path(path)
    label = f"--lengths {path}"
    try:
        if not p.exists():
            raise FileNotFoundError(path)
        if not p.is_file():  # a FIFO blocks until a writer comes, a device may never end: refused before opening
            raise TrafficError(f"{label}: not a regular file; give a .json, .jsonl or .csv file")
        with open(p, "rb") as f:
            data = f.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:
            raise TrafficError(f"{label}: larger than {MAX_BYTES:,} bytes; sample at most {MAX_REQUESTS:,} "
                               "requests")
        text = data.decode("utf-8-sig")  # a byte-order mark (Excel's "CSV UTF-8") is not part of the header
    except FileNotFoundError:
        raise TrafficError(f"{label}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TrafficError(f"{label}: cannot read it as text ({exc.__class__.__name__})") from None
    if p.suffix == ".csv":
        pairs = _csv(text, label)
    elif p.suffix == ".jsonl":
        pairs = [_pair(_json(line, f"{label} line {i}"), f"{label} line {i}")
                 for i, line in enumerate(text.splitlines(), 1) if line.strip()]
    else:
        data = _json(text, label)
        if not isinstance(data, list):
            raise TrafficError(f"{label}: a JSON {type(data).__name__}; give a list of [prompt_len, output_len] pairs")
        pairs = [_pair(v, f"{label} item {i}") for i, v in enumerate(data)]
    if not pairs:
        raise TrafficError(f"{label}: no requests in it; give at least one [prompt_len, output_len] pair")
    if len(pairs) > MAX_REQUESTS:
        raise TrafficError(f"{label}: {len(pairs)} requests; sample at most {MAX_REQUESTS:,}")
    return pairs


def _json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TrafficError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except (ValueError, RecursionError) as exc:  # RecursionError: lists nested thousands deep
        raise TrafficError(f"{where}: not a list of pairs ({type(exc).__name__})") from None


def _csv(text: str, label: str) -> list[tuple[int, int]]:
    try:
        rows = [[c.strip() for c in r] for r in csv.reader(text.splitlines()) if r and any(c.strip() for c in r)]
    except csv.Error as exc:
        raise TrafficError(f"{label}: not a CSV file ({exc})") from None
    if not rows or all(_whole(c) is not None for c in rows[0][:2]):  # no header: prompt, output
        return [_pair(r, f"{label} line {i}") for i, r in enumerate(rows, 1)]
    names = [c.lower() for c in rows[0]]  # a header: the columns are found by name
    missing = [n for n in COLUMNS if n not in names]
    if missing:
        raise TrafficError(f"{label}: its header {rows[0]} lacks {' and '.join(missing)}; name the columns "
                           "prompt_len and output_len, or leave the header out (prompt first)")
    prompt, output = names.index(COLUMNS[0]), names.index(COLUMNS[1])
    pairs = []
    for i, r in enumerate(rows[1:], 2):
        if len(r) != len(names):
            raise TrafficError(f"{label} line {i}: {len(r)} cells under a header of {len(names)}")
        pairs.append(_pair([r[prompt], r[output]], f"{label} line {i}"))
    return pairs
