"""layer_norm's GPU face: MLX's fused ``mx.fast.layer_norm``. batch_norm_train's: six portable
kernels (custom_kernels/batch_norm.kern), three each way, where MLX's ops take a dozen passes
over the input per layer and keep float32 copies of it; a synchronised layer, or a dtype or size
the kernels do not take, goes through the lean face (:mod:`.lean`)."""
from __future__ import annotations

import mlx.core as mx

from ...dtypes import FLOATS
from ..core.kernel_source import PortableKernel, float_params, int_params
from . import lean

BN_X, BN_Y = 32, 8  # the reductions' group shape: the kernel file's BN_X, BN_Y
GROUP = 256  # threads per group of the per-channel and per-element kernels
MAX_PARTIALS = 512  # partial statistics per channel (groups along the rows)
ROWS_PER_THREAD = 16  # at least, before another group of rows is added

BN_STATS = PortableKernel("batch_norm.kern", "bn_stats", ["x", "p"], ["part"])
BN_FINISH = PortableKernel("batch_norm.kern", "bn_finish",
                           ["part", "weight", "bias", "running_mean", "running_var", "consts", "p"],
                           ["mean", "var", "folded", "new_mean", "new_var"])
BN_APPLY = PortableKernel("batch_norm.kern", "bn_apply", ["x", "folded", "p"], ["y"])
BN_GRAD_SUMS = PortableKernel("batch_norm.kern", "bn_grad_sums",
                              ["dy", "x", "mean", "var", "weight", "bias", "eps", "p"], ["part"])
BN_GRAD_FINISH = PortableKernel("batch_norm.kern", "bn_grad_finish",
                                ["part", "var", "weight", "d_mean", "d_var", "eps", "p"], ["d_weight", "d_bias", "coef"])
BN_GRAD_INPUT = PortableKernel("batch_norm.kern", "bn_grad_input",
                               ["dy", "x", "mean", "var", "weight", "bias", "coef", "eps", "p"], ["dx"])
BATCH_NORM_KERNELS = (BN_STATS, BN_FINISH, BN_APPLY, BN_GRAD_SUMS, BN_GRAD_FINISH, BN_GRAD_INPUT)


def layer_norm(x: mx.array, weight: mx.array | None = None, bias: mx.array | None = None,
               *, eps: float = 1e-5) -> mx.array:
    # MLX's fused layer norm (float32 statistics, as the definition): measured faster on the
    # GPU than mlxnet's own row kernel, which it replaced (SAM-tiny's encoder 8.7 → 7.6 ms, H200).
    return mx.fast.layer_norm(x, weight, bias, eps)


def _kernels_take(x: mx.array, weight: mx.array, bias: mx.array, sync: bool, running: tuple = ()) -> bool:
    return (not sync and x.dtype in FLOATS and weight.dtype in FLOATS and bias.dtype == weight.dtype
            and all(r.dtype in FLOATS and r.dtype == running[0].dtype for r in running)
            and 0 < x.size < 2**31 - GROUP)


def _reduction_grid(rows: int, channels: int) -> tuple[tuple[int, int, int], int]:
    """The reductions' grid and its number of groups along the rows (partial statistics per
    channel): enough threads to fill a GPU, each reading at least ROWS_PER_THREAD rows, at
    most MAX_PARTIALS; whole groups along both axes."""
    g = max(1, min(MAX_PARTIALS, rows // (BN_Y * ROWS_PER_THREAD)))
    return (-(-channels // BN_X) * BN_X, BN_Y * g, 1), g


def _template(x: mx.array, weight: mx.array, activation: str | None) -> list:
    return [("T", x.dtype), ("W", weight.dtype), ("SILU", int(activation == "silu"))]


def batch_norm_train(x: mx.array, weight: mx.array, bias: mx.array, running_mean: mx.array | None = None,
                     running_var: mx.array | None = None, *, eps: float = 1e-5, activation: str | None = None,
                     sync: bool = False, momentum: float = 0.1) -> tuple[mx.array, ...]:
    running = () if running_mean is None else (running_mean, running_var)
    if not _kernels_take(x, weight, bias, sync, running):
        return lean.batch_norm_train(x, weight, bias, running_mean, running_var, eps=eps, activation=activation,
                                     sync=sync, momentum=momentum)
    c = x.shape[-1]
    rows = x.size // c
    template = _template(x, weight, activation)
    grid, g = _reduction_grid(rows, c)
    (part,) = BN_STATS([x, int_params((rows, c, grid[1]))], template=template, grid=grid,
                       threadgroup=(BN_X, BN_Y, 1), output_shapes=[(3, g, c)], output_dtypes=[mx.float32])
    # Without running statistics the kernel reads none (weight stands in) and writes nothing.
    r_dtype = running[0].dtype if running else mx.float32
    mean, var, folded, new_mean, new_var = BN_FINISH(
        [part, weight, bias, *(running or (weight, weight)), float_params((eps, momentum)), int_params((g, c))],
        template=template + [("R", r_dtype), ("RUNNING", int(bool(running)))], grid=(c, 1, 1),
        threadgroup=(min(GROUP, c), 1, 1), output_shapes=[(c,), (c,), (2, c), (c,), (c,)],
        output_dtypes=[mx.float32] * 3 + [r_dtype] * 2)
    (y,) = BN_APPLY([x, folded, int_params((x.size, c))], template=template, grid=(x.size, 1, 1),
                    threadgroup=(GROUP, 1, 1), output_shapes=[x.shape], output_dtypes=[x.dtype])
    return (y, mean, var, new_mean, new_var) if running else (y, mean, var)


def batch_norm_train_vjp(primals: list, cotangents: tuple, outputs: tuple, *, eps: float = 1e-5,
                         activation: str | None = None, sync: bool = False,
                         momentum: float = 0.1) -> tuple[mx.array, ...]:
    x, weight, bias = primals[:3]
    if not _kernels_take(x, weight, bias, sync, tuple(primals[3:])):
        return lean.analytic_vjp(tuple(primals), cotangents, outputs, eps=eps, activation=activation, sync=sync)
    dy, d_mean, d_var = cotangents[:3]
    _, mean, var = outputs[:3]
    c = x.shape[-1]
    rows = x.size // c
    template = _template(x, weight, activation)
    epsilon = float_params((eps,))
    dy = dy.astype(x.dtype)
    grid, g = _reduction_grid(rows, c)
    (part,) = BN_GRAD_SUMS([dy, x, mean, var, weight, bias, epsilon, int_params((rows, c, grid[1]))],
                           template=template, grid=grid, threadgroup=(BN_X, BN_Y, 1),
                           output_shapes=[(2, g, c)], output_dtypes=[mx.float32])
    d_weight, d_bias, coef = BN_GRAD_FINISH([part, var, weight, d_mean, d_var, epsilon, int_params((g, c, rows))],
                                            template=template, grid=(c, 1, 1), threadgroup=(min(GROUP, c), 1, 1),
                                            output_shapes=[(c,), (c,), (3, c)],
                                            output_dtypes=[weight.dtype, weight.dtype, mx.float32])
    (dx,) = BN_GRAD_INPUT([dy, x, mean, var, weight, bias, coef, epsilon, int_params((x.size, c))],
                          template=template, grid=(x.size, 1, 1), threadgroup=(GROUP, 1, 1),
                          output_shapes=[x.shape], output_dtypes=[x.dtype])
    # bias has weight's dtype (_kernels_take); the running statistics' update passes no gradient
    return (dx, d_weight, d_bias, *(mx.zeros_like(r) for r in primals[3:]))
