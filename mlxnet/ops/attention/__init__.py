"""Scaled dot-product attention (softmax is an activation: :mod:`..activations`).

On GPUs the op runs MLX's fused ``mx.fast.scaled_dot_product_attention`` (:mod:`.kernel`),
already the fastest there; on the CPU its definition (whose softmax takes the CPU fast path) in
bands of a leading axis on every core (:mod:`.cpu`).
"""
from __future__ import annotations

import mlx.core as mx

from ..core.registry import register
from . import check, cpu, definition, kernel


def _example() -> tuple[tuple, dict]:
    q, k, v = (mx.random.normal((2, 3, 10, 16)) for _ in range(3))
    return (q, k, v, mx.random.normal((1, 3, 10, 10))), {"scale": 0.25}


scaled_dot_product_attention = register(
    "scaled_dot_product_attention", cpu=cpu.scaled_dot_product_attention, kernel=kernel.scaled_dot_product_attention,
    check=check.scaled_dot_product_attention, example=_example)(definition.scaled_dot_product_attention)

__all__ = ["scaled_dot_product_attention"]
