"""What the NKI interpreter costs: seconds per launch and per instruction, against the same computation as one torch op.

Two kernels from torch_neuronx.testing.nki_kernels, on neuron tensors:

* a 1024 x 1024 x 1024 bfloat16 tiled matmul (``matmul_tiled``: 128 x 512 output tiles, fp32 PSUM accumulation
  over 8 contraction tiles) against ``a @ b`` in bfloat16 on the same device;
* a 4096-token attention forward, one head of 128, causal (``attention_fwd``: flash-style online softmax over
  512-key tiles) against ``F.scaled_dot_product_attention(..., is_causal=True)`` on the same device.

A third case runs 2,000 instructions on (128, 8) tiles, where the compute is negligible: its time per instruction
is the interpreter's own overhead (checks, views, dispatch).

Each pair is timed side by side in alternating rounds (medians). The figure per instruction is the launch time
divided by the instructions it ran (``nki.last_report()``; ``nl.ndarray`` allocations are counted apart).
The goal: one tutorial-sized kernel launch in under a
second.

    python benchmarks/bench_nki.py [--quick] [--threads 1] [--json out.json]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import torch_neuronx  # noqa: F401
import torch_neuronx.nki as nki
from torch_neuronx.testing import nki_kernels as K
from torch_neuronx.testing.bench import arguments, interleaved, medians, parse, report


def case(name: str, kernel: object, reference: object, rounds: int) -> dict[str, float]:
    m = medians(interleaved({"nki": kernel, "torch": reference}, rounds, inner=1, warmup=1))  # type: ignore[dict-item]
    kernel()  # type: ignore[operator]
    launch = nki.last_report()
    assert launch is not None
    return {
        "nki_seconds_per_launch": round(m["nki"], 4),
        "torch_seconds_per_call": round(m["torch"], 5),
        "ratio_nki_to_torch": round(m["nki"] / m["torch"], 1),
        "instructions_per_launch": launch.total_instructions,  # instructions only, not nl.ndarray allocations
        "allocations_per_launch": sum(launch.allocations.values()),
        "microseconds_per_instruction": round(m["nki"] / launch.total_instructions * 1e6, 1),
        "sbuf_peak_bytes_per_partition": launch.sbuf_peak_bytes,
        "psum_peak_banks": launch.psum_peak_banks,
    }


def main() -> None:
    args = parse(arguments(__doc__))
    rounds = 2 if args.quick else 5
    g = torch.Generator().manual_seed(0)
    n = 512 if args.quick else 1024
    a = torch.randn(n, n, generator=g, dtype=torch.bfloat16).to("neuron")
    b = torch.randn(n, n, generator=g, dtype=torch.bfloat16).to("neuron")
    a_t = a.t().contiguous()
    results = {f"matmul_bf16_{n}": case("matmul", lambda: K.matmul_tiled(a_t, b), lambda: a @ b, rounds)}
    seq = 1024 if args.quick else 4096
    q, k, v = (torch.randn(seq, 128, generator=g).to("neuron") for _ in range(3))
    results[f"attention_fwd_causal_{seq}x128"] = case(
        "attention", lambda: K.attention_fwd(q, k, v, True),
        lambda: F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True), rounds)
    results["overhead_2000_small_instructions"] = overhead(rounds)
    report(results, args.json)


@nki.jit
def _small_steps(a: object) -> None:
    """2,000 instructions on (128, 8) tiles: the interpreter's own cost per instruction, the compute negligible."""
    nl, nisa = nki.language, nki.isa
    t = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    u = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
    for _ in nl.affine_range(1000):
        nisa.tensor_tensor(dst=u, data1=t, data2=t, op=nl.add)
        nisa.tensor_copy(dst=t, src=u)


def overhead(rounds: int) -> dict[str, float]:
    a = torch.ones(128, 8, device="neuron")
    m = medians(interleaved({"nki": lambda: _small_steps(a)}, rounds, inner=1, warmup=1))  # type: ignore[dict-item]
    launch = nki.last_report()
    assert launch is not None
    return {"instructions_per_launch": launch.total_instructions,
            "microseconds_per_instruction": round(m["nki"] / launch.total_instructions * 1e6, 1)}


if __name__ == "__main__":
    main()
