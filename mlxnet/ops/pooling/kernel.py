"""The pooling ops' GPU faces: the geometry, then the kernels' launches (:mod:`.launchers`),
forward and backward (gathers, no atomics). SPPF's kernel computes its three outputs from one
read of each 13x13 neighbourhood (chained 5x5 'same' max pools equal single 9x9 and 13x13
ones); its backward mirrors the chain with the max-pool gradient kernel.
"""
from __future__ import annotations

from functools import partial
from typing import Any

import mlx.core as mx

from . import launchers as K
from .geometry import (OutputSize, _avg_geometry, _from_2d, _max_geometry, _single, _sizes,
                       _sppf_axes, _to_2d, _unpool_size)


# ---- max pooling -------------------------------------------------------------------------

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


max_pool2d = partial(_max_kernel, 2)
max_pool2d_vjp = partial(_max_vjp, 2)
max_pool1d = partial(_max_kernel, 1)
max_pool1d_vjp = partial(_max_vjp, 1)


# ---- average pooling ---------------------------------------------------------------------

def _avg_kernel(ndim: int, x: mx.array, *args: Any, **kwargs: Any) -> mx.array:
    rows, cols, count_include_pad, override = _avg_geometry(ndim, x, *args, **kwargs)
    return _from_2d(K.avg_forward(_to_2d(x, ndim), rows, cols, count_include_pad, override), ndim)


def _avg_vjp(ndim: int, primals: list, cotangents: Any, outputs: Any, **params: Any) -> tuple:
    x = primals[0]
    rows, cols, count_include_pad, override = _avg_geometry(ndim, *primals, **params)
    dx = K.avg_backward(_to_2d(_single(cotangents), ndim), _to_2d(x, ndim), rows, cols,
                        count_include_pad, override)
    return (dx.reshape(x.shape),)


avg_pool2d = partial(_avg_kernel, 2)
avg_pool2d_vjp = partial(_avg_vjp, 2)
avg_pool1d = partial(_avg_kernel, 1)
avg_pool1d_vjp = partial(_avg_vjp, 1)


# ---- max unpooling -----------------------------------------------------------------------

def max_unpool2d(x: mx.array, indices: mx.array, *args: Any, **kwargs: Any) -> mx.array:
    oh, ow = _unpool_size(x, indices, *args, **kwargs)
    return K.unpool_forward(x, indices, oh, ow)


def max_unpool2d_vjp(primals: list, cotangents: Any, outputs: Any, **params: Any) -> tuple:
    x, indices = primals[:2]
    _unpool_size(*primals, **params)
    return K.unpool_backward(indices, _single(cotangents), x), mx.zeros_like(indices)


# ---- adaptive pooling --------------------------------------------------------------------

def adaptive_avg_pool2d(x: mx.array, output_size: OutputSize) -> mx.array:
    return K.adaptive_avg_forward(x, *_sizes(x, output_size, "adaptive_avg_pool2d"))


def adaptive_avg_pool2d_vjp(primals: list, cotangents: Any, outputs: Any, **params: Any) -> tuple:
    return (K.adaptive_avg_backward(_single(cotangents), primals[0]),)


def _adaptive_max_args(x: mx.array, output_size: OutputSize,
              return_indices: bool = False) -> tuple[mx.array, tuple[int, int], bool]:
    return x, _sizes(x, output_size, "adaptive_max_pool2d"), return_indices


def adaptive_max_pool2d(*args: Any, **kwargs: Any) -> Any:
    x, (oh, ow), return_indices = _adaptive_max_args(*args, **kwargs)
    out = K.adaptive_max_forward(x, oh, ow, return_indices)
    return tuple(out) if return_indices else out[0]


def adaptive_max_pool2d_vjp(primals: list, cotangents: Any, outputs: Any, **params: Any) -> tuple:
    # Gradient to each window's argmax (recomputed unless the forward returned indices).
    x, (oh, ow), return_indices = _adaptive_max_args(*primals, **params)
    indices = outputs[1] if return_indices else K.adaptive_max_forward(x, oh, ow, True)[1]
    return (K.adaptive_max_backward(indices, _single(cotangents), x),)


# ---- SPPF --------------------------------------------------------------------------------

def sppf_pool(x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    _sppf_axes(x)
    return tuple(K.sppf_forward(x))  # type: ignore[return-value]


def sppf_pool_vjp(primals: list, cotangents: Any, outputs: Any) -> tuple:
    # Back through pool 3, then pool 2, then pool 1, adding each output's own gradient.
    x = primals[0]
    rows, cols = _sppf_axes(x)
    inputs = (x, outputs[0], outputs[1])
    grad = cotangents[2]
    for stage in (2, 1, 0):
        indices = K.max_forward(inputs[stage], rows, cols, True)[1]
        grad = K.max_backward(indices, grad, x, rows, cols)
        if stage:
            grad = grad + cotangents[stage - 1].astype(x.dtype)
    return (grad,)
