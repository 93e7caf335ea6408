"""The floating dtypes mlxnet computes in, by name: the one table every module uses."""
from __future__ import annotations

import warnings
from typing import Union

import mlx.core as mx

from .errors import MlxnetError

FLOAT_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
FLOATS = tuple(FLOAT_DTYPES.values())  # the dtypes themselves: what a kernel's T may be
DTypeLike = Union[mx.Dtype, str, None]


def as_dtype(dtype: DTypeLike) -> mx.Dtype | None:
    """None, an mx floating dtype, or its name ("float32", "float16", "bfloat16")."""
    if dtype is None or isinstance(dtype, mx.Dtype):
        return dtype
    if dtype not in FLOAT_DTYPES:
        raise MlxnetError(f"unsupported dtype {dtype!r}: expected one of {', '.join(FLOAT_DTYPES)}")
    return FLOAT_DTYPES[dtype]


class HalfPrecisionOnCPU(RuntimeWarning):
    """Half precision was asked for on the CPU, which computes it in float32 instead."""


def has_fast_half() -> bool:
    """Whether the current device runs float16/bfloat16 at least as fast as float32: MLX's GPU
    back ends do; its CPU back end has no half-precision kernels (each op converts element by
    element, about 25 times slower than float32)."""
    return mx.default_device().type == mx.DeviceType.gpu


def computes_in(name: str) -> str:
    """The name of the dtype a request for ``name`` computes in on the current device."""
    return "float32" if name in ("float16", "bfloat16") and not has_fast_half() else name


def compute_dtype(dtype: DTypeLike) -> mx.Dtype | None:
    """The dtype a model loaded for inference computes in: the one asked for, except that half
    precision on a device without fast half-precision kernels computes in float32 (same results
    within float16's rounding, many times faster), saying so once in a HalfPrecisionOnCPU
    warning."""
    target = as_dtype(dtype)
    name = next((n for n, d in FLOAT_DTYPES.items() if d == target), None) if target is not None else None
    if name is not None and computes_in(name) != name:
        warnings.warn(f"{name} on the CPU computes in float32: MLX's CPU back end has no fast "
                      f"{name} kernels (about 25x slower); run on a GPU for half precision",
                      HalfPrecisionOnCPU, stacklevel=3)
        return mx.float32
    return target
