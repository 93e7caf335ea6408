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


def batch_norm_train(x: mx.array, weight: mx.array, bias: mx.array, running_mean: mx.array | None = None,
                     running_var: mx.array | None = None, *, eps: float = 1e-5, activation: str | None = None,
                     sync: bool = False, momentum: float = 0.1) -> tuple[mx.array, ...]:
    """Training-mode BatchNorm over every axis but the last (channels in NHWC), then
    ``activation`` (None or "silu"): (y, the batch's mean, its biased variance), statistics in
    float32 at least (float64 stays float64). ``sync``: the statistics of the batch all the
    processes of :func:`mlxnet.distributed.group` hold together (synchronised BatchNorm).

    With ``running_mean`` and ``running_var``, also their updates as PyTorch's and MLX's
    BatchNorm make them (:func:`running_update`): (y, mean, var, new running mean, new running
    variance)."""
    ct = statistics_dtype(x.dtype)
    xf = x.astype(ct)
    axes = tuple(range(x.ndim - 1))
    count = batch_count(x, sync)
    mean = across(xf.sum(axis=axes), sync) / count
    var = across(mx.square(xf - mean).sum(axis=axes), sync) / count
    z = (xf - mean) * mx.rsqrt(var + eps) * weight.astype(ct) + bias.astype(ct)
    if activation == "silu":
        z = z * mx.sigmoid(z)
    if running_mean is None:
        return z.astype(x.dtype), mean, var
    return (z.astype(x.dtype), mean, var,
            *running_update(running_mean, running_var, mean, var, x, sync=sync, momentum=momentum))


def running_update(running_mean: mx.array, running_var: mx.array, mean: mx.array, var: mx.array, x: mx.array,
                   *, sync: bool, momentum: float) -> tuple[mx.array, mx.array]:
    """The running statistics after a batch: ``(1 - momentum)`` of the old plus ``momentum`` of
    the batch's mean and unbiased variance, in the running statistics' dtype; no gradient flows
    through them."""
    n = batch_count(x, sync) if sync else x.size // x.shape[-1]
    new_mean = (1 - momentum) * running_mean + momentum * mean
    new_var = (1 - momentum) * running_var + momentum * var * (n / (n - 1))
    return (mx.stop_gradient(new_mean.astype(running_mean.dtype)),
            mx.stop_gradient(new_var.astype(running_var.dtype)))
