"""Shared pooling machinery: PyTorch's window geometry and the MLX-composed reductions.

Every pooling reference (fixed or adaptive windows, 1d or 2d) reduces the same way: each
spatial axis has a table ``(out, k)`` of input positions and a validity mask (padding,
ceil-mode overhang and ragged adaptive windows are just invalid slots). Windows are reduced
separably, rows then columns, one window slot at a time over strided slices of the padded
input (fixed windows) or gathers (adaptive ones): vectorised over pixels, differentiable,
and fast on the CPU. Max pooling picks
the input PyTorch picks (the first maximum in (kh, kw) scan order, or the last NaN where the
window has one), so the gradient goes to exactly one input (MLX's own ``max`` splits it
between ties).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Sequence

import mlx.core as mx
import numpy as np

from ..errors import MlxnetError
from .args import as_flag, as_int, as_tuple, one_line, shape_of

IntOrPair = int | Sequence[int]


def as_pair(value: IntOrPair, what: str, op: str, default: tuple[int, int] | None = None,
            one: bool = True) -> tuple[int, int]:
    """PyTorch's 2-d pooling spelling (see :func:`.args.as_tuple`); ``default``: what ``()``
    stands for (stride: the kernel size); ``one=False`` refuses 1-tuples (max_unpool2d)."""
    return as_tuple(value, 2, what, op, default, one)  # type: ignore[return-value]


def as_single(value: int | Sequence[int], what: str, op: str, default: int | None = None) -> int:
    """PyTorch's 1-d pooling spelling: an int or a 1-tuple; with a ``default``, also ``()``."""
    return as_tuple(value, 1, what, op, None if default is None else (default,))[0]


def float32_parts(value: int) -> tuple[int, int]:
    """(mantissa, shift) with float32(value) == mantissa * 2**shift exactly, |mantissa| < 2**24:
    an int64 as C converts it to float (round to nearest even), in two int32 kernel params."""
    magnitude = abs(value)
    shift = max(0, magnitude.bit_length() - 24)
    mantissa, rest = divmod(magnitude, 1 << shift)
    half = (1 << shift) >> 1
    if shift and (rest > half or (rest == half and mantissa & 1)):
        mantissa += 1
    if mantissa == 1 << 24:
        mantissa, shift = mantissa >> 1, shift + 1
    return (-mantissa if value < 0 else mantissa), shift


def float32_value(value: int) -> np.float32:
    mantissa, shift = float32_parts(value)
    return np.float32(mantissa * 2.0**shift)


def check_input(x: mx.array, ndim: int, layout: str, op: str, empty_channels: bool = False) -> None:
    """PyTorch's input rule: only the batch axis may be empty (and the channels, where
    ``empty_channels``, as adaptive average pooling allows)."""
    if not isinstance(x, mx.array) or x.ndim != ndim:
        raise MlxnetError(f"{op}: expected a {ndim}-D {layout} array, got shape {shape_of(x)}")
    if not mx.issubdtype(x.dtype, mx.floating):
        raise MlxnetError(f"{op}: expected a floating-point input, got {x.dtype}")
    if 0 in x.shape[1:-1] + (() if empty_channels else x.shape[-1:]):
        raise MlxnetError(f"{op}: only the batch axis may be empty, got shape {x.shape}")


@dataclass(frozen=True)
class Axis:
    """Fixed windows along one spatial axis (PyTorch's pooling rules)."""

    size: int
    kernel: int
    stride: int
    padding: int
    dilation: int
    out: int


def fixed_axis(size: int, kernel: int, stride: int | None, padding: int, dilation: int,
               ceil_mode: bool, op: str) -> Axis:
    """PyTorch's ``pooling_output_shape`` with its argument checks.

    With ceil_mode the last window may run past the padded input, but it must start inside
    the input or the left padding, else it is dropped.
    """
    stride = kernel if stride is None else stride
    if kernel <= 0 or stride <= 0 or dilation <= 0 or padding < 0:
        raise MlxnetError(f"{op}: kernel_size, stride and dilation must be > 0 and padding >= 0, "
                          f"got kernel_size={kernel}, stride={stride}, padding={padding}, "
                          f"dilation={dilation}")
    if padding > kernel // 2:  # PyTorch's rule (undilated kernel), for max and avg alike
        raise MlxnetError(f"{op}: padding should be at most half of the kernel size "
                          f"({kernel // 2}), got {padding}")
    span = dilation * (kernel - 1) + 1
    numerator = size + 2 * padding - span + (stride - 1 if ceil_mode else 0)
    out = numerator // stride + 1
    if ceil_mode and (out - 1) * stride >= size + padding:
        out -= 1
    if out < 1:
        raise MlxnetError(f"{op}: input size {size} is too small for kernel {kernel} "
                          f"(dilation {dilation}, padding {padding}): output size would be {out}")
    return Axis(size, kernel, stride, padding, dilation, out)


@dataclass(frozen=True)
class Windows:
    """The windows along one axis: ``pos[o, k]`` is the input position of slot k of output o,
    ``valid`` says whether it is a real input (not padding, overhang or a ragged tail).
    Fixed windows keep their Axis so the reference can slice the padded input, not gather."""

    pos: np.ndarray
    valid: np.ndarray
    fixed: Axis | None = None


def fixed_windows(a: Axis) -> Windows:
    pos = (np.arange(a.out)[:, None] * a.stride - a.padding
           + np.arange(a.kernel)[None, :] * a.dilation)
    return Windows(pos, (pos >= 0) & (pos < a.size), a)


def avg_divisor(a: Axis, count_include_pad: bool) -> np.ndarray:
    """PyTorch's per-window divisor along one axis (the 2d divisor is the product).

    With count_include_pad the padding counts, but not slots past the padded input
    (ceil-mode overhang); without it only real inputs count.
    """
    start = np.arange(a.out) * a.stride - a.padding
    end = np.minimum(start + a.kernel, a.size + a.padding)
    if count_include_pad:
        return (end - start).astype(np.float32)
    return (np.minimum(end, a.size) - np.maximum(start, 0)).astype(np.float32)


def adaptive_bounds(size: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    """PyTorch's adaptive windows: start = floor(i*size/out), end = ceil((i+1)*size/out)."""
    i = np.arange(out)
    return (i * size) // out, -((-(i + 1) * size) // out)


def adaptive_windows(size: int, out: int) -> Windows:
    start, end = adaptive_bounds(size, out)
    pos = start[:, None] + np.arange(int((end - start).max()))[None, :]
    return Windows(pos, pos < end[:, None])


def adaptive_sizes(shape: tuple[int, int], output_size: Any, op: str) -> tuple[int, int]:
    """Output (oh, ow): an int means square; a pair's None entries keep the input's size.

    As PyTorch: a bare None, 1-tuples and bools are refused (its ``output_size`` is an int or
    exactly two entries), and so are sizes a C int cannot hold.
    """
    kind = "an int or a pair of ints (None: the input's size)"
    if isinstance(output_size, Sequence) and not isinstance(output_size, (str, bytes, bytearray)):
        entries = tuple(output_size)
        if len(entries) != 2:
            raise MlxnetError(f"{op}: output_size must be {kind}, got {one_line(output_size)}")
        sizes = tuple(s if o is None else as_int(o, "each output_size entry", op, 32)
                      for s, o in zip(shape, entries))
    else:
        if output_size is None:
            raise MlxnetError(f"{op}: output_size must be {kind}, got None")
        size = as_int(output_size, "output_size", op, bits=32)
        sizes = (size, size)
    if min(sizes) < 0:
        raise MlxnetError(f"{op}: output sizes must be ints >= 0 or None, got {one_line(output_size)}")
    return sizes  # type: ignore[return-value]


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
