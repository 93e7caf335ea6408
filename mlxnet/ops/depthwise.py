"""Depthwise convolution with a per-channel affine map and an activation after it, NHWC.

``act(conv2d(x, weight, groups=C) · scale + shift)``: the depthwise conv + BatchNorm (+ GELU)
of inverted-residual blocks (TinyViT's MBConv and local convs), with the BatchNorm as its
folded scale and shift (a bias alone is scale 1). The definition is MLX's grouped conv and one
elementwise expression; the GPU face is one kernel (custom_kernels/depthwise.kern), so the
conv's output is written once, instead of written, read and written again by the epilogue.
"""
from __future__ import annotations

import mlx.core as mx

from ..errors import MlxnetError
from .activations import gelu, silu
from .kernel_source import PortableKernel, int_params, nhwc_grid_fits
from .registry import register

ACTIVATIONS = {None: 0, "relu": 1, "gelu": 2, "silu": 3}
DEPTHWISE = PortableKernel("depthwise.kern", "depthwise_conv2d", ["x", "weight", "scale", "shift", "p"], ["out"])
_GROUP = 256


def _pair(v: int | tuple[int, int]) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


def _out_size(x: mx.array, weight: mx.array, stride: tuple[int, int], padding: tuple[int, int],
              scale: mx.array, shift: mx.array, activation: str | None) -> tuple[int, int]:
    if activation not in ACTIVATIONS:
        raise MlxnetError(f"depthwise_conv2d: unknown activation {activation!r}; expected one of "
                          f"{', '.join(str(a) for a in ACTIVATIONS)}")
    c = x.shape[-1]
    if x.ndim != 4 or weight.shape[0] != c or weight.shape[-1] != 1 or weight.ndim != 4:
        raise MlxnetError(f"depthwise_conv2d: input {tuple(x.shape)} (NHWC) needs a (C, KH, KW, 1) "
                          f"weight with C = {c}, got {tuple(weight.shape)}")
    if scale.shape != (c,) or shift.shape != (c,):
        raise MlxnetError(f"depthwise_conv2d: scale and shift must be ({c},), got "
                          f"{tuple(scale.shape)} and {tuple(shift.shape)}")
    oh = (x.shape[1] + 2 * padding[0] - weight.shape[1]) // stride[0] + 1
    ow = (x.shape[2] + 2 * padding[1] - weight.shape[2]) // stride[1] + 1
    return oh, ow


def _kernel(x: mx.array, weight: mx.array, scale: mx.array, shift: mx.array, *,
            stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0,
            activation: str | None = None) -> mx.array:
    stride, padding = _pair(stride), _pair(padding)
    oh, ow = _out_size(x, weight, stride, padding, scale, shift, activation)
    n, h, w, c = x.shape
    if not nhwc_grid_fits(n, oh, max(x.size, n * oh * ow * c), _GROUP):
        return depthwise_conv2d.__wrapped__(x, weight, scale, shift, stride=stride, padding=padding,
                                            activation=activation)
    params = int_params((n, h, w, c, oh, ow, *stride, *padding))
    (out,) = DEPTHWISE([x, weight, scale, shift, params],
                       template=[("T", x.dtype), ("KH", weight.shape[1]), ("KW", weight.shape[2]),
                                 ("ACT", ACTIVATIONS[activation])],
                       grid=(c * ow, oh, n), threadgroup=(_GROUP, 1, 1),
                       output_shapes=[(n, oh, ow, c)], output_dtypes=[x.dtype])
    return out


def _example() -> tuple[tuple, dict]:
    c = 24
    return ((mx.random.normal((2, 11, 9, c)), mx.random.normal((c, 3, 3, 1)),
             mx.random.uniform(0.5, 1.5, (c,)), mx.random.normal((c,))),
            {"stride": 1, "padding": 1, "activation": "gelu"})


def _edge_examples() -> list[tuple[tuple, dict]]:
    def case(shape, k, **kw):
        c = shape[-1]
        return ((mx.random.normal(shape), mx.random.normal((c, k, k, 1)), mx.random.uniform(0.5, 1.5, (c,)),
                 mx.random.normal((c,))), kw)
    return [case((1, 5, 6, 3), 3, stride=2, padding=1, activation="silu"),
            case((2, 4, 4, 2), 3, stride=1, padding=0, activation="relu"),
            case((1, 7, 5, 5), 5, stride=(2, 1), padding=(2, 1), activation=None),
            case((0, 4, 4, 2), 3, stride=1, padding=1, activation="gelu")]


@register("depthwise_conv2d", kernel=_kernel, sources=(DEPTHWISE,), example=_example,
          edge_examples=_edge_examples)
def depthwise_conv2d(x: mx.array, weight: mx.array, scale: mx.array, shift: mx.array, *,
                     stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0,
                     activation: str | None = None) -> mx.array:
    """``activation(conv2d(x, weight, groups=C) · scale + shift)`` for NHWC ``x`` and a
    (C, KH, KW, 1) ``weight``; ``scale``/``shift`` are per channel, ``activation`` one of None,
    "relu", "gelu" (erf form), "silu". The epilogue runs in float32."""
    stride, padding = _pair(stride), _pair(padding)
    _out_size(x, weight, stride, padding, scale, shift, activation)
    y = mx.conv2d(x, weight.astype(x.dtype), stride=stride, padding=padding, groups=x.shape[-1])
    y = y.astype(mx.float32) * scale.astype(mx.float32) + shift.astype(mx.float32)
    if activation == "relu":
        y = mx.maximum(y, 0)
    elif activation == "gelu":
        y = gelu(y)
    elif activation == "silu":
        y = silu(y)
    return y.astype(x.dtype)
