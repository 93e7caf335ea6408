"""Argument helpers shared by the ops and layers."""
from __future__ import annotations

import operator
from typing import Sequence

from ..errors import MlxnetError

IntOrTuple = int | Sequence[int]


def as_tuple(value: IntOrTuple, n: int, what: str = "argument", op: str = "op") -> tuple[int, ...]:
    """An int repeated ``n`` times, or a sequence of exactly ``n`` ints (PyTorch's convention
    for kernel sizes, strides, paddings and dilations)."""
    try:
        values = (operator.index(value),) * n if not isinstance(value, Sequence) else \
            tuple(operator.index(v) for v in value)
    except TypeError:
        values = ()
    if len(values) != n:
        kind = "an int" if n == 1 else "an int or a pair of ints" if n == 2 else f"an int or {n} ints"
        raise MlxnetError(f"{op}: {what} must be {kind}, got {value!r}")
    return values
