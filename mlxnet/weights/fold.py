"""BatchNorm folding arithmetic, shared by ``mlxnet convert --fold-bn`` and the layers' fuse.

Folded the way PyTorch's ``fuse_conv_bn_weights`` does it (so a folded mlxnet model matches a
model PyTorch code fused, e.g. ultralytics' predictor): w' = w·γ/σ, b' = (b − μ)/σ·γ + β with
σ = sqrt(var + eps); computed in float32, returned in the weight's dtype. MLX ops, left lazy:
a network's folds are evaluated together with whatever reads them first, where a host copy of
every array would wait on the device once per array (a trainer folds its weights every epoch).
"""
from __future__ import annotations

import mlx.core as mx


def fold_conv_bn(weight: mx.array, bias: mx.array | None, gamma: mx.array, beta: mx.array,
                 mean: mx.array, var: mx.array, eps: float) -> tuple[mx.array, mx.array]:
    """(weight, bias) of a conv/linear (output channels on axis 0) with the BN after it folded in."""
    g, b, mu, v = (a.astype(mx.float32) for a in (gamma, beta, mean, var))
    # 1 / sqrt rather than rsqrt: PyTorch's rounding, step for step
    inv_std = 1.0 / mx.sqrt(v + mx.array(eps, mx.float32))
    w = weight.astype(mx.float32) * (g * inv_std).reshape((-1,) + (1,) * (weight.ndim - 1))
    b0 = bias.astype(mx.float32) if bias is not None else mx.zeros_like(mu)
    return w.astype(weight.dtype), ((b0 - mu) * inv_std * g + b).astype(weight.dtype)
