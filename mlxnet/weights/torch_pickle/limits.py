"""The bounds a file is held to: what it declares (sizes, strides, offsets, counts, dimensions)
may not make the reader allocate more than the bytes in the file justify, and nothing it holds
is quoted at length in an error message.

The numbers are here; each check sits where the size is read (the zip members, the legacy
storages, the tensor views, the pickle's length-prefixed opcodes).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .errors import Corrupt
from .records import Allowed, Record, RecordType

MAX_NDIM = 64  # numpy's own limit; torch tensors have far fewer
MAX_INDEX = 2**63 - 1  # sizes, strides and offsets are int64 in torch
VIEW_BUDGET = 4  # distinct views of one storage may take this many times its bytes
MAX_INFLATION = 16  # deflated zip members may inflate to this many times the archive...
INFLATION_SLACK = 16 << 20  # ... plus this, so that small re-zipped files with zero buffers load
MAX_RECORD_TYPES = 4096  # distinct foreign classes one pickle may name (each costs a type object)
CHUNK = 1 << 20  # zip members are read this many bytes at a time
MLX_MAX_DIM = 2**31 - 1  # MLX keeps each dimension as an int32: a larger one would wrap around


def brief(x: Any, limit: int = 60) -> str:
    """A short description of a value from the file for an error message: never a repr of a
    whole (possibly huge) object, and never str() of a huge int (which itself raises)."""
    if isinstance(x, (str, bytes, bytearray)):
        text = repr(x[:limit])
        return text + ("..." if len(x) > limit else "")
    if isinstance(x, int) and not isinstance(x, bool) and x.bit_length() > 64:
        return f"<an int of {x.bit_length()} bits>"
    if x is None or isinstance(x, (bool, int, float, np.dtype, Allowed, Record, RecordType)) or (
            isinstance(x, np.generic) and x.nbytes <= 64):
        text = repr(x)
        return text if len(text) <= limit else text[:limit] + "..."
    if isinstance(x, (tuple, list)) and len(x) <= 8:
        inner = ", ".join(brief(v, 20) for v in x)
        return f"({inner})" if isinstance(x, tuple) else f"[{inner}]"
    size = f" of {len(x)} items" if isinstance(x, (tuple, list, dict, set, frozenset)) else ""
    return f"a {type(x).__name__}{size}"


def index(x: Any, what: str) -> int:
    """A non-negative int64 (a size, stride, offset or count declared by the file)."""
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise Corrupt(f"{what} is {brief(x)}, not an integer")
    x = int(x)
    if not 0 <= x <= MAX_INDEX:
        raise Corrupt(f"{what} is {brief(x)}; expected 0 to 2**63-1")
    return x


def dims(seq: Any, what: str) -> tuple[int, ...]:
    """A shape or stride declared by the file: at most MAX_NDIM non-negative int64s."""
    if not isinstance(seq, (tuple, list)):
        raise Corrupt(f"{what} is {brief(seq)}, not a tuple of ints")
    if len(seq) > MAX_NDIM:
        raise Corrupt(f"{what} has {len(seq)} dimensions; at most {MAX_NDIM} are supported")
    return tuple(index(n, what) for n in seq)


def mlx_shape_problem(shape: tuple[int, ...]) -> str | None:
    """Why MLX cannot hold an array of ``shape`` (None if it can): each dimension is compared as
    a Python int with MLX's int32 limit, before MLX sees it (a dimension of 3000000000 on a
    zero-element tensor would come back as -1294967296)."""
    for n in shape:
        if n > MLX_MAX_DIM:
            return f"dimension {n} of shape {tuple(shape)} is over MLX's limit of 2**31-1"
    return None
