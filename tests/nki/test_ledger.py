"""The on-chip capacity ledger: live SBUF bytes per partition and PSUM banks, high-water marks against the target's
budget (trn1 192 KiB, trn2 224 KiB per partition; 8 banks of 2 KiB), a warning by default, an error when strict."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import torch_neuronx.nki as nki
from torch_neuronx.nki import NkiCapacityWarning, NkiValidationError

nl = nki.language
nisa = nki.isa
X = np.zeros((128, 4), dtype=np.float32)
KIB = 1024


def hold_sbuf(kib_per_tile: int, tiles: int, **options: object) -> nki.Kernel:
    @nki.jit(**options)
    def hold(a):  # type: ignore[no-untyped-def]
        live = []
        for _ in nl.static_range(tiles):  # unrolled: each iteration's tile is its own allocation
            t = nl.ndarray((128, kib_per_tile * KIB // 4), dtype=nl.float32, buffer=nl.sbuf)
            live.append(t)  # all stay live: the kernel needs them at once
        del live
        t = nl.ndarray((128, 8), dtype=nl.bfloat16, buffer=nl.sbuf)  # 16 bytes, after the others are freed

    return hold


def test_peak_is_exact_and_freed_tiles_are_returned() -> None:
    hold_sbuf(32, 3, platform_target="trn2")(X)
    report = nki.last_report()
    assert report.sbuf_peak_bytes == 3 * 32 * KIB
    assert report.sbuf_budget_bytes == 224 * KIB and report.target == "trn2" and not report.over_budget


@pytest.mark.parametrize("loop_name", ["affine_range", "sequential_range", "dynamic_range"])
def test_a_tile_allocated_in_a_loop_body_is_live_for_its_iteration(loop_name: str) -> None:
    """Issue 31 item 5: one 100 KiB tile per iteration on trn1 is 100 KiB live (the compiler allocates a body tile
    per iteration), not 200 KiB because the previous iteration's loop variable still references its tile."""
    loop = getattr(nl, loop_name)

    @nki.jit(platform_target="trn1", capacity="strict")
    def per_iteration(a):  # type: ignore[no-untyped-def]
        for _ in loop(4):
            t = nl.ndarray((128, 100 * KIB // 4), dtype=nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=t, value=0.0)

    per_iteration(X)
    assert nki.last_report().sbuf_peak_bytes == 100 * KIB


def test_a_loop_body_may_use_all_eight_psum_banks() -> None:
    @nki.jit(capacity="strict")
    def eight_per_iteration(a):  # type: ignore[no-untyped-def]
        for _ in nl.affine_range(3):
            banks = [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(8)]
            for b in banks:
                nisa.memset(dst=b, value=0.0)

    eight_per_iteration(X)
    assert nki.last_report().psum_peak_banks == 8


def test_loop_scopes_do_not_depend_on_python_references() -> None:
    """The release happens at the end of the iteration even while Python still holds the tile (a list outside)."""
    @nki.jit
    def kept(a):  # type: ignore[no-untyped-def]
        keep = []
        for _ in nl.affine_range(3):
            t = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.sbuf)  # 4 KiB
            keep.append(t)
        after = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        del keep, after

    kept(X)
    assert nki.last_report().sbuf_peak_bytes == 4 * KIB


def test_unrolled_loops_release_a_tile_when_the_kernel_drops_it() -> None:
    @nki.jit
    def loop(a):  # type: ignore[no-untyped-def]
        for _ in nl.static_range(50):
            t = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.sbuf)  # 4 KiB per partition
            nisa.memset(dst=t, value=0.0)

    loop(X)
    assert nki.last_report().sbuf_peak_bytes == 2 * 4 * KIB  # the new tile exists before the old one is dropped


def test_over_budget_warns_by_default_with_the_figures() -> None:
    with pytest.warns(NkiCapacityWarning, match=r"err-sbuf-capacity-exceeded.*229376") as record:
        hold_sbuf(64, 4, platform_target="trn2")(X)  # 256 KiB > 224 KiB
    assert len(record) == 1  # once per launch
    report = nki.last_report()
    assert report.sbuf_peak_bytes == 256 * KIB and report.over_budget
    assert report.warnings == ["err-sbuf-capacity-exceeded"]


def test_the_over_budget_message_names_the_allocation_that_went_over() -> None:
    # the ledger builds this text only when an allocation goes over (issue 31, speed): it must still name the
    # allocation, its shape and dtype, for SBUF and for PSUM
    with pytest.warns(NkiCapacityWarning, match=r"after allocating sbuf_\d+ \(128, 16384\) float32, over the trn2"):
        hold_sbuf(64, 4, platform_target="trn2")(X)

    @nki.jit(capacity="strict")
    def nine_banks(a):  # type: ignore[no-untyped-def]
        return [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum, name=f"acc{i}") for i in range(9)]

    with pytest.raises(NkiValidationError, match=r"9 PSUM banks are live after allocating acc8 \(128, 512\) float32"):
        nine_banks(X)


def test_the_budget_follows_the_target() -> None:
    kernel = hold_sbuf(50, 4)  # 200 KiB per partition: fits trn2's 224, not trn1's 192
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nki.jit(kernel, platform_target="trn2")(X)
    with pytest.warns(NkiCapacityWarning):
        nki.jit(kernel, platform_target="trn1")(X)


def test_strict_mode_raises_at_the_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(NkiValidationError, match="err-sbuf-capacity-exceeded") as info:
        hold_sbuf(64, 4, capacity="strict", platform_target="trn2")(X)
    assert info.value.limit == 224 * KIB and info.value.value == 256 * KIB
    monkeypatch.setenv("TORCH_NEURONX_NKI_CAPACITY", "strict")
    with pytest.raises(NkiValidationError):
        hold_sbuf(64, 4, platform_target="trn2")(X)
    monkeypatch.setenv("TORCH_NEURONX_NKI_CAPACITY", "off")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hold_sbuf(64, 4, platform_target="trn2")(X)


def test_psum_has_eight_banks() -> None:
    @nki.jit(capacity="strict")
    def nine_banks(a):  # type: ignore[no-untyped-def]
        banks = [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(8)]
        small = nl.ndarray((128, 16), dtype=nl.float32, buffer=nl.psum)  # a partial bank still takes a bank
        return banks, small

    with pytest.raises(NkiValidationError, match="err-psum-capacity-exceeded") as info:
        nine_banks(X)
    assert info.value.value == 9 and info.value.limit == 8

    @nki.jit
    def eight(a):  # type: ignore[no-untyped-def]
        banks = [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(8)]
        del banks

    eight(X)
    assert nki.last_report().psum_peak_banks == 8 and not nki.last_report().over_budget
