"""YOLOv8's SPPF pooling: MaxPool2d(5, stride 1, padding 2) applied three times in a row.

Chained 5x5 'same' max pools equal single 9x9 and 13x13 ones (a max over a max of windows is
the max over their union, clipped to the image), so the kernel computes all three outputs
from one read of each 13x13 neighbourhood. The reference chains the three pools, so its
autodiff routes gradients exactly as the sequential module does; the kernel's backward
mirrors that chain with the max-pool gradient kernel.
"""
from __future__ import annotations

from typing import Any

import mlx.core as mx

from . import pool_kernels as K
from .pool_common import check_input, fixed_axis, fixed_windows, window_max
from .registry import register


def _axes(x: mx.array) -> tuple:
    check_input(x, 4, "NHWC (batch, height, width, channels)", "sppf_pool")
    return tuple(fixed_axis(size, 5, 1, 2, 1, False, "sppf_pool")
                 for size in x.shape[1:3])


def _kernel(x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    _axes(x)
    return tuple(K.sppf_forward(x))  # type: ignore[return-value]


def _vjp(primals: list, cotangents: Any, outputs: Any) -> tuple:
    # Back through pool 3, then pool 2, then pool 1, adding each output's own gradient.
    x = primals[0]
    rows, cols = _axes(x)
    inputs = (x, outputs[0], outputs[1])
    grad = cotangents[2]
    for stage in (2, 1, 0):
        indices = K.max_forward(inputs[stage], rows, cols, True)[1]
        grad = K.max_backward(indices, grad, x, rows, cols)
        if stage:
            grad = grad + cotangents[stage - 1].astype(x.dtype)
    return (grad,)


@register("sppf_pool", batched=4, kernel=_kernel, kernel_vjp=_vjp, sources=(K.SPPF,),
          example=lambda: ((mx.random.normal((2, 8, 9, 6), key=mx.random.key(12)),), {}),
          edge_examples=lambda: [((mx.array([[[[1.0], [2.0]]]]),), {}),
                                 ((mx.zeros((0, 2, 2, 1)),), {})])
def sppf_pool(x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """(y1, y2, y3): NHWC x max-pooled by 5x5 (stride 1, padding 2) once, twice, three times."""
    rows, cols = _axes(x)
    tables = fixed_windows(rows), fixed_windows(cols)
    y1 = window_max(x, *tables, False)
    y2 = window_max(y1, *tables, False)
    return y1, y2, window_max(y2, *tables, False)
