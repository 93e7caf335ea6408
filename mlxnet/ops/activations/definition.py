"""The activations' and softmax's definitions: MLX's own ``sigmoid``, ``erf``, ``tanh`` and
``exp``, computed in float32."""
from __future__ import annotations

from typing import Callable

import mlx.core as mx

_SQRT_HALF = 0.70710678118654752
_TANH_C = 0.7978845608028654  # sqrt(2 / pi)
_TANH_K = 0.044715
_TANH_FLAT = 1e4  # tanh of the argument is ±1 from |x| ≈ 10: clipping x keeps x³ finite


def _tanh_arg(x: mx.array) -> mx.array:
    c = mx.clip(x, -_TANH_FLAT, _TANH_FLAT)
    return _TANH_C * (c + _TANH_K * c * c * c)


def _in_float32(f: Callable[[mx.array], mx.array], x: mx.array) -> mx.array:
    return f(x.astype(mx.float32)).astype(x.dtype)


def silu(x: mx.array, bias: mx.array | None = None) -> mx.array:
    """x · sigmoid(x) (YOLOv8's activation) of ``x + bias`` (bias: per channel, optional),
    computed in float32."""
    z = x if bias is None else x + bias
    return _in_float32(lambda v: v * mx.sigmoid(v), z).astype(x.dtype)


def sigmoid(x: mx.array) -> mx.array:
    """1 / (1 + exp(-x)), computed in float32."""
    return _in_float32(mx.sigmoid, x)


def gelu(x: mx.array, *, approximate: str = "none") -> mx.array:
    """GELU, computed in float32: the erf form (PyTorch's default) or, with
    ``approximate="tanh"``, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))."""
    if approximate == "tanh":
        return _in_float32(lambda v: 0.5 * v * (1.0 + mx.tanh(_tanh_arg(v))), x)
    return _in_float32(lambda v: 0.5 * v * (1.0 + mx.erf(v * _SQRT_HALF)), x)


def softmax(x: mx.array, *, axis: int = -1, dtype: mx.Dtype | None = None) -> mx.array:
    """Softmax along ``axis``, computed in float32 (after casting ``x`` to ``dtype``, if given)."""
    if x.shape[axis] == 0:
        return x
    xf = x.astype(mx.float32)
    e = mx.exp(xf - mx.stop_gradient(xf.max(axis=axis, keepdims=True)))
    return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype)


def bias_act(x: mx.array, bias: mx.array, residual: mx.array | None = None, *,
             activation: str | None = "relu") -> mx.array:
    """A convolution's epilogue: ``activation`` (``"relu"`` or None) of ``x + bias`` (per
    channel, the last axis), plus ``residual`` (x's shape) before the activation."""
    y = x + bias
    if residual is not None:
        y = y + residual
    return mx.maximum(y, 0) if activation == "relu" else y
