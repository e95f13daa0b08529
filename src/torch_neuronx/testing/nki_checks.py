"""Helpers the NKI tests share: a kernel checked against one target, and the rule a kernel must break."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import torch_neuronx.nki as nki
from torch_neuronx.nki import NkiValidationError


def on(target: str) -> Callable[[Callable[..., object]], nki.Kernel]:
    """A decorator: the kernel checked against `target` ("trn1", "trn2", "trn3")."""
    return lambda fn: nki.jit(fn, platform_target=target)


def expect(code: str, kernel: nki.Kernel, *args: object, operand: str | None = None) -> NkiValidationError:
    """Run `kernel` and require the rule `code` to refuse it, naming its instruction (and `operand`, if given)."""
    with pytest.raises(NkiValidationError) as info:
        kernel(*args)
    err = info.value
    assert err.code == code, str(err)
    assert err.instruction and err.instruction in str(err)
    if operand is not None:
        assert err.operand == operand, str(err)
    return err
