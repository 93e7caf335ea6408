"""batch_norm_train's face where no kernel applies (a synchronised layer, a dtype or size the
kernels do not take, the CPU without mlxnet's primitives): the definition's forward with the
layer's analytic gradient, so that the backward keeps only the input and the statistics.
Autodiff of the definition keeps every elementwise intermediate of the normalisation and the
activation (four maps the size of the input per layer, where training memory goes), and runs a
dozen kernels more."""
from __future__ import annotations

import mlx.core as mx

from . import definition


def batch_norm_train(x: mx.array, weight: mx.array, bias: mx.array, running_mean: mx.array | None = None,
                     running_var: mx.array | None = None, *, eps: float = 1e-5, activation: str | None = None,
                     sync: bool = False, momentum: float = 0.1) -> tuple[mx.array, ...]:
    @mx.custom_function
    def forward(x: mx.array, weight: mx.array, bias: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        return definition.batch_norm_train(x, weight, bias, eps=eps, activation=activation, sync=sync)

    @forward.vjp
    def backward(primals: tuple, cotangents: tuple, outputs: tuple) -> tuple[mx.array, mx.array, mx.array]:
        return analytic_vjp(primals, cotangents, outputs, eps=eps, activation=activation, sync=sync)

    return with_running(forward(x, weight, bias), x, running_mean, running_var, sync=sync, momentum=momentum)


def with_running(outputs: tuple, x: mx.array, running_mean: mx.array | None, running_var: mx.array | None,
                 *, sync: bool, momentum: float) -> tuple[mx.array, ...]:
    """(y, mean, var), followed by the running statistics' update where they are given."""
    if running_mean is None:
        return outputs
    _, mean, var = outputs
    return (*outputs, *definition.running_update(running_mean, running_var, mean, var, x, sync=sync,
                                                 momentum=momentum))


def analytic_vjp(primals: tuple, cotangents: tuple, outputs: tuple, *, eps: float, activation: str | None,
                 sync: bool) -> tuple[mx.array, mx.array, mx.array]:
    """The gradients of (x, weight, bias) from those of (y, mean, var), in MLX ops; zeros for
    running statistics among the primals (their update passes no gradient)."""
    x, weight, bias = primals[:3]
    dy, d_mean, d_var = cotangents[:3]
    _, mean, var = outputs[:3]
    axes = tuple(range(x.ndim - 1))
    n = definition.batch_count(x, sync)
    ct = definition.statistics_dtype(x.dtype)
    w = weight.astype(ct)
    invstd = mx.rsqrt(var + eps)
    centred = x.astype(ct) - mean
    xhat = centred * invstd
    dz = dy.astype(ct)
    if activation == "silu":  # the activation recomputed from the input, not kept
        z = xhat * w + bias.astype(ct)
        s = mx.sigmoid(z)
        dz = dz * s * (1 + z * (1 - s))
    d_bias = dz.sum(axis=axes)
    d_weight = (dz * xhat).sum(axis=axes)
    # x's gradient reads the sums over every process's batch (synchronised); the scale's and
    # shift's are this process's share, which the trainer sums over the processes.
    all_bias, all_weight = definition.across(d_bias, sync), definition.across(d_weight, sync)
    dx = (w * invstd) * (dz - all_bias / n - xhat * (all_weight / n))
    # The statistics' own cotangents (zero where only y is differentiated), from every process.
    dx = dx + definition.across(d_mean, sync) / n + centred * (2 * definition.across(d_var, sync) / n)
    return (dx.astype(x.dtype), d_weight.astype(weight.dtype), d_bias.astype(bias.dtype),
            *(mx.zeros_like(r) for r in primals[3:]))
