"""Adaptive pooling over H, W of NHWC arrays (PyTorch's adaptive_{avg,max}_pool2d).

Output (oh, ow) windows: start = floor(i*H/oh), end = ceil((i+1)*H/oh); they may differ in
size and overlap when oh does not divide H. ``output_size`` is an int, or a pair whose None
entries keep the input's size.
"""
from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from . import pool_kernels as K
from .pool_common import adaptive_bounds, adaptive_sizes, adaptive_windows, check_input, \
    window_max, window_sum
from .registry import register

OutputSize = int | None | tuple[int | None, int | None]


def _sizes(x: mx.array, output_size: OutputSize, op: str) -> tuple[int, int]:
    check_input(x, 4, "NHWC (batch, height, width, channels)", op, empty_channels=op.startswith("adaptive_avg"))
    return adaptive_sizes(x.shape[1:3], output_size, op)


def _empty(x: mx.array, oh: int, ow: int) -> mx.array | None:
    """The output when it has no element (no window to reduce), else None."""
    shape = (x.shape[0], oh, ow, x.shape[3])
    return mx.zeros(shape, x.dtype) if 0 in shape else None


def _example() -> mx.array:
    return mx.random.normal((2, 10, 7, 5), key=mx.random.key(11))


def _edges(**kwargs: Any) -> list[tuple[tuple, dict]]:
    """Under 8 elements, and an empty batch (PyTorch takes it)."""
    tiny = mx.array([1.0, -1.0, 3.0, 0.5, 2.0, -4.0]).reshape(1, 2, 3, 1)
    return [((tiny,), kwargs), ((mx.zeros((0, 2, 3, 1)),), kwargs)]


def _single(out: Any) -> mx.array:
    return out[0] if isinstance(out, (list, tuple)) else out


# ---- adaptive average --------------------------------------------------------------------

def _avg_kernel(x: mx.array, output_size: OutputSize) -> mx.array:
    return K.adaptive_avg_forward(x, *_sizes(x, output_size, "adaptive_avg_pool2d"))


def _avg_vjp(primals: list, cotangents: Any, outputs: Any, **params: Any) -> tuple:
    return (K.adaptive_avg_backward(_single(cotangents), primals[0]),)


@register("adaptive_avg_pool2d", batched=4, kernel=_avg_kernel, kernel_vjp=_avg_vjp,
          sources=(K.ADAPTIVE_AVG,),
          example=lambda: ((_example(),), dict(output_size=(3, 4))),
          edge_examples=lambda: _edges(output_size=1))
def adaptive_avg_pool2d(x: mx.array, output_size: OutputSize) -> mx.array:
    """Adaptive average pooling of NHWC x to (oh, ow) (float32 sums); (1, 1) is global."""
    oh, ow = _sizes(x, output_size, "adaptive_avg_pool2d")
    n, h, w, c = x.shape
    if (empty := _empty(x, oh, ow)) is not None:
        return empty
    if h % oh == 0 and w % ow == 0:  # equal, disjoint windows: a plain reshape + mean
        blocks = x.astype(mx.float32).reshape(n, oh, h // oh, ow, w // ow, c)
        return blocks.mean(axis=(2, 4)).astype(x.dtype)
    (hs, he), (ws, we) = adaptive_bounds(h, oh), adaptive_bounds(w, ow)
    divisor = np.outer(he - hs, we - ws).astype(np.float32)[:, :, None]
    total = window_sum(x, adaptive_windows(h, oh), adaptive_windows(w, ow))
    return (total / mx.array(divisor)).astype(x.dtype)


# ---- adaptive max ------------------------------------------------------------------------

def _max_args(x: mx.array, output_size: OutputSize,
              return_indices: bool = False) -> tuple[mx.array, tuple[int, int], bool]:
    return x, _sizes(x, output_size, "adaptive_max_pool2d"), return_indices


def _max_kernel(*args: Any, **kwargs: Any) -> Any:
    x, (oh, ow), return_indices = _max_args(*args, **kwargs)
    out = K.adaptive_max_forward(x, oh, ow, return_indices)
    return tuple(out) if return_indices else out[0]


def _max_vjp(primals: list, cotangents: Any, outputs: Any, **params: Any) -> tuple:
    # Gradient to each window's argmax (recomputed unless the forward returned indices).
    x, (oh, ow), return_indices = _max_args(*primals, **params)
    indices = outputs[1] if return_indices else K.adaptive_max_forward(x, oh, ow, True)[1]
    return (K.adaptive_max_backward(indices, _single(cotangents), x),)


@register("adaptive_max_pool2d", batched=4, kernel=_max_kernel, kernel_vjp=_max_vjp,
          sources=(K.ADAPTIVE_MAX_INDICES,),
          example=lambda: ((_example(),), dict(output_size=(4, None), return_indices=True)),
          edge_examples=lambda: [((_example(),), dict(output_size=(3, 2)))] + _edges(output_size=(1, 2))
          + _edges(output_size=2, return_indices=True))
def adaptive_max_pool2d(x: mx.array, output_size: OutputSize,
                        return_indices: bool = False) -> mx.array | tuple[mx.array, mx.array]:
    """Adaptive max pooling of NHWC x to (oh, ow); indices are int32 h*W+w per plane."""
    oh, ow = _sizes(x, output_size, "adaptive_max_pool2d")
    if (empty := _empty(x, oh, ow)) is not None:
        return (empty, empty.astype(mx.int32)) if return_indices else empty
    return window_max(x, adaptive_windows(x.shape[1], oh), adaptive_windows(x.shape[2], ow),
                      return_indices)
