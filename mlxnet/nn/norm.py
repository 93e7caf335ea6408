"""Normalisation layers the model ports need beyond MLX's: SAM's LayerNorm2d and inference-mode
(frozen) BatchNorm with conv folding."""
from __future__ import annotations

from typing import Callable

import mlx.core as mx
import mlx.nn as nn

from ..weights.fold import fold_conv_bn
from .layers import Conv2d, LayerNorm


@mx.compile
def _affine_relu(x: mx.array, scale: mx.array, shift: mx.array) -> mx.array:
    return mx.maximum(x * scale + shift, 0)


def batch_norm_relu(bn: nn.BatchNorm, x: mx.array,
                    regroup: Callable[[mx.array], mx.array] | None = None) -> mx.array:
    """``relu(bn(x))`` for an inference-mode BatchNorm as one fused pass over ``x``: MLX runs the
    layer as four broadcast ops and the ReLU as a fifth. The
    statistics fold into a per-channel scale and shift first, as a folded conv would carry them.

    ``regroup`` (a view that splits and reorders the channel axis) is applied to the result; in
    inference mode it is applied to ``x`` and to the scale and shift instead, so the fused pass
    writes the regrouped layout.
    """
    regroup = regroup or (lambda a: a)
    if bn.training or "running_mean" not in bn:
        return regroup(nn.relu(bn(x)))
    scale = bn.weight * mx.rsqrt(bn.running_var + bn.eps)
    shift = bn.bias - bn.running_mean * scale
    return _affine_relu(regroup(x), regroup(scale.astype(x.dtype)), regroup(shift.astype(x.dtype)))


def batch_norm_act(bn: nn.BatchNorm, x: mx.array, activation: str | None = None) -> mx.array:
    """``activation(bn(x))`` (None or "silu"). In training mode one op,
    :func:`mlxnet.ops.batch_norm_train`, whose backward keeps only ``x``, updating the running
    statistics as MLX's BatchNorm does (momentum ``bn.momentum``, unbiased variance).
    A layer marked ``bn.synchronised = True`` (data-parallel training) normalises with the
    statistics of every process's share of the batch."""
    from .. import ops

    if not bn.training:
        y = bn(x)
        return ops.silu(y) if activation == "silu" else y
    sync = getattr(bn, "synchronised", False)
    if "running_mean" not in bn:
        return ops.batch_norm_train(x, bn.weight, bn.bias, eps=bn.eps, activation=activation, sync=sync)[0]
    y, _, _, bn.running_mean, bn.running_var = ops.batch_norm_train(
        x, bn.weight, bn.bias, bn.running_mean, bn.running_var, eps=bn.eps, activation=activation, sync=sync,
        momentum=bn.momentum)
    return y


class LayerNorm2d(LayerNorm):
    """SAM's LayerNorm2d normalises each pixel over channels; in NHWC that is the last axis, so
    it is :class:`LayerNorm` (the registry's layer_norm op) under SAM's name."""


class FrozenBatchNorm2d(nn.Module):
    """BatchNorm with fixed statistics and affine parameters (torchvision's FrozenBatchNorm2d).

    Same parameter names as PyTorch's BatchNorm2d, so checkpoints load unchanged; nothing is
    trainable, and the layer can be folded into the conv before it (:func:`fuse_conv_bn`).
    """

    def __init__(self, num_features: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = mx.ones((num_features,))
        self.bias = mx.zeros((num_features,))
        self.running_mean = mx.zeros((num_features,))
        self.running_var = mx.ones((num_features,))
        self.freeze()

    def unfreeze(self, *args, **kwargs) -> "FrozenBatchNorm2d":
        return self  # frozen by definition

    def __call__(self, x: mx.array) -> mx.array:
        scale = self.weight * mx.rsqrt(self.running_var + self.eps)
        return (x * scale + (self.bias - self.running_mean * scale)).astype(x.dtype)


def fuse_conv_bn(conv: nn.Conv2d, bn: nn.Module) -> Conv2d:
    """A new conv computing ``bn(conv(x))`` in inference mode (BatchNorm or FrozenBatchNorm2d)."""
    fused = Conv2d(conv.weight.shape[-1] * conv.groups, conv.weight.shape[0], conv.weight.shape[1:3],
                      stride=conv.stride, padding=conv.padding, dilation=conv.dilation,
                      groups=conv.groups, bias=True)
    fused.weight, fused.bias = fold_conv_bn(conv.weight, conv.get("bias"), bn.weight, bn.bias,
                                            bn.running_mean, bn.running_var, bn.eps)
    return fused
