"""BatchNorm folding arithmetic, shared by ``mlxnet convert --fold-bn`` and the layers' fuse.

Folded the way PyTorch's ``fuse_conv_bn_weights`` does it (so a folded mlxnet model matches a
model PyTorch code fused, e.g. ultralytics' predictor): w' = w·γ/σ, b' = (b − μ)/σ·γ + β with
σ = sqrt(var + eps); computed in float32, returned in the weight's dtype.
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np


def fold_conv_bn(weight: mx.array, bias: mx.array | None, gamma: mx.array, beta: mx.array,
                 mean: mx.array, var: mx.array, eps: float) -> tuple[mx.array, mx.array]:
    """(weight, bias) of a conv/linear (output channels on axis 0) with the BN after it folded in."""
    f32 = lambda a: np.asarray(a.astype(mx.float32))  # noqa: E731
    g, b, mu, v = f32(gamma), f32(beta), f32(mean), f32(var)
    inv_std = np.float32(1.0) / np.sqrt(v + np.float32(eps))
    w = f32(weight) * (g * inv_std).reshape((-1,) + (1,) * (weight.ndim - 1))
    b0 = f32(bias) if bias is not None else np.zeros_like(mu)
    return mx.array(w).astype(weight.dtype), mx.array((b0 - mu) * inv_std * g + b).astype(weight.dtype)
