"""Bytes per element of each kind of tensor under the three precision policies.

fp32: everything in fp32. bf16-mixed: fp32 master weights, gradients and
optimizer state; FSDP2 gathers bf16 weights and computes in bf16, reducing
gradients in fp32 (Transformers' ``fsdp_mixed_precision``). bf16: weights,
gradients, optimizer state and activations all bf16.
"""

from __future__ import annotations

from typing import NamedTuple


class Precision(NamedTuple):
    name: str
    param: int  # stored weights, gradients and AdamW state
    compute: int  # gathered weights and activations
    reduce: int  # gradient reduce-scatter / all-reduce

    @property
    def bf16_compute(self) -> bool:
        return self.compute == 2


PRECISIONS = {
    "fp32": Precision("fp32", 4, 4, 4),
    "bf16-mixed": Precision("bf16-mixed", 4, 2, 4),
    "bf16": Precision("bf16", 2, 2, 2),
}


def precision(name: str) -> Precision:
    if name not in PRECISIONS:
        raise ValueError(f"precision {name!r} is not one of {', '.join(PRECISIONS)}")
    return PRECISIONS[name]
