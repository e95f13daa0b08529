"""What the NKI interpreter costs: seconds per launch and per instruction, against the same computation as one torch op.

Two kernels from torch_neuronx.testing.nki_kernels, on neuron tensors:

* a 1024 x 1024 x 1024 bfloat16 tiled matmul (``matmul_tiled``: 128 x 512 output tiles, fp32 PSUM accumulation
  over 8 contraction tiles) against ``a @ b`` in bfloat16 on the same device;
* a 4096-token attention forward, one head of 128, causal (``attention_fwd``: flash-style online softmax over
  512-key tiles) against ``F.scaled_dot_product_attention(..., is_causal=True)`` on the same device.

A third case runs 2,000 instructions on (128, 8) tiles, where the compute is negligible: its time per instruction
is the interpreter's own overhead (checks, views, dispatch).

The matmul is also set against its floor, timed in the same rounds: the tile arithmetic the interpreter must do
to stay exact, in plain torch with no interpreter (``floor_tiles``: the same tile loads, bf16 -> float32
conversions, 128 x 128 x 512 float32 GEMMs, PSUM adds and bf16 stores), and the float32 GEMMs alone
(``floor_gemms``). PSUM sums bf16 x bf16 products in float32, and this host's torch has no bfloat16 GEMM with a
float32 result (``aten::mm.dtype`` has no CPU kernel), so the floor is float32 GEMMs; their ratio to the one
bfloat16 GEMM is the part of the matmul's ratio no interpreter change can remove. What the interpreter adds to
that arithmetic is ``interpreter_microseconds_per_operation``: the launch time less ``floor_tiles``, divided by
its instructions and allocations.

Threads: ``--threads`` (1 by default) sets the torch op's intra-op threads; the interpreter runs every launch on
one thread whatever it is set to, so the ratios compare like with like only at ``--threads 1``.

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


def case(name: str, kernel: object, reference: object, rounds: int,
         floors: dict[str, object] | None = None) -> dict[str, float]:
    """The kernel and its torch op (and any `floors`) in the same alternating rounds."""
    steps = {"nki": kernel, "torch": reference, **(floors or {})}
    m = medians(interleaved(steps, rounds, inner=1, warmup=1))  # type: ignore[arg-type]
    kernel()  # type: ignore[operator]
    launch = nki.last_report()
    assert launch is not None
    result = {
        "nki_seconds_per_launch": round(m["nki"], 4),
        "torch_seconds_per_call": round(m["torch"], 5),
        "ratio_nki_to_torch": round(m["nki"] / m["torch"], 1),
        "instructions_per_launch": launch.total_instructions,  # instructions only, not nl.ndarray allocations
        "allocations_per_launch": sum(launch.allocations.values()),
        "microseconds_per_instruction": round(m["nki"] / launch.total_instructions * 1e6, 1),
        "sbuf_peak_bytes_per_partition": launch.sbuf_peak_bytes,
        "psum_peak_banks": launch.psum_peak_banks,
    }
    for floor_name in floors or {}:
        result[f"{floor_name}_seconds"] = round(m[floor_name], 4)
        result[f"ratio_{floor_name}_to_torch"] = round(m[floor_name] / m["torch"], 1)
    if "floor_tiles" in m:  # what the interpreter adds to the same arithmetic, per instruction or allocation
        operations = result["instructions_per_launch"] + result["allocations_per_launch"]
        result["interpreter_microseconds_per_operation"] = round((m["nki"] - m["floor_tiles"]) / operations * 1e6, 1)
    return result


def main() -> None:
    args = parse(arguments(__doc__))
    rounds = 2 if args.quick else 5
    g = torch.Generator().manual_seed(0)
    n = 512 if args.quick else 1024
    a = torch.randn(n, n, generator=g, dtype=torch.bfloat16).to("neuron")
    b = torch.randn(n, n, generator=g, dtype=torch.bfloat16).to("neuron")
    a_t = a.t().contiguous()
    results = {f"matmul_bf16_{n}": case("matmul", lambda: K.matmul_tiled(a_t, b), lambda: a @ b, rounds,
                                        floors=matmul_floors(a_t, b))}
    seq = 1024 if args.quick else 4096
    q, k, v = (torch.randn(seq, 128, generator=g).to("neuron") for _ in range(3))
    results[f"attention_fwd_causal_{seq}x128"] = case(
        "attention", lambda: K.attention_fwd(q, k, v, True),
        lambda: F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True), rounds)
    results["overhead_2000_small_instructions"] = overhead(rounds)
    results["intra_op_threads"] = {"torch_op": torch.get_num_threads(), "interpreter": 1}
    report(results, args.json)


P, FREE = 128, 512  # matmul_tiled's tiles: 128 contraction rows, 128 x 512 output tiles (one PSUM bank of fp32)


def floor_tiles(lhs_t: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """matmul_tiled's work in plain torch, no interpreter: per output tile, 8 tile loads, float32 GEMMs of
    128 x 128 x 512 added into a float32 accumulator (PSUM), one bfloat16 store."""
    k, m = lhs_t.shape
    n = rhs.shape[1]
    out = torch.empty(m, n, dtype=lhs_t.dtype)
    acc = torch.empty(P, FREE)
    for i in range(m // P):
        for j in range(n // FREE):
            for kk in range(k // P):
                a = lhs_t[kk * P:(kk + 1) * P, i * P:(i + 1) * P].contiguous()
                b = rhs[kk * P:(kk + 1) * P, j * FREE:(j + 1) * FREE].contiguous()
                product = a.float().T @ b.float()
                if kk:
                    acc.add_(product)  # PSUM accumulates each matmul's float32 result
                else:
                    acc.copy_(product)
            out[i * P:(i + 1) * P, j * FREE:(j + 1) * FREE] = acc
    return out


def matmul_floors(a_t: torch.Tensor, b: torch.Tensor) -> dict[str, object]:
    """The matmul's floors: its tile work in plain torch (which must give the interpreter's result bit for bit,
    else it is not the same arithmetic), and its float32 tile GEMMs alone."""
    lhs_t, rhs = a_t.cpu(), b.cpu()
    count = (lhs_t.shape[1] // P) * (rhs.shape[1] // FREE) * (lhs_t.shape[0] // P)
    s, mv = lhs_t[:P, :P].float(), rhs[:P, :FREE].float()

    def gemms() -> None:
        for _ in range(count):
            s.T @ mv

    if not torch.equal(floor_tiles(lhs_t, rhs), K.matmul_tiled(a_t, b).cpu()):
        raise SystemExit("bench_nki: the plain-torch floor and the interpreter disagree: not the same arithmetic")
    return {"floor_tiles": lambda: floor_tiles(lhs_t, rhs), "floor_gemms": gemms}


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
