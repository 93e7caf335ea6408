"""Normalisation ops."""
from __future__ import annotations

import mlx.core as mx

from .kernel_source import PortableKernel
from .registry import register

_LAYER_NORM = PortableKernel("layer_norm.kern", "layer_norm_rows",
                             ["x", "weight", "bias", "eps"], ["out"])


def _layer_norm_kernel(x: mx.array, weight: mx.array | None = None, bias: mx.array | None = None,
                       *, eps: float = 1e-5) -> mx.array:
    channels = x.shape[-1]
    rows = x.size // channels
    weight = mx.ones((channels,), x.dtype) if weight is None else weight.astype(x.dtype)
    bias = mx.zeros((channels,), x.dtype) if bias is None else bias.astype(x.dtype)
    group = 256 if channels >= 256 else max(32, 1 << (channels - 1).bit_length())
    (out,) = _LAYER_NORM(
        [x.reshape(rows, channels), weight, bias, mx.array([eps], mx.float32)],
        template=[("T", x.dtype), ("C", channels), ("TG", group)],
        grid=(rows * group, 1, 1), threadgroup=(group, 1, 1),
        output_shapes=[(rows, channels)], output_dtypes=[x.dtype],
    )
    return out.reshape(x.shape)


def _layer_norm_example() -> tuple[tuple, dict]:
    x = mx.random.normal((2, 5, 7, 96))
    return (x, mx.random.normal((96,)), mx.random.normal((96,))), {"eps": 1e-6}


def _layer_norm_edges() -> list[tuple[tuple, dict]]:
    tiny = mx.array([[1.0, -2.0, 0.5]])
    return [((tiny, mx.ones((3,)), mx.zeros((3,))), {}), ((tiny,), {}),
            ((mx.zeros((0, 3)), mx.ones((3,)), mx.zeros((3,))), {})]


@register("layer_norm", kernel=_layer_norm_kernel, sources=(_LAYER_NORM,),
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
