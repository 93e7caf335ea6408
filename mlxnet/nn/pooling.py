"""Pooling layers with PyTorch's constructor arguments, on NHWC (2d) / NLC (1d) inputs.

Each layer holds its static arguments (no parameters) and calls the registered op, so it runs
the custom kernel on a GPU and the MLX-composed reference elsewhere.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable, Sequence

import mlx.core as mx
import mlx.nn as nn

from .. import ops

IntOrPair = int | tuple[int, int]


class _Pool(nn.Module):
    """A parameter-free layer: one op call with fixed keyword arguments."""

    def __init__(self, op: Callable[..., Any], **params: Any) -> None:
        super().__init__()
        # A partial, not tuples/dicts: mlx.nn.Module would treat those as parameter trees.
        self._call = partial(op, **params)
        self._repr = ", ".join(f"{k}={v!r}" for k, v in params.items())

    def _extra_repr(self) -> str:
        return self._repr

    def __call__(self, x: mx.array) -> Any:
        return self._call(x)


class MaxPool1d(_Pool):
    def __init__(self, kernel_size: int, stride: int | None = None, padding: int = 0,
                 dilation: int = 1, return_indices: bool = False, ceil_mode: bool = False) -> None:
        super().__init__(ops.max_pool1d, kernel_size=kernel_size, stride=stride, padding=padding,
                         dilation=dilation, ceil_mode=ceil_mode, return_indices=return_indices)


class MaxPool2d(_Pool):
    def __init__(self, kernel_size: IntOrPair, stride: IntOrPair | None = None,
                 padding: IntOrPair = 0, dilation: IntOrPair = 1, return_indices: bool = False,
                 ceil_mode: bool = False) -> None:
        super().__init__(ops.max_pool2d, kernel_size=kernel_size, stride=stride, padding=padding,
                         dilation=dilation, ceil_mode=ceil_mode, return_indices=return_indices)


class AvgPool1d(_Pool):
    def __init__(self, kernel_size: int, stride: int | None = None, padding: int = 0,
                 ceil_mode: bool = False, count_include_pad: bool = True) -> None:
        super().__init__(ops.avg_pool1d, kernel_size=kernel_size, stride=stride, padding=padding,
                         ceil_mode=ceil_mode, count_include_pad=count_include_pad)


class AvgPool2d(_Pool):
    def __init__(self, kernel_size: IntOrPair, stride: IntOrPair | None = None,
                 padding: IntOrPair = 0, ceil_mode: bool = False,
                 count_include_pad: bool = True, divisor_override: int | None = None) -> None:
        super().__init__(ops.avg_pool2d, kernel_size=kernel_size, stride=stride, padding=padding,
                         ceil_mode=ceil_mode, count_include_pad=count_include_pad,
                         divisor_override=divisor_override)


class AdaptiveAvgPool2d(_Pool):
    def __init__(self, output_size: int | None | tuple[int | None, int | None]) -> None:
        super().__init__(ops.adaptive_avg_pool2d, output_size=output_size)


class AdaptiveMaxPool2d(_Pool):
    def __init__(self, output_size: int | None | tuple[int | None, int | None],
                 return_indices: bool = False) -> None:
        super().__init__(ops.adaptive_max_pool2d, output_size=output_size,
                         return_indices=return_indices)


class MaxUnpool2d(nn.Module):
    """Inverse of MaxPool2d(return_indices=True): ``layer(x, indices, output_size=None)``."""

    def __init__(self, kernel_size: IntOrPair, stride: IntOrPair | None = None,
                 padding: IntOrPair = 0) -> None:
        super().__init__()
        self._call = partial(ops.max_unpool2d, kernel_size=kernel_size, stride=stride,
                             padding=padding)
        self._repr = f"kernel_size={kernel_size!r}, stride={stride!r}, padding={padding!r}"

    def _extra_repr(self) -> str:
        return self._repr

    def __call__(self, x: mx.array, indices: mx.array,
                 output_size: Sequence[int] | None = None) -> mx.array:
        return self._call(x, indices, output_size=output_size)


__all__ = ["AdaptiveAvgPool2d", "AdaptiveMaxPool2d", "AvgPool1d", "AvgPool2d", "MaxPool1d",
           "MaxPool2d", "MaxUnpool2d"]
