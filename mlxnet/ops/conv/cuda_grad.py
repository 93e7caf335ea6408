"""A dense conv whose gradient runs as two convolutions, for CUDA. MLX differentiates a conv's
weight by materialising the input's patch matrix (kh·kw copies of the map, padded) and one GEMM
against it; for a training step, whose backward does that for every conv of the network, those
patches are most of its transient memory. Here the weight gradient is itself a convolution:
the input, read channel-major (C, H, W, N), convolved with the output gradient (O, Ho, Wo, N)
as a kernel dilated by the stride, gives (C, kh, kw, O), which is the weight gradient
transposed. cuDNN runs it on strided views without copying either operand (measured on an
H200: docs/performance-notes.md, "Convolution gradients on CUDA"). The input gradient is the
transposed convolution MLX itself builds.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable

import mlx.core as mx

from ..core.kernel_source import MLX_SMALL_POOL_BYTES
from .check import Pair

# Input channels below which MLX's patches are faster (an RGB image's first conv: its patch
# matrix is small and the weight-gradient conv's reduction over N·H·W runs on few channels).
MIN_CHANNELS = 16


def takes(x: mx.array, weight: mx.array, dilation: Pair, groups: int) -> bool:
    """A dense, undilated conv of enough input channels, whose operands all outgrow MLX's small
    pool (see definition.mlx_conv2d)."""
    return (groups == 1 and dilation == (1, 1) and x.shape[-1] >= MIN_CHANNELS and x.dtype == weight.dtype
            and x.shape[0] * weight.shape[0] * x.dtype.size > MLX_SMALL_POOL_BYTES)


def conv2d(x: mx.array, weight: mx.array, *, stride: Pair, padding: Pair) -> mx.array:
    """``mx.conv2d(x, weight, stride, padding)`` with the gradients described above."""
    return _conv(tuple(stride), tuple(padding))(x, weight)


@lru_cache(maxsize=None)
def _conv(stride: Pair, padding: Pair) -> Callable[[mx.array, mx.array], mx.array]:
    """One differentiable conv per geometry, made once: a training step calls it for every conv
    of the network, and a custom function is costly to build."""
    @mx.custom_function
    def conv(x: mx.array, weight: mx.array) -> mx.array:
        return mx.conv2d(x, weight, stride=stride, padding=padding)

    @conv.vjp
    def backward(primals: tuple, cotangent: mx.array | list, output: mx.array) -> tuple[mx.array, mx.array]:
        x, weight = primals
        g = cotangent[0] if isinstance(cotangent, (list, tuple)) else cotangent
        return input_gradient(g, weight, x.shape, stride, padding), weight_gradient(x, g, weight.shape, stride, padding)

    return conv


def input_gradient(g: mx.array, weight: mx.array, x_shape: tuple, stride: Pair, padding: Pair) -> mx.array:
    """The conv's input gradient: the output gradient spread by the stride and convolved with the
    flipped weight, its channels swapped, padded so the result has the input's size."""
    k = weight.shape[1:3]
    lo = [k[i] - 1 - padding[i] for i in range(2)]
    hi = [x_shape[1 + i] - (1 + stride[i] * (g.shape[1 + i] - 1)) + padding[i] for i in range(2)]
    crop_lo, crop_hi = [max(-v, 0) for v in lo], [max(-v, 0) for v in hi]  # a negative pad crops afterwards
    dx = mx.conv_general(g, mx.swapaxes(weight, 0, -1), stride=1,
                         padding=([max(v, 0) for v in lo], [max(v, 0) for v in hi]),
                         input_dilation=stride, flip=True)
    if any(crop_lo) or any(crop_hi):
        dx = dx[:, crop_lo[0]:dx.shape[1] - crop_hi[0], crop_lo[1]:dx.shape[2] - crop_hi[1], :]
    return dx


def weight_gradient(x: mx.array, g: mx.array, w_shape: tuple, stride: Pair, padding: Pair) -> mx.array:
    """sum over n, y, x of g[n, y, x, o] · x_padded[n, y·s + i, x·s + j, c], as one convolution
    over views: no patch matrix."""
    _, kh, kw, _ = w_shape
    dw = mx.conv_general(x.transpose(3, 1, 2, 0), g.transpose(3, 1, 2, 0), stride=1, padding=padding,
                         kernel_dilation=stride)
    # A stride that does not divide the padded size leaves a tap or two past the kernel.
    return dw[:, :kh, :kw, :].transpose(3, 1, 2, 0)
