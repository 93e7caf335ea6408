"""The definition of scaled dot-product attention: scores, softmax and the weighted sum in
float32."""
from __future__ import annotations

import mlx.core as mx

from ..activations import softmax


def scaled_dot_product_attention(q: mx.array, k: mx.array, v: mx.array, bias: mx.array | None = None,
                                 *, scale: float | None = None, dropout_p: float = 0.0,
                                 key: mx.array | None = None) -> mx.array:
    """softmax(q·kᵀ·scale + bias)·v over (..., tokens, dims); bias is added to the scores.

    Scores, softmax and the weighted sum run in float32 whatever the inputs' dtype (half
    precision scores lose the small differences softmax amplifies), as PyTorch's fused kernels
    accumulate. ``dropout_p`` drops attention weights (training; scaled by 1/(1 − p)), drawn
    from ``key`` or MLX's global generator."""
    scores = (q.astype(mx.float32) * scale) @ k.astype(mx.float32).swapaxes(-1, -2)
    if bias is not None:
        scores = scores + bias.astype(mx.float32)
    weights = softmax(scores, axis=-1)
    if dropout_p:
        keep = mx.random.bernoulli(1.0 - dropout_p, weights.shape, key=key)
        weights = mx.where(keep, weights / (1.0 - dropout_p), 0.0)
    return (weights @ v.astype(mx.float32)).astype(v.dtype)
