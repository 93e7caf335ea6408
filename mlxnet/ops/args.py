"""Argument helpers shared by the ops and layers."""
from __future__ import annotations

import operator
from typing import Sequence

from ..errors import MlxnetError

IntOrTuple = int | Sequence[int]


def as_tuple(value: IntOrTuple, n: int, what: str = "argument", op: str = "op") -> tuple[int, ...]:
    """An int repeated ``n`` times, or a sequence of exactly ``n`` ints, or of one int repeated
    (PyTorch's convention for kernel sizes, strides, paddings and dilations)."""
    try:
        if isinstance(value, (str, bytes)) or isinstance(value, bool):
            raise TypeError
        values = (operator.index(value),) * n if not isinstance(value, Sequence) else \
            tuple(operator.index(v) for v in value)
        if len(values) == 1 and not any(isinstance(v, bool) for v in (value if isinstance(value, Sequence) else ())):
            values *= n
    except TypeError:
        values = ()
    if len(values) != n:
        kind = "an int" if n == 1 else "an int or a pair of ints" if n == 2 else f"an int or {n} ints"
        raise MlxnetError(f"{op}: {what} must be {kind}, got {value!r}")
    return values
