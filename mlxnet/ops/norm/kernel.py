"""layer_norm's GPU face: MLX's fused ``mx.fast.layer_norm``."""
from __future__ import annotations

import mlx.core as mx


def layer_norm(x: mx.array, weight: mx.array | None = None, bias: mx.array | None = None,
               *, eps: float = 1e-5) -> mx.array:
    # MLX's fused layer norm (float32 statistics, as the definition): measured faster on the
    # GPU than mlxnet's own row kernel, which it replaced (SAM-tiny's encoder 8.7 → 7.6 ms, H200).
    return mx.fast.layer_norm(x, weight, bias, eps)
