"""The floating dtypes mlxnet computes in, by name: the one table every module uses."""
from __future__ import annotations

from typing import Union

import mlx.core as mx

from .errors import MlxnetError

FLOAT_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
DTypeLike = Union[mx.Dtype, str, None]


def as_dtype(dtype: DTypeLike) -> mx.Dtype | None:
    """None, an mx floating dtype, or its name ("float32", "float16", "bfloat16")."""
    if dtype is None or isinstance(dtype, mx.Dtype):
        return dtype
    if dtype not in FLOAT_DTYPES:
        raise MlxnetError(f"unsupported dtype {dtype!r}: expected one of {', '.join(FLOAT_DTYPES)}")
    return FLOAT_DTYPES[dtype]
