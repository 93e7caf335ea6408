"""conv2d's definition: ``mx.conv2d``, plus bias, then the activation; depthwise_conv2d is conv2d
with groups = channels."""
from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..activations import silu
from ...device import backend
from ..core.kernel_source import MLX_SMALL_POOL_BYTES
from .check import Pair, _check_activation, _check_groups, _out_size, _pair


def conv2d(x: mx.array, weight: mx.array, bias: mx.array | None = None, residual: mx.array | None = None, *,
           stride: int | Pair = 1, padding: int | Pair | str = 0, dilation: int | Pair = 1,
           groups: int = 1, activation: str | None = None) -> mx.array:
    """Conv2d on NHWC input (or one HWC sample) with an OHWI weight (``mx.conv2d`` semantics,
    plus bias; PyTorch's argument rules, ``padding="same"`` / ``"valid"`` included), then
    ``activation`` (None, ``"silu"`` or ``"relu"``) of conv + bias + ``residual`` (the
    output's shape; a ResNet block's shortcut)."""
    _check_groups(x, weight, groups)
    _check_activation(activation)
    y = mlx_conv2d(x, weight, stride=_pair(stride), padding=_pair(padding), dilation=_pair(dilation),
                   groups=groups)
    return epilogue(y, bias, residual, activation)


def mlx_conv2d(x: mx.array, weight: mx.array, *, stride: Pair, padding: Pair, dilation: Pair,
               groups: int = 1) -> mx.array:
    """``mx.conv2d``, with operands of at most 8 bytes widened on CUDA: MLX's CUDA back end
    serves such arrays (and its internal copies of them) from a small pool aligned to 8 bytes,
    while it caches cuDNN plans by the alignment of the arrays it was given, so a plan built for
    an aligned copy can run on a misaligned one (CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER,
    intermittently; docs/performance-notes.md, "Known MLX defects"). Zero channels added to
    both sides of a dense conv leave its output (cropped) and gradients unchanged."""
    out_bytes = x.shape[0] * weight.shape[0] * x.dtype.size * np.prod(_out_size(x, weight, stride, padding, dilation))
    if backend() != "cuda" or groups != 1 or min(x.nbytes, weight.nbytes, out_bytes) > MLX_SMALL_POOL_BYTES:
        return mx.conv2d(x, weight, stride=stride, padding=padding, dilation=dilation, groups=groups)
    extra = MLX_SMALL_POOL_BYTES // x.dtype.size
    x = mx.pad(x, [(0, 0), (0, 0), (0, 0), (0, extra)])
    wide = mx.pad(weight, [(0, extra), (0, 0), (0, 0), (0, extra)])
    return mx.conv2d(x, wide, stride=stride, padding=padding, dilation=dilation)[..., :weight.shape[0]]



def epilogue(y: mx.array, bias: mx.array | None, residual: mx.array | None, activation: str | None) -> mx.array:
    """``activation`` of y + bias + residual (each optional), as MLX ops."""
    y = y if bias is None else y + bias
    y = y if residual is None else y + residual
    if activation == "silu":
        return silu(y)
    return mx.maximum(y, 0) if activation == "relu" else y


def depthwise_conv2d(x: mx.array, weight: mx.array, bias: mx.array | None = None, *,
                     stride: int | Pair = 1, padding: int | Pair = 0, dilation: int | Pair = 1) -> mx.array:
    """Each channel of NHWC ``x`` convolved with its own (KH, KW) filter: ``weight`` is
    (C, KH, KW, 1), conv2d with groups = C."""
    return conv2d(x, weight, bias, stride=stride, padding=padding, dilation=dilation, groups=x.shape[-1])
