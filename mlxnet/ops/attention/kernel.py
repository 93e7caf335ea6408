"""The GPU face of scaled dot-product attention: MLX's fused
``mx.fast.scaled_dot_product_attention`` where it applies, else the definition."""
from __future__ import annotations

import mlx.core as mx

from . import definition


def scaled_dot_product_attention(q: mx.array, k: mx.array, v: mx.array, bias: mx.array | None = None, *,
                                 scale: float, dropout_p: float = 0.0, key: mx.array | None = None) -> mx.array:
    four_d = q.ndim == k.ndim == v.ndim == 4 and q.shape[:2] == k.shape[:2] == v.shape[:2]
    if dropout_p or not four_d:  # MLX's fused attention: (B, heads, tokens, dims), no dropout
        return definition.scaled_dot_product_attention(q, k, v, bias, scale=scale,
                                                       dropout_p=dropout_p, key=key)
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=bias)
