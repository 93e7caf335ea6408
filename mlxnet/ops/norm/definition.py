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


def across(x: mx.array, sync: bool) -> mx.array:
    """``x`` summed over the processes when ``sync``."""
    from ...distributed import all_sum

    return all_sum(x) if sync else x


def batch_count(x: mx.array, sync: bool) -> mx.array:
    """Values per channel, over the processes when ``sync``."""
    return across(mx.array(x.size // x.shape[-1], mx.float32), sync)


def statistics_dtype(dtype: mx.Dtype) -> mx.Dtype:
    """float32 for half-precision inputs, else the input's own."""
    return mx.float64 if dtype == mx.float64 else mx.float32


def batch_norm_train(x: mx.array, weight: mx.array, bias: mx.array, *, eps: float = 1e-5,
                     activation: str | None = None, sync: bool = False) -> tuple[mx.array, mx.array, mx.array]:
    """Training-mode BatchNorm over every axis but the last (channels in NHWC), then
    ``activation`` (None or "silu"): (y, the batch's mean, its biased variance), statistics in
    float32 at least (float64 stays float64). ``sync``: the statistics of the batch all the
    processes of :func:`mlxnet.distributed.group` hold together (synchronised BatchNorm)."""
    ct = statistics_dtype(x.dtype)
    xf = x.astype(ct)
    axes = tuple(range(x.ndim - 1))
    count = batch_count(x, sync)
    mean = across(xf.sum(axis=axes), sync) / count
    var = across(mx.square(xf - mean).sum(axis=axes), sync) / count
    z = (xf - mean) * mx.rsqrt(var + eps) * weight.astype(ct) + bias.astype(ct)
    if activation == "silu":
        z = z * mx.sigmoid(z)
    return z.astype(x.dtype), mean, var
