"""Normalisation ops."""
from __future__ import annotations

import mlx.core as mx

from ..errors import MlxnetError
from .args import shape_of
from .registry import DEFINITION_VJP, register

def _layer_norm_fast(x: mx.array, weight: mx.array | None = None, bias: mx.array | None = None,
                     *, eps: float = 1e-5) -> mx.array:
    # MLX's fused layer norm (float32 statistics, as the definition): measured faster on the
    # GPU than mlxnet's own row kernel, which it replaced (SAM-tiny's encoder 8.7 → 7.6 ms, H200).
    return mx.fast.layer_norm(x, weight, bias, eps)


def _layer_norm_example() -> tuple[tuple, dict]:
    x = mx.random.normal((2, 5, 7, 96))
    return (x, mx.random.normal((96,)), mx.random.normal((96,))), {"eps": 1e-6}


def _layer_norm_edges() -> list[tuple[tuple, dict]]:
    tiny = mx.array([[1.0, -2.0, 0.5]])
    return [((tiny, mx.ones((3,)), mx.zeros((3,))), {}), ((tiny,), {}),
            ((mx.zeros((0, 3)), mx.ones((3,)), mx.zeros((3,))), {})]


def _layer_norm_check(x: mx.array, weight: mx.array | None = None, bias: mx.array | None = None,
                      *, eps: float = 1e-5) -> tuple:
    if not isinstance(x, mx.array) or x.ndim < 1:
        raise MlxnetError(f"layer_norm: expected an array of at least 1 dimension, got "
                          f"{shape_of(x)}")
    for what, a in (("weight", weight), ("bias", bias)):
        if a is not None and (not isinstance(a, mx.array) or a.shape != x.shape[-1:]):
            raise MlxnetError(f"layer_norm: {what} must have shape ({x.shape[-1]},) for an input of shape "
                              f"{tuple(x.shape)}, got {shape_of(a)}")
    if not isinstance(eps, (int, float)) or eps < 0:
        raise MlxnetError(f"layer_norm: eps must be a number >= 0, got {eps!r}")
    return (x, weight, bias), {"eps": float(eps)}


# MLX 0.32's CUDA layer norm has wrong gradients for some widths (docs/performance-notes.md,
# "Known MLX defects"): its forward, with the definition's gradient.
@register("layer_norm", kernel=_layer_norm_fast, kernel_vjp=DEFINITION_VJP, check=_layer_norm_check,
          example=_layer_norm_example, edge_examples=_layer_norm_edges)
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
