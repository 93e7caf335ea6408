"""Launchers for the pooling kernels (custom_kernels/pool.kern, pool_adaptive.kern).

All kernels take NHWC arrays (1d ops pass (N, 1, L, C)), one thread per output element for
forward passes and one per input element for backward passes (gathers, no atomics) on a
(C * W, H, N) grid, and their runtime sizes in a small int32 params array, so one compiled
kernel serves every shape.
Only the window size (KH, KW) is a template constant, to unroll the window loops.

Each op's registry ``sources`` lists the kernels its example's forward launches; the backward
kernels live in the same files. tests/test_kernel_compile.py renders and compiles every
launch of every kernel, forward and backward.
"""
from __future__ import annotations

from typing import Sequence

import mlx.core as mx

from ...errors import MlxnetError
from ..core.kernel_source import PortableKernel, launch_nhwc
from .geometry import Axis, float32_parts

_FIXED = "pool.kern"
_ADAPTIVE = "pool_adaptive.kern"

MAX = PortableKernel(_FIXED, "max_pool2d", ["x", "p"], ["out"])
MAX_INDICES = PortableKernel(_FIXED, "max_pool2d_indices", ["x", "p"], ["out", "indices"])
MAX_GRAD = PortableKernel(_FIXED, "max_pool2d_grad", ["indices", "g", "p"], ["dx"])
AVG = PortableKernel(_FIXED, "avg_pool2d", ["x", "p"], ["out"])
AVG_GRAD = PortableKernel(_FIXED, "avg_pool2d_grad", ["g", "p"], ["dx"])
UNPOOL = PortableKernel(_FIXED, "max_unpool2d", ["x", "indices", "p"], ["out"])
UNPOOL_GRAD = PortableKernel(_FIXED, "max_unpool2d_grad", ["indices", "g", "p"], ["dx"])
SPPF = PortableKernel(_FIXED, "sppf_pool", ["x", "p"], ["y5", "y9", "y13"])
ADAPTIVE_AVG = PortableKernel(_ADAPTIVE, "adaptive_avg_pool2d", ["x", "p"], ["out"])
ADAPTIVE_AVG_GRAD = PortableKernel(_ADAPTIVE, "adaptive_avg_pool2d_grad", ["g", "p"], ["dx"])
ADAPTIVE_MAX = PortableKernel(_ADAPTIVE, "adaptive_max_pool2d", ["x", "p"], ["out"])
ADAPTIVE_MAX_INDICES = PortableKernel(_ADAPTIVE, "adaptive_max_pool2d_indices", ["x", "p"],
                                      ["out", "indices"])
ADAPTIVE_MAX_GRAD = PortableKernel(_ADAPTIVE, "adaptive_max_pool2d_grad", ["indices", "g", "p"],
                                   ["dx"])

_INDEX = mx.int32  # PyTorch uses int64; int32 covers planes of up to 2^31 elements


def _launch(kernel: PortableKernel, inputs: Sequence[mx.array], params: Sequence[int],
            template: list, threads: Sequence[int], shapes: Sequence[Sequence[int]],
            dtypes: Sequence[mx.Dtype], init_value: float | None = None) -> list[mx.array]:
    """One thread per element of the NHWC ``threads`` shape (:func:`launch_nhwc`)."""
    outs = launch_nhwc(kernel, inputs, params, template, threads, shapes, dtypes, init_value)
    if outs is None:
        n, h, w, c = threads
        largest = max([n * h * w * c] + [a.size for a in inputs])
        raise MlxnetError(f"pooling kernels take tensors of < 2^31 elements with batch and "
                          f"height <= 65535, got {largest} elements, shape {tuple(threads)}")
    return outs


_NO_OVERRIDE = [0, 0]  # divisor_override's (mantissa, shift) params: a zero mantissa is none


def _fixed_params(shape: Sequence[int], rows: Axis, cols: Axis, count_pad: bool = False,
                  divisor_override: int | None = None) -> list[int]:
    """pool.kern's 15 params. divisor_override is any nonzero int64 but only its float32 value
    counts, so it travels as a 24-bit mantissa and a power-of-two shift (two int32s)."""
    n, h, w, c = shape
    override = _NO_OVERRIDE if divisor_override is None else list(float32_parts(divisor_override))
    return [n, h, w, c, rows.out, cols.out, rows.stride, cols.stride, rows.padding, cols.padding,
            rows.dilation, cols.dilation, int(count_pad)] + override


def _out_shape(shape: Sequence[int], oh: int, ow: int) -> tuple[int, int, int, int]:
    return (shape[0], oh, ow, shape[3])


def max_forward(x: mx.array, rows: Axis, cols: Axis, with_indices: bool) -> list[mx.array]:
    """[out] or [out, indices] of a fixed-window max pool of NHWC x."""
    shape = _out_shape(x.shape, rows.out, cols.out)
    kernel, dtypes = (MAX_INDICES, [x.dtype, _INDEX]) if with_indices else (MAX, [x.dtype])
    return _launch(kernel, [x], _fixed_params(x.shape, rows, cols),
                   [("T", x.dtype), ("KH", rows.kernel), ("KW", cols.kernel)], shape,
                   [shape] * len(dtypes), dtypes)


def max_backward(indices: mx.array, g: mx.array, x: mx.array, rows: Axis, cols: Axis) -> mx.array:
    (dx,) = _launch(MAX_GRAD, [indices, g.astype(x.dtype)], _fixed_params(x.shape, rows, cols),
                    [("T", x.dtype), ("KH", rows.kernel), ("KW", cols.kernel)], x.shape,
                    [x.shape], [x.dtype])
    return dx


def avg_forward(x: mx.array, rows: Axis, cols: Axis, count_include_pad: bool,
                divisor_override: int | None = None) -> mx.array:
    shape = _out_shape(x.shape, rows.out, cols.out)
    params = _fixed_params(x.shape, rows, cols, count_include_pad, divisor_override)
    (out,) = _launch(AVG, [x], params,
                     [("T", x.dtype), ("KH", rows.kernel), ("KW", cols.kernel)], shape,
                     [shape], [x.dtype])
    return out


def avg_backward(g: mx.array, x: mx.array, rows: Axis, cols: Axis, count_include_pad: bool,
                 divisor_override: int | None = None) -> mx.array:
    params = _fixed_params(x.shape, rows, cols, count_include_pad, divisor_override)
    (dx,) = _launch(AVG_GRAD, [g.astype(x.dtype)], params,
                    [("T", x.dtype), ("KH", rows.kernel), ("KW", cols.kernel)], x.shape,
                    [x.shape], [x.dtype])
    return dx


def _unpool_params(x: mx.array, oh: int, ow: int) -> list[int]:
    n, h, w, c = x.shape
    return [n, h, w, c, oh, ow] + [1] * 6 + [0] + _NO_OVERRIDE


def unpool_forward(x: mx.array, indices: mx.array, oh: int, ow: int) -> mx.array:
    (out,) = _launch(UNPOOL, [x, indices.astype(_INDEX)], _unpool_params(x, oh, ow),
                     [("T", x.dtype)], x.shape, [_out_shape(x.shape, oh, ow)], [x.dtype],
                     init_value=0.0)
    return out


def unpool_backward(indices: mx.array, g: mx.array, x: mx.array) -> mx.array:
    oh, ow = g.shape[1:3]
    (dx,) = _launch(UNPOOL_GRAD, [indices.astype(_INDEX), g.astype(x.dtype)],
                    _unpool_params(x, oh, ow), [("T", x.dtype)], x.shape, [x.shape], [x.dtype])
    return dx


_SPPF_STRIP = 4  # output rows per thread: 13 * (4 + 12) / 4 = 52 loads per output, not 169


def sppf_forward(x: mx.array) -> list[mx.array]:
    """The 5x5, 9x9 and 13x13 stride-1 'same' max pools of NHWC x in one pass."""
    n, h, w, c = x.shape
    strips = (n, -(-h // _SPPF_STRIP), w, c)
    return _launch(SPPF, [x], list(x.shape) + [0] * 11, [("T", x.dtype), ("TH", _SPPF_STRIP)],
                   strips, [x.shape] * 3, [x.dtype] * 3)


def _adaptive_params(x_shape: Sequence[int], oh: int, ow: int) -> list[int]:
    return list(x_shape) + [oh, ow]


def adaptive_avg_forward(x: mx.array, oh: int, ow: int) -> mx.array:
    shape = _out_shape(x.shape, oh, ow)
    (out,) = _launch(ADAPTIVE_AVG, [x], _adaptive_params(x.shape, oh, ow), [("T", x.dtype)],
                     shape, [shape], [x.dtype])
    return out


def adaptive_avg_backward(g: mx.array, x: mx.array) -> mx.array:
    (dx,) = _launch(ADAPTIVE_AVG_GRAD, [g.astype(x.dtype)], _adaptive_params(x.shape, *g.shape[1:3]),
                    [("T", x.dtype)], x.shape, [x.shape], [x.dtype])
    return dx


def adaptive_max_forward(x: mx.array, oh: int, ow: int, with_indices: bool) -> list[mx.array]:
    kernel, dtypes = ((ADAPTIVE_MAX_INDICES, [x.dtype, _INDEX]) if with_indices
                      else (ADAPTIVE_MAX, [x.dtype]))
    shape = _out_shape(x.shape, oh, ow)
    return _launch(kernel, [x], _adaptive_params(x.shape, oh, ow), [("T", x.dtype)], shape,
                   [shape] * len(dtypes), dtypes)


def adaptive_max_backward(indices: mx.array, g: mx.array, x: mx.array) -> mx.array:
    (dx,) = _launch(ADAPTIVE_MAX_GRAD, [indices, g.astype(x.dtype)],
                    _adaptive_params(x.shape, *g.shape[1:3]), [("T", x.dtype)], x.shape,
                    [x.shape], [x.dtype])
    return dx
