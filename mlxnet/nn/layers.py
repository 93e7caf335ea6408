"""Basic layers routed through the op registry."""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from .. import ops


class LayerNorm(nn.Module):
    """LayerNorm over the last axis; in NHWC this is also SAM's LayerNorm2d (channels)."""

    def __init__(self, dims: int, eps: float = 1e-5, affine: bool = True) -> None:
        super().__init__()
        self.eps = eps
        if affine:
            self.weight = mx.ones((dims,))
            self.bias = mx.zeros((dims,))

    def __call__(self, x: mx.array) -> mx.array:
        return ops.layer_norm(x, self.get("weight"), self.get("bias"), eps=self.eps)


class GELU(nn.Module):
    """GELU (erf form) through the registry: fast CPU reference, GPU kernel."""

    def __call__(self, x: mx.array) -> mx.array:
        return ops.gelu(x)


class SiLU(nn.Module):
    """SiLU through the registry: fast CPU reference, GPU kernel."""

    def __call__(self, x: mx.array) -> mx.array:
        return ops.silu(x)


class Sigmoid(nn.Module):
    """Sigmoid through the registry (MLX's CPU sigmoid is a scalar loop)."""

    def __call__(self, x: mx.array) -> mx.array:
        return ops.sigmoid(x)


class Conv2d(nn.Conv2d):
    """``mlx.nn.Conv2d`` (same parameters, init and keys) computed by mlxnet's conv2d op, which
    takes faster formulations for 1×1 and depthwise convolutions; ``activation`` and
    ``residual`` (added before it) make the op's epilogue one pass where it can."""

    def __call__(self, x: mx.array, *, activation: str | None = None,
                 residual: mx.array | None = None) -> mx.array:
        return ops.conv2d(x, self.weight, self.get("bias"), residual, stride=self.stride, padding=self.padding,
                          dilation=self.dilation, groups=self.groups, activation=activation)
