"""Argument helpers shared by the ops and layers: PyTorch's spellings of integer arguments."""
from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from ...errors import MlxnetError

IntOrTuple = int | Sequence[int]

# PyTorch converts pooling sizes to C ints and refuses what overflows one; MLX sizes are int32
_INT32 = 2**31


def shape_of(value: Any) -> Any:
    """What an array argument was, for an error message: its shape, else its type's name."""
    return tuple(value.shape) if isinstance(value, mx.array) else type(value).__name__


def as_array(x: Any, what: str, op: str) -> mx.array:
    """``x`` itself, refused unless it is an mlx array."""
    if not isinstance(x, mx.array):
        raise MlxnetError(f"{op}: {what} must be an mlx array, got {type(x).__name__}")
    return x


def one_line(value: Any, limit: int | None = None) -> str:
    """A one-line repr for error messages (arrays and tensors print on several lines), cut
    short past ``limit`` characters."""
    text = " ".join(repr(value).split())
    return text if limit is None or len(text) <= limit else text[:limit - 3] + "..."


def ints(value: Any, lengths: tuple[int, ...], what: str, op: str, kind: str) -> tuple[int, ...]:
    """``value`` as a tuple of ints: an int is a 1-tuple, a list or tuple must have one of
    ``lengths``. Like PyTorch's argument parser: integer scalars of any library (numpy, 0-d
    arrays) count, bools, floats, strings and multi-element arrays do not, nor values a C int
    cannot hold."""
    def one(v: Any) -> int:
        if isinstance(v, (bool, np.bool_)):
            raise TypeError
        return operator.index(v)

    try:
        if isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray)):
            values = tuple(one(v) for v in value)
            if len(values) not in lengths:
                raise TypeError
        else:
            values = (one(value),)
    except TypeError:
        raise MlxnetError(f"{op}: {what} must be {kind}, got {one_line(value)}") from None
    if any(not -_INT32 <= v < _INT32 for v in values):
        raise MlxnetError(f"{op}: {what} must fit in a 32-bit int, got {one_line(value)}")
    return values


def as_tuple(value: IntOrTuple, n: int, what: str = "argument", op: str = "op",
             default: tuple[int, ...] | None = None, one: bool = True) -> tuple[int, ...]:
    """PyTorch's convention for kernel sizes, strides, paddings and dilations: an int repeated
    ``n`` times, a sequence of exactly ``n`` ints, or (``one``) a 1-tuple repeated; with a
    ``default``, ``()`` / ``[]`` stand for it (pooling's stride)."""
    # The spellings nearly every call uses, without the general parser (ops run it per call)
    if type(value) is int and -_INT32 <= value < _INT32:
        return (value,) * n
    if type(value) is tuple and len(value) == n and all(type(v) is int and -_INT32 <= v < _INT32 for v in value):
        return value
    lengths = (0,) * (default is not None) + (1,) * (one or n == 1) + (n,)
    forms = ["an int", "a 1-tuple"] if one or n == 1 else ["an int"]
    forms += [] if n == 1 else ["a pair of ints" if n == 2 else f"{n} ints"]
    forms += ["() for the default"] if default is not None else []
    kind = ", ".join(forms[:-1]) + " or " + forms[-1]
    values = ints(value, lengths, what, op, kind)
    if not values:
        return default  # type: ignore[return-value]
    return values * n if len(values) == 1 else values


def as_int(value: Any, what: str, op: str, bits: int = 64) -> int:
    """One int (not a bool, float or sequence) that fits a signed ``bits``-bit int."""
    if isinstance(value, (bool, np.bool_, Sequence)):
        raise MlxnetError(f"{op}: {what} must be an int, got {one_line(value)}")
    try:
        v = operator.index(value)
    except TypeError:
        raise MlxnetError(f"{op}: {what} must be an int, got {one_line(value)}") from None
    if not -(2 ** (bits - 1)) <= v < 2 ** (bits - 1):
        raise MlxnetError(f"{op}: {what} must fit in a {bits}-bit int, got {v}")
    return v


def as_flag(value: Any, what: str, op: str) -> bool:
    """A Python bool, as PyTorch's ``ceil_mode`` and ``count_include_pad`` (it refuses 0/1,
    None and numpy bools there)."""
    if not isinstance(value, bool):
        raise MlxnetError(f"{op}: {what} must be True or False, got {one_line(value)}")
    return value
