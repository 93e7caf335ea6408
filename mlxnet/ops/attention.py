"""Softmax and scaled dot-product attention.

The CPU fast path of softmax uses the arithmetic-only exp of :mod:`.activations` (MLX's CPU
exp is scalar, and a ViT's softmax runs over millions of scores). On GPUs the op's GPU path
is MLX's fused built-in (``mx.softmax`` / ``mx.fast.scaled_dot_product_attention``), which is
already the fastest there.
"""
from __future__ import annotations

import mlx.core as mx

from .activations import _exp_below
from .registry import register


def _softmax_last(x: mx.array) -> mx.array:
    e = _exp_below(x, mx.stop_gradient(x.max(axis=-1, keepdims=True)))
    return e / e.sum(axis=-1, keepdims=True)


def _softmax_builtin(x: mx.array, *, axis: int = -1) -> mx.array:
    return mx.softmax(x.astype(mx.float32), axis=axis).astype(x.dtype)


def _softmax_example() -> tuple[tuple, dict]:
    return (mx.random.normal((3, 5, 37)) * 4,), {}


def _softmax_cpu(x: mx.array, *, axis: int = -1) -> mx.array:
    xf = mx.moveaxis(x.astype(mx.float32), axis, -1)
    return mx.moveaxis(_softmax_last(xf), -1, axis).astype(x.dtype)


@register("softmax", cpu=_softmax_cpu, kernel=_softmax_builtin, example=_softmax_example)
def softmax(x: mx.array, *, axis: int = -1) -> mx.array:
    """Softmax along ``axis``, computed in float32."""
    xf = x.astype(mx.float32)
    e = mx.exp(xf - mx.stop_gradient(xf.max(axis=axis, keepdims=True)))
    return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype)


def _sdpa_builtin(q: mx.array, k: mx.array, v: mx.array, bias: mx.array | None = None, *,
                  scale: float) -> mx.array:
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=bias)


def _sdpa_example() -> tuple[tuple, dict]:
    q, k, v = (mx.random.normal((2, 3, 10, 16)) for _ in range(3))
    return (q, k, v, mx.random.normal((1, 3, 10, 10))), {"scale": 0.25}


@register("scaled_dot_product_attention", kernel=_sdpa_builtin, example=_sdpa_example)
def scaled_dot_product_attention(q: mx.array, k: mx.array, v: mx.array, bias: mx.array | None = None,
                                 *, scale: float) -> mx.array:
    """softmax(q·kᵀ·scale + bias)·v over (B, heads, tokens, dims); bias is added to the scores."""
    scores = (q * scale) @ k.swapaxes(-1, -2)
    if bias is not None:
        scores = scores + bias
    return softmax(scores.astype(mx.float32), axis=-1).astype(v.dtype) @ v
