"""layer_norm's definition: normalisation over the last axis, statistics in float32."""
from __future__ import annotations

import mlx.core as mx


def layer_norm(x: mx.array, weight: mx.array | None = None, bias: mx.array | None = None,
               *, eps: float = 1e-5) -> mx.array:
    """Normalise over the last axis (channels in NHWC), statistics in float32."""
    xf = x.astype(mx.float32)
    mean = xf.mean(axis=-1, keepdims=True)
    var = mx.square(xf - mean).mean(axis=-1, keepdims=True)
    y = (xf - mean) * mx.rsqrt(var + eps)
    if weight is not None:
        y = y * weight.astype(mx.float32)
    if bias is not None:
        y = y + bias.astype(mx.float32)
    return y.astype(x.dtype)
