"""``nki.typing``: annotations kernels may import (``from nki.typing import tensor``); they check nothing here."""

from __future__ import annotations

from typing import Any


class _TensorAnnotation:
    """``tensor`` or ``tensor[shape, dtype]`` in a kernel's signature: documentation only."""

    def __getitem__(self, item: Any) -> _TensorAnnotation:
        return self

    def __repr__(self) -> str:
        return "nki.typing.tensor"


tensor = _TensorAnnotation()
scalar = Any
