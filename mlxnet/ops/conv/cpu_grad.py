"""The gradient of conv2d's CPU fast path, as GEMMs on the patch matrix.

The fast path's formulations are written for inference (a direct convolution, shifted GEMMs,
im2col), and autodiff through them, or through ``mx.conv2d``, runs MLX's CPU convolution
gradients: a scalar strided unfold per gradient, several times slower than the forward. Here
the forward runs the fast path and the backward is three BLAS-sized steps on mlxnet's CPU
primitives: the patch matrix of ``x`` (im2col), ``dW = dYᵀ·patches``, and ``dX`` as the image
summing ``dY·W``'s patches back (col2im, im2col's adjoint), or for a stride-1 conv as the fast
path's conv of ``dY`` with the flipped kernel. A 1×1 stride-1 conv needs neither.
For a 1×1 conv of a concatenation, each part's gradient is its own GEMM (the concatenation is
never built, as in the forward).
"""
from __future__ import annotations

from typing import Callable, Sequence

import mlx.core as mx

from ... import _native
from .check import Pair


StrideOneConv = Callable[[mx.array, mx.array, Pair], mx.array]  # (x, weight, padding) -> y


def _input_and_weight_grads(native, x: mx.array, weight: mx.array, dy: mx.array, stride: Pair,
                            padding: Pair, dilation: Pair, stride_one: StrideOneConv) -> tuple[mx.array, mx.array]:
    c_out, kh, kw, c = weight.shape
    dy2 = dy.reshape(-1, c_out)
    w2 = weight.reshape(c_out, kh * kw * c)
    if (kh, kw) == (1, 1) and stride == (1, 1) and padding == (0, 0):
        return (dy2 @ w2).reshape(x.shape), (dy2.T @ x.reshape(-1, c)).reshape(weight.shape)
    cols = native.im2col(x, (kh, kw), stride, padding, dilation)
    dw = (dy2.T @ cols.reshape(-1, cols.shape[-1])).reshape(weight.shape)
    full = (dilation[0] * (kh - 1) - padding[0], dilation[1] * (kw - 1) - padding[1])
    if stride == (1, 1) and min(full) >= 0:
        # A stride-1 conv's input gradient is the conv of dY with the flipped, transposed kernel:
        # the fast path's forward, no patch matrix of dY·W to sum back.
        return stride_one(dy, weight[:, ::-1, ::-1, :].transpose(3, 1, 2, 0), full), dw
    d_cols = (dy2 @ w2).reshape(cols.shape)
    return native.col2im(d_cols, tuple(x.shape[1:3]), (kh, kw), stride, padding, dilation), dw


def fits(x: mx.array, weight: mx.array, groups: int) -> bool:
    """Whether :func:`with_gemm_gradient` takes this conv: float32, ungrouped, primitives built."""
    return (groups == 1 and x.dtype == weight.dtype == mx.float32 and x.ndim == 4
            and _native.on_cpu() is not None)


def with_gemm_gradient(forward: Callable[..., mx.array], x: mx.array, weight: mx.array,
                       bias: mx.array | None, stride: Pair, padding: Pair, dilation: Pair,
                       stride_one: StrideOneConv) -> mx.array:
    """``forward(x, weight, bias)`` (the fast path, bias included), differentiated by GEMMs;
    ``stride_one(x, weight, padding)`` is the fast path's stride-1 conv at this dilation (for a
    stride-1 conv's input gradient)."""
    native = _native.on_cpu()

    def backward(primals: tuple, dy: mx.array, _output: mx.array) -> tuple:
        x, weight = primals[:2]
        dx, dw = _input_and_weight_grads(native, x, weight, dy, stride, padding, dilation, stride_one)
        return (dx, dw) if len(primals) == 2 else (dx, dw, dy.reshape(-1, weight.shape[0]).sum(axis=0))

    if bias is None:
        conv = mx.custom_function(lambda x, w: forward(x, w, None))
        conv.vjp(backward)
        return conv(x, weight)
    conv = mx.custom_function(forward)
    conv.vjp(backward)
    return conv(x, weight, bias)


def pointwise_with_gemm_gradient(forward: Callable[..., mx.array], xs: Sequence[mx.array], weight: mx.array,
                                 bias: mx.array | None) -> mx.array:
    """``forward(parts, weight, bias)``, a 1×1 conv of the parts' concatenation, differentiated
    part by part: ``dXᵢ = dY·Wᵢ`` and ``dW`` the concatenation of ``dYᵀ·Xᵢ``."""
    def backward(primals: tuple, dy: mx.array, _output: mx.array) -> tuple:
        parts, weight = primals[:2]
        c_out = weight.shape[0]
        dy2 = dy.reshape(-1, c_out)
        w2 = weight.reshape(c_out, -1)
        d_parts, d_weights, start = [], [], 0
        for x in parts:
            c = x.shape[-1]
            d_parts.append((dy2 @ w2[:, start:start + c]).reshape(x.shape))
            d_weights.append(dy2.T @ x.reshape(-1, c))
            start += c
        dw = mx.concatenate(d_weights, axis=1).reshape(weight.shape)
        return (d_parts, dw) if len(primals) == 2 else (d_parts, dw, dy2.sum(axis=0))

    if bias is None:
        conv = mx.custom_function(lambda parts, w: forward(parts, w, None))
        conv.vjp(backward)
        return conv(list(xs), weight)
    conv = mx.custom_function(forward)
    conv.vjp(backward)
    return conv(list(xs), weight, bias)
