"""The interpreter's error: a broken Trainium rule, reported as the NKI compiler would, at the kernel's line.

Every instruction checks its operands before it computes. A violation raises
:class:`NkiValidationError` (AWS's name for the class ``nki.isa`` raises on a
hardware-constraint violation), which names the instruction, the operand, the
value found, the limit and the line of the kernel that issued it, with a
catalogue-style code (``err-...``) and what to do about it.
"""

from __future__ import annotations

import linecache
import os
import sys
from typing import Any

import torch

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_SHIM = os.path.join(os.path.dirname(os.path.dirname(_PACKAGE_DIR)), "nki.py")
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


def _internal(filename: str) -> bool:
    path = os.path.abspath(filename)
    return path.startswith((_PACKAGE_DIR + os.sep, _TORCH_DIR + os.sep)) or path == _SHIM


def kernel_location() -> tuple[str, int, str]:
    """(file, line, source text) of the innermost frame outside the interpreter: the kernel line."""
    frame = sys._getframe(1)
    while frame is not None and _internal(frame.f_code.co_filename):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "<unknown>", 0, ""
    filename, lineno = frame.f_code.co_filename, frame.f_lineno
    return filename, lineno, linecache.getline(filename, lineno).strip()


# who is running: the launch context (in _tensor, above this module) installs its lookup here when it loads
KERNEL_NAME: list[Any] = [lambda: None]


class NkiValidationError(ValueError):
    """An NKI kernel broke a Trainium rule (shape, buffer, dtype, bounds or capacity).

    Attributes: ``code`` (``err-...``), ``instruction`` (``nisa.nc_matmul``), ``operand`` (``moving``),
    ``value`` (what was found), ``limit`` (what the hardware allows), ``kernel`` (the kernel's name),
    ``filename``/``lineno``/``source`` (the kernel line that issued the instruction) and ``hint``.
    """

    def __init__(self, code: str, instruction: str, message: str, *, operand: str | None = None,
                 value: Any = None, limit: Any = None, hint: str | None = None) -> None:
        self.code, self.instruction, self.operand = code, instruction, operand
        self.value, self.limit, self.hint = value, limit, hint
        self.kernel = KERNEL_NAME[0]()
        self.filename, self.lineno, self.source = kernel_location()
        where = f"operand '{operand}' " if operand else ""
        text = f"[{code}] {instruction}: {where}{message}"
        if limit is not None:
            text += f" (limit: {limit})"
        text += f"\n  in kernel {self.kernel or '<none>'}, {self.filename}:{self.lineno}"
        if self.source:
            text += f"\n    {self.source}"
        if hint:
            text += f"\n  fix: {hint}"
        super().__init__(text)


class NkiRangeWarning(UserWarning):
    """A Scalar Engine activation got inputs outside the valid input range AWS documents for it, where the
    instance returns invalid results and the interpreter returns the exact function."""


class NkiCapacityWarning(UserWarning):
    """A launch's live SBUF bytes or PSUM banks went over the target's budget (an error in strict mode)."""
