"""conv2d's GPU face: MLX's own convolution, except where cuDNN picks slow kernels on CUDA:
stride-1 3×3 convs of 40–56 channels and float32 stride-2 ones from 32 on large maps run on
pairs of columns packed into twice the channels, and float32 convs to 1–3 channels from many
run as the taps' GEMM and shifted sums (:mod:`.tap_gemm`). Depthwise convs (groups = channels)
of maps up to MAX_DEPTHWISE_ELEMENTS go to depthwise_conv2d, whose GPU face is one portable
kernel (custom_kernels/depthwise_conv.kern, bias included) that runs them in less time than
cuDNN's grouped kernels; a residual or ReLU after the conv of a small map goes to bias_act's
kernel. The thresholds and the measurements behind each rule: docs/performance-notes.md.
"""
from __future__ import annotations

from functools import lru_cache

import mlx.core as mx
import numpy as np

from ...device import backend, is_differentiating, memory_first
from ...dtypes import FLOATS
from ..activations import silu
from ..core.kernel_source import MLX_SMALL_POOL_BYTES, PortableKernel, launch_nhwc
from ..core.registry import REGISTRY
from . import cuda_grad, definition
from .check import Pair, _out_size, _pair
from .tap_gemm import _taps_then_shift

DEPTHWISE = PortableKernel("depthwise_conv.kern", "depthwise_conv2d", ["x", "weight", "bias", "p"], ["out"])


def conv2d(x: mx.array, weight: mx.array, bias: mx.array | None = None, residual: mx.array | None = None, *,
           stride: int | Pair = 1, padding: int | Pair = 0, dilation: int | Pair = 1, groups: int = 1,
           activation: str | None = None) -> mx.array:
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    if _depthwise_helps(x, weight, groups):
        # the registered op, so its kernel runs under the registry's custom_function (gradients)
        y = REGISTRY["depthwise_conv2d"].dispatch(x, weight, bias, stride=stride, padding=padding,
                                                   dilation=dilation)
        return definition.epilogue(y, None, residual, activation)
    if _pairs_help(x, weight, stride, padding, dilation, groups):
        y = column_pair_conv3x3(x, weight)
    elif _strided_pairs_help(x, weight, stride, padding, dilation, groups):
        y = column_pair_conv3x3_s2(x, weight)
    elif _taps_help(x, weight, stride, padding, dilation, groups):
        xp = mx.pad(x, [(0, 0), (padding[0], padding[0]), (padding[1], padding[1]), (0, 0)])
        y = _taps_then_shift(xp, weight, dilation, _out_size(x, weight, stride, padding, dilation))
    elif backend() == "cuda" and is_differentiating() and cuda_grad.takes(x, weight, dilation, groups):
        y = cuda_grad.conv2d(x, weight, stride=stride, padding=padding)
    else:
        y = definition.mlx_conv2d(x, weight, stride=stride, padding=padding, dilation=dilation, groups=groups)
    if _epilogue_kernel_helps(y, bias, residual, activation):
        return REGISTRY["bias_act"].dispatch(y, bias, residual, activation=activation)
    if activation == "silu" and residual is None:
        return silu(y, bias)
    return definition.epilogue(y, bias, residual, activation)


# Outputs of at most this many elements take bias_act's kernel for a residual or ReLU epilogue
# on CUDA, where MLX's fused kernel for a broadcast bias takes longer; past it MLX's is as fast
# or faster (measured: docs/performance-notes.md).
MAX_EPILOGUE_ELEMENTS = 1 << 19


def _epilogue_kernel_helps(y: mx.array, bias: mx.array | None, residual: mx.array | None,
                           activation: str | None) -> bool:
    """An explicit epilogue (residual or ReLU; a bare bias add stays MLX's, to fuse with what
    follows it in a compiled forward) of a small map on CUDA."""
    return (backend() == "cuda" and bias is not None and activation in (None, "relu")
            and (residual is not None or activation == "relu") and y.size <= MAX_EPILOGUE_ELEMENTS
            and y.dtype == bias.dtype and (residual is None or residual.dtype == y.dtype))


def _depthwise_helps(x: mx.array, weight: mx.array, groups: int) -> bool:
    """A depthwise conv (one filter per channel) of a small enough map on CUDA."""
    return (backend() == "cuda" and groups == x.shape[-1] == weight.shape[0] and groups > 1
            and x.size <= MAX_DEPTHWISE_ELEMENTS)


# Channel counts whose stride-1 3×3 convs cuDNN runs slowly on CUDA and that run faster as
# column-pair convs, on maps of at least this many output pixels (N·H·W), below which the
# weight's rearrangement costs more than it saves (measured; docs/performance-notes.md).
PAIRED_CHANNELS = frozenset({40, 48, 56})
MIN_PAIRED_PIXELS = 150_000


def _column_pairs_fit(x: mx.array, weight: mx.array, stride: Pair, padding: Pair, dilation: Pair,
                      groups: int) -> bool:
    """What both column-pair forms need: CUDA, a dense 3×3 conv padded by 1 of an even-width map,
    with at least MIN_PAIRED_PIXELS output pixels."""
    oh, ow = _out_size(x, weight, stride, padding, dilation)
    return (backend() == "cuda" and groups == 1 and tuple(weight.shape[1:3]) == (3, 3) and padding == (1, 1)
            and dilation == (1, 1) and x.shape[2] % 2 == 0 and x.shape[0] * oh * ow >= MIN_PAIRED_PIXELS)


def _pairs_help(x: mx.array, weight: mx.array, stride: Pair, padding: Pair, dilation: Pair, groups: int) -> bool:
    return (stride == (1, 1) and weight.shape[0] in PAIRED_CHANNELS and weight.shape[-1] in PAIRED_CHANNELS
            and _column_pairs_fit(x, weight, stride, padding, dilation, groups))


# Input channel counts whose stride-2 3×3 convs cuDNN runs slowly on CUDA in float32 (an indexed
# kernel far below its usual rate: YOLOv8s's second conv) and that run faster on column pairs, on
# maps of at least MIN_PAIRED_PIXELS output pixels (measured; docs/performance-notes.md).
STRIDED_PAIR_CHANNELS = frozenset({32})


def _strided_pairs_help(x: mx.array, weight: mx.array, stride: Pair, padding: Pair, dilation: Pair,
                        groups: int) -> bool:
    return (stride == (2, 2) and x.dtype == weight.dtype == mx.float32 and weight.shape[-1] in STRIDED_PAIR_CHANNELS
            and _column_pairs_fit(x, weight, stride, padding, dilation, groups))


# float32 convs to at most this many output channels from at least MIN_TAPS_CHANNELS run faster
# on CUDA as one GEMM to every tap's product and the shifted products summed (cuDNN's implicit
# GEMM wastes most of a tile on so few outputs); the taps' products are capped at
# MAX_TAPS_BYTES (measured; docs/performance-notes.md). A process that has chosen memory over
# speed (mlxnet.device.memory_first) runs them as cuDNN does: the products are 49 times the
# output for a 7×7 kernel (1.2 GiB for LaMa's head at batch 8), its forward's largest buffer.
MAX_TAPS_OUT = 3
MIN_TAPS_CHANNELS = 64
MAX_TAPS_BYTES = 2 << 30


def _taps_help(x: mx.array, weight: mx.array, stride: Pair, padding: Pair, dilation: Pair, groups: int) -> bool:
    c_out, kh, kw, c = weight.shape
    n, h, w, _ = x.shape
    taps_bytes = n * (h + 2 * padding[0]) * (w + 2 * padding[1]) * kh * kw * c_out * 4
    return (backend() == "cuda" and not memory_first() and x.dtype == weight.dtype == mx.float32 and groups == 1
            and stride == (1, 1) and kh * kw > 1 and c_out <= MAX_TAPS_OUT and c >= MIN_TAPS_CHANNELS
            and taps_bytes <= MAX_TAPS_BYTES)


@lru_cache(maxsize=16)
def _pair_gather(o: int, c: int) -> tuple[mx.array, mx.array]:
    """Where each element of the (2·o, 3, 3, 2·c) column-pair weight comes from in the flat
    (o, 3, 3, c) weight, and which elements lie inside the kernel (the rest are zeros). Output
    column 2j+t and packed input column j+J-1 (J = 0, 1, 2), part s, meet at kernel column
    2(J-1) + s - t + 1 where that lies in 0..2; elsewhere the pair is outside the kernel."""
    t, oo, row, J, s, cc = np.meshgrid(*(np.arange(k) for k in (2, o, 3, 3, 2, c)), indexing="ij")
    col = 2 * (J - 1) + s - t + 1
    inside = (col >= 0) & (col <= 2)
    index = ((oo * 3 + row) * 3 + np.clip(col, 0, 2)) * c + cc
    return mx.array(index.reshape(-1).astype(np.int32)), mx.array(inside.reshape(-1))


def column_pair_conv3x3(x: mx.array, weight: mx.array) -> mx.array:
    """A stride-1, padding-1 3×3 conv of an NHWC map of even width, run on pairs of columns:
    (N, H, W, C) is read as (N, H, W/2, 2C) (a free reshape), and the conv becomes a 3×3 conv of
    2C to 2·C_out channels whose weight places each kernel column where its pair part lands
    (zeros elsewhere). Twice the multiply-adds, at channel counts cuDNN runs well."""
    n, h, w, c = x.shape
    o = weight.shape[0]
    index, inside = _pair_gather(o, c)
    packed = mx.where(inside, mx.take(weight.reshape(-1), index), 0).reshape(2 * o, 3, 3, 2 * c)
    y = mx.conv2d(x.reshape(n, h, w // 2, 2 * c), packed, padding=(1, 1))
    return y.reshape(n, h, w, o)


def column_pair_conv3x3_s2(x: mx.array, weight: mx.array) -> mx.array:
    """A stride-2, padding-1 3×3 conv of an NHWC map of even width, on pairs of columns: output
    column j reads input columns 2j-1, 2j and 2j+1, the second half of pair j-1 and all of pair
    j. So (N, H, W, C) read as (N, H, W/2, 2C) (a free reshape) meets a 3×2 kernel of 2C
    channels at stride (2, 1), padded by one pair on the left only, whose first column is zero
    over the first half of its pair: 4/3 of the multiply-adds, at a channel count cuDNN runs well."""
    n, h, w, c = x.shape
    o = weight.shape[0]
    packed = mx.pad(weight, [(0, 0), (0, 0), (1, 0), (0, 0)]).reshape(o, 3, 2, 2 * c)
    return mx.conv_general(x.reshape(n, h, w // 2, 2 * c), packed, stride=(2, 1), padding=([1, 1], [1, 0]))


# ---- depthwise convolution ---------------------------------------------------------------



# Output columns per thread, by stride: each input row a thread reads serves that many outputs
# (the fastest of 1, 2, 4 and 8 measured on SAM-tiny's shapes).
COLUMNS = {1: 8, 2: 4}
# What the kernel takes (each window and stride is its own compiled kernel): square windows of
# these sizes, these strides on both axes, dilation 1; other depthwise convs run MLX's.
WINDOWS = (3, 5, 7)
# Inputs of at most this many elements: on larger maps cuDNN's depthwise kernels are as fast or
# faster on CUDA (measured: docs/performance-notes.md).
MAX_DEPTHWISE_ELEMENTS = 1 << 23


@lru_cache(maxsize=64)
def _zeros(channels: int, dtype: mx.Dtype) -> mx.array:
    """A bias of zeros for calls without one (one array per size, made once; longer than MLX's
    small pool takes, see MLX_SMALL_POOL_BYTES)."""
    z = mx.zeros((max(channels, MLX_SMALL_POOL_BYTES // dtype.size + 1),), dtype)
    mx.eval(z)
    return z


def _kernel_takes(x: mx.array, weight: mx.array, bias: mx.array | None, stride: Pair, dilation: Pair) -> bool:
    dtype = x.dtype
    return (dtype in FLOATS and weight.dtype == dtype and (bias is None or bias.dtype == dtype)
            and weight.shape[1] == weight.shape[2] and weight.shape[1] in WINDOWS
            and stride[0] == stride[1] and stride[0] in COLUMNS and dilation == (1, 1))


def depthwise_conv2d(x: mx.array, weight: mx.array, bias: mx.array | None = None, *,
                     stride: int | Pair = 1, padding: int | Pair = 0, dilation: int | Pair = 1) -> mx.array:
    """One thread per COLUMNS output columns of one channel, bias added in float32 before the
    one rounding to the output dtype. Geometries the kernel does not take, and mixed dtypes,
    run the definition."""
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    if not _kernel_takes(x, weight, bias, stride, dilation):
        return definition.depthwise_conv2d(x, weight, bias, stride=stride, padding=padding, dilation=dilation)
    n, h, w, c = x.shape
    k, s = weight.shape[1], stride[0]
    oh, ow = _out_size(x, weight, stride, padding, dilation)
    cols = COLUMNS[s]
    template = [("T", x.dtype), ("K", k), ("S", s), ("COLS", cols)]
    bias = _zeros(c, x.dtype) if bias is None else bias
    outs = launch_nhwc(DEPTHWISE, [x, weight, bias], (n, h, w, c, oh, ow, padding[0], padding[1]), template,
                       (n, oh, -(-ow // cols), c), [(n, oh, ow, c)], [x.dtype])
    if outs is None:  # past the launch limits: the definition, which has none
        return definition.depthwise_conv2d(x, weight, bias, stride=stride, padding=padding, dilation=dilation)
    return outs[0]
