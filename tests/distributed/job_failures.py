"""Rank side of test_failures.py: one rank misbehaves before an all_reduce.

    python job_failures.py MODE     (environment as torchrun sets it; JOB_TIMEOUT seconds, default 10)

MODE: die (rank 1 exits), hang (rank 1 sleeps past the timeout), mismatch_larger
/ mismatch_smaller (rank 1 reduces more / fewer elements than rank 0). Each
rank prints one JSON line: what happened and after how long; a rank that
caught an error exits 1.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main(mode: str) -> int:
    rank = int(os.environ["RANK"])
    timeout = float(os.environ.get("JOB_TIMEOUT", "10"))
    torch.set_num_threads(1)
    backend = os.environ.get("JOB_BACKEND", "neuron")  # "gloo" to compare with plain Gloo on CPU
    device = "neuron" if backend == "neuron" else "cpu"
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    dist.barrier()
    numel = 4
    if rank == 1:
        if mode == "die":
            os._exit(3)
        if mode == "hang":
            time.sleep(timeout + 6)  # then gone, as if the launcher killed it
            os._exit(4)
        numel = {"mismatch_larger": 8, "mismatch_smaller": 3}.get(mode, numel)
    t0 = time.monotonic()
    report: dict[str, object] = {"rank": rank, "mode": mode}
    try:
        t = torch.ones(numel, device=device)
        dist.all_reduce(t)
        report["result"] = t.tolist()
        dist.barrier()  # a rank that got through still meets the others
        report["ok"] = True
    except Exception as e:
        report |= {"ok": False, "error": f"{type(e).__name__}: {e}"}
    report["seconds"] = round(time.monotonic() - t0, 2)
    print(json.dumps(report), flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
