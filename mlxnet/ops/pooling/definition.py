"""The pooling definitions: MLX compositions of the window reductions below.

Every pooling definition (fixed or adaptive windows, 1d or 2d) reduces the same way: each
spatial axis has a table ``(out, k)`` of input positions and a validity mask (padding,
ceil-mode overhang and ragged adaptive windows are just invalid slots; :mod:`.geometry`).
Windows are reduced separably, rows then columns, one window slot at a time over strided slices
of the padded input (fixed windows) or gathers (adaptive ones): vectorised over pixels,
differentiable, and fast on the CPU. Max pooling picks the input PyTorch picks (the first
maximum in (kh, kw) scan order, or the last NaN where the window has one), so the gradient goes
to exactly one input (MLX's own ``max`` splits it between ties). The SPPF definition chains
its three 5x5 pools, so its autodiff routes gradients exactly as the sequential module does.
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

import mlx.core as mx
import numpy as np

from .geometry import (IntOrPair, OutputSize, Windows, _avg_geometry, _from_2d, _max_geometry,
                       _sizes, _sppf_axes, _to_2d, _unpool_size, adaptive_bounds, adaptive_windows,
                       avg_divisor, fixed_windows, float32_value)


def _taps(x: mx.array, w: Windows, axis: int, fill: float) -> list[mx.array]:
    """One array per window slot k: x along ``axis`` at each output's k-th position, with
    ``fill`` where that slot is not a real input.

    Fixed windows are strided slices of the padded input; ragged adaptive windows gather
    clipped positions and mask. (Reducing over an ``mx.as_strided`` window view would be
    shorter, but MLX 0.32's CPU reductions over such views give wrong results for batch > 1.)
    """
    a = w.fixed
    if a is not None:
        span = (a.out - 1) * a.stride + (a.kernel - 1) * a.dilation + 1
        pads = [(0, 0)] * x.ndim
        pads[axis] = (a.padding, max(0, span - a.size - a.padding))
        xp = mx.pad(x, pads, constant_values=fill) if any(pads[axis]) else x
        index = [slice(None)] * x.ndim
        taps = []
        for k in range(a.kernel):
            start = k * a.dilation
            index[axis] = slice(start, start + (a.out - 1) * a.stride + 1, a.stride)
            taps.append(xp[tuple(index)])
        return taps
    taps = []
    for k in range(w.pos.shape[1]):
        at = mx.array(np.clip(w.pos[:, k], 0, x.shape[axis] - 1).astype(np.int32))
        mask = mx.array(w.valid[:, k].reshape((-1,) + (1,) * (x.ndim - axis - 1)))
        taps.append(mx.where(mask, mx.take(x, at, axis=axis), mx.array(fill, x.dtype)))
    return taps


def _argmax_index(x: mx.array, rows: Windows, cols: Windows) -> mx.array:
    """(N, OH, OW, C) int32 index h*W + w of the input PyTorch's max pooling picks in each
    window: its loop over (kh, kw) takes a value greater than the best so far *or any NaN*,
    so the pick is the window's last NaN in scan order if it has one, else its first maximum
    (a window whose real inputs are all -inf points at its first real input).

    Both are separable. First maximum (NaNs left out): the row stage keeps each column's max
    and its first row; the column stage keeps, among the real columns that reach the window
    max, the smallest (row, column). Last NaN: the largest scan position kh*KW + kw holding a
    NaN, the row stage taking each column's last NaN row.
    """
    width, c = x.shape[2:]
    (oh, kh), (ow, kw) = rows.pos.shape, cols.pos.shape
    nan = mx.isnan(x)
    key = mx.where(nan, mx.array(-np.inf, x.dtype), x)
    taps = _taps(key, rows, 1, -np.inf)
    row_max, row_arg = taps[0], mx.zeros(taps[0].shape, mx.int32)
    for k, t in enumerate(taps[1:], 1):
        row_arg = mx.where(t > row_max, k, row_arg)
        row_max = mx.maximum(row_max, t)
    row_arg = mx.maximum(row_arg, mx.array(rows.valid.argmax(1).astype(np.int32))[:, None, None])
    best = mx.full(taps[0].shape[:2] + (ow, c), -np.inf, x.dtype)
    best_row = mx.full(best.shape, kh, mx.int32)
    best_col = mx.zeros(best.shape, mx.int32)
    for k, (v, r) in enumerate(zip(_taps(row_max, cols, 2, -np.inf), _taps(row_arg, cols, 2, 0))):
        better = ((v > best) | ((v == best) & (r < best_row))) & mx.array(cols.valid[:, k, None])
        best, best_row, best_col = (mx.where(better, v, best), mx.where(better, r, best_row),
                                    mx.where(better, k, best_col))
    # Padding, overhang and ragged slots are no NaN (filled with 0, then -1: no row).
    nan_row = functools.reduce(mx.maximum, [mx.where(t > 0, k, -1) for k, t in
                                            enumerate(_taps(nan.astype(mx.int32), rows, 1, 0))])
    last_nan = functools.reduce(mx.maximum, [mx.where(r >= 0, r * kw + k, -1) for k, r in
                                             enumerate(_taps(nan_row, cols, 2, -1))])
    has_nan = last_nan >= 0
    best_row = mx.where(has_nan, last_nan // kw, best_row)
    best_col = mx.where(has_nan, last_nan % kw, best_col)
    h = mx.take(mx.array(rows.pos.reshape(-1).astype(np.int32)),
                mx.arange(oh, dtype=mx.int32)[:, None, None] * kh + best_row)
    w = mx.take(mx.array(cols.pos.reshape(-1).astype(np.int32)),
                mx.arange(ow, dtype=mx.int32)[:, None] * kw + best_col)
    return mx.stop_gradient(h * width + w)


def _empty_windows(rows: Windows, cols: Windows) -> np.ndarray | None:
    """(OH, OW, 1) mask of the windows that hold no real input, or None if there are none.

    A dilated window can: it may start in the left padding and step over the whole input
    (kernel 2, dilation 3, padding 1 over a length of 1 or 2, with ceil_mode). Its max is
    -inf and it picks nothing: index -1, no gradient (as the GPU kernels do; PyTorch returns
    -inf with an index past the input, and its backward then writes out of bounds).
    """
    empty = ~rows.valid.any(1)[:, None] | ~cols.valid.any(1)[None, :]
    return empty[:, :, None] if empty.any() else None


def _gather(x: mx.array, index: mx.array) -> mx.array:
    """x (N, H, W, C) at per-channel plane indices (N, OH, OW, C); autodiff scatters back."""
    n, height, width, c = x.shape
    flat = index.reshape(n, index.shape[1] * index.shape[2], c)
    return mx.take_along_axis(x.reshape(n, height * width, c), flat, axis=1).reshape(index.shape)


def window_max(x: mx.array, rows: Windows, cols: Windows, return_indices: bool) -> Any:
    """Max over each (row window × column window) of NHWC ``x``; indices are h*W + w (int32).

    Values are a separable max over the window slots (NaN-propagating, like PyTorch). The
    gradient goes to the one input PyTorch picks (:func:`_argmax_index`; MLX's own ``max``
    would split it between ties): a custom vjp finds that index only when a gradient is asked
    for. A window with no real input is -inf with index -1 (:func:`_empty_windows`).
    """
    empty = _empty_windows(rows, cols)

    def picked(x: mx.array) -> tuple[mx.array, mx.array]:
        index = _argmax_index(x, rows, cols)
        if empty is None:
            return _gather(x, index), index
        none = mx.array(empty)
        value = _gather(x, mx.where(none, 0, index))
        return mx.where(none, mx.array(-np.inf, x.dtype), value), mx.where(none, -1, index)

    if return_indices:
        return picked(x)

    @mx.custom_function
    def values(x: mx.array) -> mx.array:
        r = functools.reduce(mx.maximum, _taps(x, rows, 1, -np.inf))
        return functools.reduce(mx.maximum, _taps(r, cols, 2, -np.inf))

    @values.vjp
    def to_picked(x: mx.array, cotangent: mx.array, _: mx.array) -> mx.array:
        return mx.vjp(lambda x: picked(x)[0], [x], [cotangent])[1][0]

    return values(x)


def window_sum(x: mx.array, rows: Windows, cols: Windows) -> mx.array:
    """Float32 sum over each (row window × column window) of NHWC ``x`` (separable)."""
    r = sum(_taps(x.astype(mx.float32), rows, 1, 0.0))  # (N, OH, W, C)
    return sum(_taps(r, cols, 2, 0.0))                   # (N, OH, OW, C)


# ---- max pooling -------------------------------------------------------------------------

def _max_reference(ndim: int, x: mx.array, *args: Any, **kwargs: Any) -> Any:
    rows, cols, return_indices = _max_geometry(ndim, x, *args, **kwargs)
    out = window_max(_to_2d(x, ndim), fixed_windows(rows), fixed_windows(cols), return_indices)
    return _from_2d(out, ndim)


def max_pool2d(x: mx.array, kernel_size: IntOrPair, stride: IntOrPair | None = None,
               padding: IntOrPair = 0, dilation: IntOrPair = 1, ceil_mode: bool = False,
               return_indices: bool = False) -> mx.array | tuple[mx.array, mx.array]:
    """Max pooling over H, W of NHWC x (PyTorch's F.max_pool2d); indices are int32 h*W+w."""
    return _max_reference(2, x, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def max_pool1d(x: mx.array, kernel_size: int, stride: int | None = None, padding: int = 0,
               dilation: int = 1, ceil_mode: bool = False,
               return_indices: bool = False) -> mx.array | tuple[mx.array, mx.array]:
    """Max pooling over L of NLC x (PyTorch's F.max_pool1d); indices are int32 positions."""
    return _max_reference(1, x, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


# ---- average pooling ---------------------------------------------------------------------

def _avg_reference(ndim: int, x: mx.array, *args: Any, **kwargs: Any) -> mx.array:
    rows, cols, count_include_pad, override = _avg_geometry(ndim, x, *args, **kwargs)
    total = window_sum(_to_2d(x, ndim), fixed_windows(rows), fixed_windows(cols))
    if override is not None:
        return _from_2d((total / mx.array(float32_value(override))).astype(x.dtype), ndim)
    divisor = np.outer(avg_divisor(rows, count_include_pad), avg_divisor(cols, count_include_pad))
    return _from_2d((total / mx.array(divisor[:, :, None])).astype(x.dtype), ndim)


def avg_pool2d(x: mx.array, kernel_size: IntOrPair, stride: IntOrPair | None = None,
               padding: IntOrPair = 0, ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None) -> mx.array:
    """Average pooling over H, W of NHWC x (PyTorch's F.avg_pool2d), float32 sums.

    ``divisor_override`` (a nonzero int) divides every window's sum by itself instead of the
    window's size; ``count_include_pad`` then has no effect.
    """
    return _avg_reference(2, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                          divisor_override)


def avg_pool1d(x: mx.array, kernel_size: int, stride: int | None = None, padding: int = 0,
               ceil_mode: bool = False, count_include_pad: bool = True) -> mx.array:
    """Average pooling over L of NLC x (PyTorch's F.avg_pool1d), float32 sums."""
    return _avg_reference(1, x, kernel_size, stride, padding, ceil_mode, count_include_pad)


# ---- max unpooling -----------------------------------------------------------------------

def max_unpool2d(x: mx.array, indices: mx.array, kernel_size: IntOrPair,
                 stride: IntOrPair | None = None, padding: IntOrPair = 0,
                 output_size: Sequence[int] | None = None) -> mx.array:
    """Inverse of max_pool2d (PyTorch's F.max_unpool2d): zeros except at ``indices``.

    Out-of-range indices are dropped (PyTorch raises); duplicates keep one value.
    """
    oh, ow = _unpool_size(x, indices, kernel_size, stride, padding, output_size)
    n, h, w, c = x.shape
    # Out-of-range indices land in one spare row that is then cut off.
    flat = mx.zeros((n, oh * ow + 1, c), x.dtype)
    where = indices.reshape(n, h * w, c).astype(mx.int32)
    where = mx.where((where >= 0) & (where < oh * ow), where, oh * ow)
    out = mx.put_along_axis(flat, where, x.reshape(n, h * w, c), axis=1)
    return out[:, : oh * ow].reshape(n, oh, ow, c)


# ---- adaptive pooling --------------------------------------------------------------------

def _empty(x: mx.array, oh: int, ow: int) -> mx.array | None:
    """The output when it has no element (no window to reduce), else None."""
    shape = (x.shape[0], oh, ow, x.shape[3])
    return mx.zeros(shape, x.dtype) if 0 in shape else None


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


def adaptive_max_pool2d(x: mx.array, output_size: OutputSize,
                        return_indices: bool = False) -> mx.array | tuple[mx.array, mx.array]:
    """Adaptive max pooling of NHWC x to (oh, ow); indices are int32 h*W+w per plane."""
    oh, ow = _sizes(x, output_size, "adaptive_max_pool2d")
    if (empty := _empty(x, oh, ow)) is not None:
        return (empty, empty.astype(mx.int32)) if return_indices else empty
    return window_max(x, adaptive_windows(x.shape[1], oh), adaptive_windows(x.shape[2], ow),
                      return_indices)


# ---- SPPF --------------------------------------------------------------------------------

def sppf_pool(x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """(y1, y2, y3): NHWC x max-pooled by 5x5 (stride 1, padding 2) once, twice, three times."""
    rows, cols = _sppf_axes(x)
    tables = fixed_windows(rows), fixed_windows(cols)
    y1 = window_max(x, *tables, False)
    y2 = window_max(y1, *tables, False)
    return y1, y2, window_max(y2, *tables, False)
