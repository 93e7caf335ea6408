"""Fixed-window pooling: max / avg pooling in 1d (NLC) and 2d (NHWC), and max-unpooling.

PyTorch semantics throughout, its argument spellings included: an int, a pair or a 1-tuple
for both axes; ``stride`` None or ``()`` for ``kernel_size``. Each op's geometry function
checks a call before any face runs, so every face refuses the same calls, with one-line
MlxnetErrors (tests/test_pooling_torch.py draws calls against torch, and
tests/test_pooling_rules.py sweeps the geometry rules). ``padding`` is at most half the
kernel size (PyTorch checks the undilated size, also for dilated max pooling; an empty batch
is fine); with ``ceil_mode`` the last window may run past the padded input but must start
inside the input or the left padding; avg's divisor counts the padding
(``count_include_pad``) but never ceil-mode overhang, unless ``divisor_override`` replaces
it. Max pooling picks PyTorch's input (the first maximum in window scan order, or the last
NaN: NaN propagates) and its ``indices`` are ``h * W + w`` within each input plane, as int32
(PyTorch: int64). 1d ops run the 2d code on (N, 1, L, C).
"""
from __future__ import annotations

from functools import partial
from typing import Any, Sequence

import mlx.core as mx
import numpy as np

from ..errors import MlxnetError
from . import pool_kernels as K
from .args import shape_of
from .pool_common import (Axis, IntOrPair, as_flag, as_int, as_pair, as_single, avg_divisor,
                          check_input, fixed_axis, fixed_windows, float32_value, one_line,
                          window_max, window_sum)
from .registry import register

_UNIT = Axis(size=1, kernel=1, stride=1, padding=0, dilation=1, out=1)


def _axes(ndim: int, x: mx.array, kernel_size: Any, stride: Any, padding: Any, dilation: Any,
          ceil_mode: bool, op: str) -> tuple[Axis, Axis]:
    """(rows, cols) window geometry; 1d pooling has a single unit row. PyTorch's spellings: a
    1-tuple stands for an int (both axes in 2d), and ``stride`` None or ``()`` for the kernel
    size."""
    check_input(x, ndim + 2, "NHWC (batch, height, width, channels)" if ndim == 2
                else "NLC (batch, length, channels)", op)
    as_flag(ceil_mode, "ceil_mode", op)
    if ndim == 1:
        k = as_single(kernel_size, "kernel_size", op)
        s = k if stride is None else as_single(stride, "stride", op, default=k)
        cols = fixed_axis(x.shape[1], k, s, as_single(padding, "padding", op),
                          as_single(dilation, "dilation", op), ceil_mode, op)
        return _UNIT, cols
    k = as_pair(kernel_size, "kernel_size", op)
    s = k if stride is None else as_pair(stride, "stride", op, default=k)
    p, d = as_pair(padding, "padding", op), as_pair(dilation, "dilation", op)
    return tuple(fixed_axis(x.shape[1 + i], k[i], s[i], p[i], d[i], ceil_mode, op)
                 for i in range(2))  # type: ignore[return-value]


def _to_2d(x: mx.array, ndim: int) -> mx.array:
    return x if ndim == 2 else x.reshape(x.shape[0], 1, *x.shape[1:])


def _from_2d(out: Any, ndim: int) -> Any:
    if ndim == 2:
        return out
    if isinstance(out, (list, tuple)):
        return tuple(o.squeeze(1) for o in out)
    return out.squeeze(1)


def _single(out: Any) -> mx.array:
    return out[0] if isinstance(out, (list, tuple)) else out


# ---- max pooling -------------------------------------------------------------------------

def _max_geometry(ndim: int, x: mx.array, kernel_size: Any, stride: Any = None, padding: Any = 0,
                  dilation: Any = 1, ceil_mode: bool = False,
                  return_indices: bool = False) -> tuple[Axis, Axis, bool]:
    rows, cols = _axes(ndim, x, kernel_size, stride, padding, dilation, ceil_mode,
                       f"max_pool{ndim}d")
    return rows, cols, return_indices


def _max_reference(ndim: int, x: mx.array, *args: Any, **kwargs: Any) -> Any:
    rows, cols, return_indices = _max_geometry(ndim, x, *args, **kwargs)
    out = window_max(_to_2d(x, ndim), fixed_windows(rows), fixed_windows(cols), return_indices)
    return _from_2d(out, ndim)


def _max_kernel(ndim: int, x: mx.array, *args: Any, **kwargs: Any) -> Any:
    rows, cols, return_indices = _max_geometry(ndim, x, *args, **kwargs)
    out = K.max_forward(_to_2d(x, ndim), rows, cols, return_indices)
    return _from_2d(tuple(out) if return_indices else out[0], ndim)


def _max_vjp(ndim: int, primals: list, cotangents: Any, outputs: Any, **params: Any) -> tuple:
    # Gradient to each window's argmax: the forward's indices if it returned them, else one
    # more forward pass to get them; then a gather over the covering windows.
    x = primals[0]
    rows, cols, return_indices = _max_geometry(ndim, *primals, **params)
    x2 = _to_2d(x, ndim)
    if return_indices:
        indices = _to_2d(outputs[1], ndim)
    else:
        indices = K.max_forward(x2, rows, cols, True)[1]
    dx = K.max_backward(indices, _to_2d(_single(cotangents), ndim), x2, rows, cols)
    return (dx.reshape(x.shape),)


def _example_2d() -> mx.array:
    return mx.random.normal((2, 9, 11, 6), key=mx.random.key(7))


def _example_1d() -> mx.array:
    return mx.random.normal((2, 13, 5), key=mx.random.key(8))


def _pool_edges(ndim: int, **kwargs: Any) -> list[tuple[tuple, dict]]:
    """Under 8 elements (with and without indices), and an empty batch (PyTorch takes it)."""
    shape = (1, 2, 3, 1) if ndim == 2 else (1, 5, 1)
    tiny = mx.arange(6, dtype=mx.float32)[: 6 if ndim == 2 else 5].reshape(shape)
    cases = [((tiny,), kwargs), ((mx.zeros((0,) + shape[1:]),), kwargs)]
    if "return_indices" in kwargs:
        cases.append(((tiny,), {**kwargs, "return_indices": not kwargs["return_indices"]}))
    return cases


@register("max_pool2d", batched=4, kernel=partial(_max_kernel, 2), kernel_vjp=partial(_max_vjp, 2),
          sources=(K.MAX,),
          example=lambda: ((_example_2d(),), dict(kernel_size=(3, 2), stride=(2, 1),
                                                  padding=1, dilation=(1, 2), ceil_mode=True)),
          edge_examples=lambda: _pool_edges(2, kernel_size=2, padding=1, return_indices=False))
def max_pool2d(x: mx.array, kernel_size: IntOrPair, stride: IntOrPair | None = None,
               padding: IntOrPair = 0, dilation: IntOrPair = 1, ceil_mode: bool = False,
               return_indices: bool = False) -> mx.array | tuple[mx.array, mx.array]:
    """Max pooling over H, W of NHWC x (PyTorch's F.max_pool2d); indices are int32 h*W+w."""
    return _max_reference(2, x, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


@register("max_pool1d", batched=3, kernel=partial(_max_kernel, 1), kernel_vjp=partial(_max_vjp, 1),
          sources=(K.MAX_INDICES,),
          example=lambda: ((_example_1d(),), dict(kernel_size=3, stride=2, padding=1, dilation=2,
                                                  ceil_mode=True, return_indices=True)),
          edge_examples=lambda: _pool_edges(1, kernel_size=2, dilation=2, return_indices=True))
def max_pool1d(x: mx.array, kernel_size: int, stride: int | None = None, padding: int = 0,
               dilation: int = 1, ceil_mode: bool = False,
               return_indices: bool = False) -> mx.array | tuple[mx.array, mx.array]:
    """Max pooling over L of NLC x (PyTorch's F.max_pool1d); indices are int32 positions."""
    return _max_reference(1, x, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


# ---- average pooling ---------------------------------------------------------------------

def _avg_geometry(ndim: int, x: mx.array, kernel_size: Any, stride: Any = None, padding: Any = 0,
                  ceil_mode: bool = False, count_include_pad: bool = True,
                  divisor_override: Any = None) -> tuple[Axis, Axis, bool, int | None]:
    op = f"avg_pool{ndim}d"
    rows, cols = _axes(ndim, x, kernel_size, stride, padding, 1, ceil_mode, op)
    as_flag(count_include_pad, "count_include_pad", op)
    if divisor_override is not None:
        # PyTorch takes any nonzero int64 (not a bool or a float) and divides by its float value.
        divisor_override = as_int(divisor_override, "divisor_override", op)
        if divisor_override == 0:
            raise MlxnetError(f"{op}: divisor_override must not be zero, got 0")
    return rows, cols, count_include_pad, divisor_override


def _avg_reference(ndim: int, x: mx.array, *args: Any, **kwargs: Any) -> mx.array:
    rows, cols, count_include_pad, override = _avg_geometry(ndim, x, *args, **kwargs)
    total = window_sum(_to_2d(x, ndim), fixed_windows(rows), fixed_windows(cols))
    if override is not None:
        return _from_2d((total / mx.array(float32_value(override))).astype(x.dtype), ndim)
    divisor = np.outer(avg_divisor(rows, count_include_pad), avg_divisor(cols, count_include_pad))
    return _from_2d((total / mx.array(divisor[:, :, None])).astype(x.dtype), ndim)


def _avg_kernel(ndim: int, x: mx.array, *args: Any, **kwargs: Any) -> mx.array:
    rows, cols, count_include_pad, override = _avg_geometry(ndim, x, *args, **kwargs)
    return _from_2d(K.avg_forward(_to_2d(x, ndim), rows, cols, count_include_pad, override), ndim)


def _avg_vjp(ndim: int, primals: list, cotangents: Any, outputs: Any, **params: Any) -> tuple:
    x = primals[0]
    rows, cols, count_include_pad, override = _avg_geometry(ndim, *primals, **params)
    dx = K.avg_backward(_to_2d(_single(cotangents), ndim), _to_2d(x, ndim), rows, cols,
                        count_include_pad, override)
    return (dx.reshape(x.shape),)


def _avg_edges() -> list[tuple[tuple, dict]]:
    # A divisor_override too, so the compile checks render the override path of both kernels.
    return (_pool_edges(2, kernel_size=2, padding=1, ceil_mode=True)
            + _pool_edges(2, kernel_size=(2,), stride=(), padding=(1,), divisor_override=3))


@register("avg_pool2d", batched=4, kernel=partial(_avg_kernel, 2), kernel_vjp=partial(_avg_vjp, 2),
          sources=(K.AVG,),
          example=lambda: ((_example_2d(),), dict(kernel_size=3, stride=2, padding=1,
                                                  ceil_mode=True, count_include_pad=False)),
          edge_examples=_avg_edges)
def avg_pool2d(x: mx.array, kernel_size: IntOrPair, stride: IntOrPair | None = None,
               padding: IntOrPair = 0, ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None) -> mx.array:
    """Average pooling over H, W of NHWC x (PyTorch's F.avg_pool2d), float32 sums.

    ``divisor_override`` (a nonzero int) divides every window's sum by itself instead of the
    window's size; ``count_include_pad`` then has no effect.
    """
    return _avg_reference(2, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                          divisor_override)


@register("avg_pool1d", batched=3, kernel=partial(_avg_kernel, 1), kernel_vjp=partial(_avg_vjp, 1),
          sources=(K.AVG,),
          example=lambda: ((_example_1d(),), dict(kernel_size=4, stride=3, padding=2,
                                                  ceil_mode=True)),
          edge_examples=lambda: _pool_edges(1, kernel_size=3, count_include_pad=False))
def avg_pool1d(x: mx.array, kernel_size: int, stride: int | None = None, padding: int = 0,
               ceil_mode: bool = False, count_include_pad: bool = True) -> mx.array:
    """Average pooling over L of NLC x (PyTorch's F.avg_pool1d), float32 sums."""
    return _avg_reference(1, x, kernel_size, stride, padding, ceil_mode, count_include_pad)


# ---- max unpooling -----------------------------------------------------------------------

def _unpool_size(x: mx.array, indices: mx.array, kernel_size: IntOrPair,
                 stride: IntOrPair | None = None, padding: IntOrPair = 0,
                 output_size: Sequence[int] | None = None) -> tuple[int, int]:
    """PyTorch's default (H-1)*stride - 2*padding + kernel, or a checked output_size.

    As PyTorch's F.max_unpool2d: kernel_size, stride and padding are ints or pairs (no
    1-tuples, and any int: only the output size is checked, >= 0); output_size is (H, W) or,
    PyTorch's (N, C, H, W) spelling, four ints of which the last two count.
    """
    op = "max_unpool2d"
    check_input(x, 4, "NHWC (batch, height, width, channels)", op)
    if not isinstance(indices, mx.array) or indices.shape != x.shape:
        raise MlxnetError(f"{op}: indices must have the input's shape {x.shape}, got {shape_of(indices)}")
    if not mx.issubdtype(indices.dtype, mx.integer):
        raise MlxnetError(f"{op}: indices must be integers, got {indices.dtype}")
    k = as_pair(kernel_size, "kernel_size", op, one=False)
    s = k if stride is None else as_pair(stride, "stride", op, one=False)
    p = as_pair(padding, "padding", op, one=False)
    default = tuple((x.shape[1 + i] - 1) * s[i] - 2 * p[i] + k[i] for i in range(2))
    if output_size is None:
        size = default
    else:
        if not isinstance(output_size, Sequence) or isinstance(output_size, (str, bytes)) \
                or len(output_size) not in (2, 4):
            raise MlxnetError(f"{op}: output_size must be 2 or 4 ints (H, W or N, C, H, W), "
                              f"got {one_line(output_size)}")
        size = tuple(as_int(v, "each output_size entry", op, bits=32) for v in output_size)[-2:]
        for i in range(2):
            if not default[i] - s[i] < size[i] < default[i] + s[i]:
                raise MlxnetError(f"{op}: output_size {tuple(size)} must lie strictly between "
                                  f"{tuple(d - t for d, t in zip(default, s))} and "
                                  f"{tuple(d + t for d, t in zip(default, s))}")
    if min(size) < 0:
        raise MlxnetError(f"{op}: output size must be >= 0, got {tuple(size)} (kernel_size {k}, "
                          f"stride {s}, padding {p})")
    return size  # type: ignore[return-value]


def _unpool_kernel(x: mx.array, indices: mx.array, *args: Any, **kwargs: Any) -> mx.array:
    oh, ow = _unpool_size(x, indices, *args, **kwargs)
    return K.unpool_forward(x, indices, oh, ow)


def _unpool_vjp(primals: list, cotangents: Any, outputs: Any, **params: Any) -> tuple:
    x, indices = primals[:2]
    _unpool_size(*primals, **params)
    return K.unpool_backward(indices, _single(cotangents), x), mx.zeros_like(indices)


def _unpool_example() -> tuple[tuple, dict]:
    x = mx.random.normal((2, 8, 11, 6), key=mx.random.key(9))
    y, indices = max_pool2d.op.definition(x, 2, return_indices=True)  # type: ignore[attr-defined]
    return (y, indices), dict(kernel_size=2, output_size=(9, 11))


def _unpool_edges() -> list[tuple[tuple, dict]]:
    tiny, indices = mx.array([1.0, -2.0]).reshape(1, 1, 2, 1), mx.array([0, 3]).reshape(1, 1, 2, 1)
    empty = mx.zeros((0, 1, 2, 1))
    return [((tiny, indices), dict(kernel_size=2)),
            ((empty, empty.astype(mx.int32)), dict(kernel_size=2))]


@register("max_unpool2d", batched=4, per_sample=2, kernel=_unpool_kernel, kernel_vjp=_unpool_vjp,
          sources=(K.UNPOOL,), example=_unpool_example, edge_examples=_unpool_edges)
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


# The adaptive and SPPF ops live in their own modules; import every pooling op from here.
from .pool_adaptive import adaptive_avg_pool2d, adaptive_max_pool2d  # noqa: E402
from .pool_sppf import sppf_pool  # noqa: E402

__all__ = ["adaptive_avg_pool2d", "adaptive_max_pool2d", "avg_pool1d", "avg_pool2d",
           "max_pool1d", "max_pool2d", "max_unpool2d", "sppf_pool"]
