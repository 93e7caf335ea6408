"""Shared pooling machinery: PyTorch's window geometry and the MLX-composed reductions.

Every pooling reference (fixed or adaptive windows, 1d or 2d) reduces the same way: each
spatial axis gets an index table ``(out, k)`` of input positions and a validity mask (padding,
ceil-mode overhang and ragged adaptive windows are just invalid slots). Rows then columns are
gathered with ``mx.take`` (vectorised, differentiable), and the window is reduced. Max pooling
takes the *first* maximum in (kh, kw) scan order via argmax, as PyTorch does, so the gradient
goes to exactly one input (MLX's own ``max`` splits it between ties).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import mlx.core as mx
import numpy as np

from ..errors import MlxnetError

IntOrPair = int | Sequence[int]


def as_pair(value: IntOrPair, what: str, op: str) -> tuple[int, int]:
    """An int or a pair of ints, as PyTorch's pooling arguments accept."""
    if isinstance(value, int):
        return value, value
    pair = tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) for v in pair):
        raise MlxnetError(f"{op}: {what} must be an int or a pair of ints, got {value!r}")
    return pair  # type: ignore[return-value]


def as_single(value: int | Sequence[int], what: str, op: str) -> int:
    """A 1d pooling argument: an int or a one-element sequence."""
    if isinstance(value, int):
        return value
    seq = tuple(value)
    if len(seq) != 1 or not isinstance(seq[0], int):
        raise MlxnetError(f"{op}: {what} must be an int, got {value!r}")
    return seq[0]


def check_input(x: mx.array, ndim: int, layout: str, op: str) -> None:
    if not isinstance(x, mx.array) or x.ndim != ndim:
        got = x.shape if isinstance(x, mx.array) else type(x).__name__
        raise MlxnetError(f"{op}: expected a {ndim}-D {layout} array, got shape {got}")
    if not mx.issubdtype(x.dtype, mx.floating):
        raise MlxnetError(f"{op}: expected a floating-point input, got {x.dtype}")
    if x.size == 0:
        raise MlxnetError(f"{op}: empty input of shape {x.shape}")


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


def fixed_table(a: Axis) -> tuple[np.ndarray, np.ndarray]:
    """(out, kernel) input positions of each window slot and whether the slot is inside."""
    pos = (np.arange(a.out)[:, None] * a.stride - a.padding
           + np.arange(a.kernel)[None, :] * a.dilation)
    return pos, (pos >= 0) & (pos < a.size)


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


def adaptive_table(size: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    start, end = adaptive_bounds(size, out)
    pos = start[:, None] + np.arange(int((end - start).max()))[None, :]
    return pos, pos < end[:, None]


def adaptive_sizes(shape: tuple[int, int], output_size: Any, op: str) -> tuple[int, int]:
    """Output (oh, ow); an int means square, None keeps the input's size along that axis."""
    sizes = (output_size, output_size) if output_size is None or isinstance(output_size, int) \
        else tuple(output_size)
    if len(sizes) != 2:
        raise MlxnetError(f"{op}: output_size must be an int, None or a pair, got {output_size!r}")
    out = tuple(s if o is None else o for s, o in zip(shape, sizes))
    if not all(isinstance(o, int) and o > 0 for o in out):
        raise MlxnetError(f"{op}: output sizes must be positive ints or None, got {output_size!r}")
    return out  # type: ignore[return-value]


def _gather(x: mx.array, pos: np.ndarray, axis: int) -> mx.array:
    """x with ``axis`` replaced by the (out, k) table's two axes."""
    flat = np.clip(pos, 0, x.shape[axis] - 1).reshape(-1).astype(np.int32)
    g = mx.take(x, mx.array(flat), axis=axis)
    return g.reshape(*x.shape[:axis], *pos.shape, *x.shape[axis + 1:])


def window_max(x: mx.array, rows: tuple[np.ndarray, np.ndarray],
               cols: tuple[np.ndarray, np.ndarray], return_indices: bool) -> Any:
    """Max over each (row window × column window) of NHWC ``x``; indices are h*W + w (int32)."""
    (hpos, hvalid), (wpos, wvalid) = rows, cols
    n, _, width, c = x.shape
    oh, kh = hpos.shape
    ow, kw = wpos.shape
    g = _gather(_gather(x, hpos, 1), wpos, 3)  # (N, OH, KH, OW, KW, C)
    valid = mx.array(hvalid[:, :, None, None, None] & wvalid[None, None, :, :, None])
    g = mx.where(valid, g, mx.array(-np.inf, x.dtype))
    g = g.transpose(0, 1, 3, 2, 4, 5).reshape(n, oh, ow, kh * kw, c)
    # A NaN wins, as PyTorch propagates it; argmax keeps the first of equal maxima.
    arg = mx.argmax(mx.where(mx.isnan(g), mx.array(np.inf, x.dtype), g), axis=3, keepdims=True)
    slot_valid = (hvalid[:, None, :, None] & wvalid[None, :, None, :]).reshape(oh, ow, kh * kw)
    if not slot_valid.all():
        # Real inputs that are all -inf tie with the padding: take the first real one instead.
        picked = mx.take_along_axis(mx.array(slot_valid)[None, :, :, :, None], arg, axis=3)
        first = mx.array(slot_valid.argmax(-1).astype(np.uint32))[None, :, :, None, None]
        arg = mx.where(picked, arg, first)
    arg = mx.stop_gradient(arg)
    y = mx.take_along_axis(g, arg, axis=3).squeeze(3)
    if not return_indices:
        return y
    flat = (hpos[:, None, :, None] * width + wpos[None, :, None, :]).reshape(oh, ow, kh * kw)
    table = mx.broadcast_to(mx.array(flat.astype(np.int32))[None, :, :, :, None], g.shape)
    return y, mx.take_along_axis(table, arg, axis=3).squeeze(3)


def window_sum(x: mx.array, rows: tuple[np.ndarray, np.ndarray],
               cols: tuple[np.ndarray, np.ndarray]) -> mx.array:
    """Float32 sum over each (row window × column window) of NHWC ``x`` (separable)."""
    (hpos, hvalid), (wpos, wvalid) = rows, cols
    g = _gather(x.astype(mx.float32), hpos, 1) * mx.array(hvalid[:, :, None, None], mx.float32)
    g = g.sum(axis=2)  # (N, OH, W, C)
    g = _gather(g, wpos, 2) * mx.array(wvalid[:, :, None], mx.float32)
    return g.sum(axis=3)  # (N, OH, OW, C)
