"""layer_norm's CPU fast path: mlxnet's C++ primitive (:mod:`mlxnet._native`), one row per step
on every core with the definition's float32 statistics; MLX's CPU layer norm runs on one core.
Elsewhere (other dtypes, no primitives) the definition."""
from __future__ import annotations

import mlx.core as mx

from ... import _native
from .definition import layer_norm as _definition
from . import lean


def layer_norm(x: mx.array, weight: mx.array | None = None, bias: mx.array | None = None,
               *, eps: float = 1e-5) -> mx.array:
    native = _native.on_cpu()
    if native is None or x.dtype != mx.float32:
        return _definition(x, weight, bias, eps=eps)
    as_f32 = (lambda a: None if a is None else a.astype(mx.float32))
    return native.layer_norm(x, as_f32(weight), as_f32(bias), eps)


def batch_norm_train(x: mx.array, weight: mx.array, bias: mx.array, running_mean: mx.array | None = None,
                     running_var: mx.array | None = None, *, eps: float = 1e-5, activation: str | None = None,
                     sync: bool = False, momentum: float = 0.1) -> tuple[mx.array, ...]:
    """mlxnet's C++ primitive in float32 (three passes on every core, its gradient two more,
    keeping only the input and the statistics); else, and for a synchronised layer, the
    definition's forward with the layer's analytic gradient (:mod:`.lean`, shared with the GPU
    face)."""
    native = _native.on_cpu()
    if native is None or sync or x.dtype != mx.float32 or x.ndim < 1:
        return lean.batch_norm_train(x, weight, bias, running_mean, running_var, eps=eps, activation=activation,
                                     sync=sync, momentum=momentum)
    outputs = native.batch_norm_train(x, weight.astype(mx.float32), bias.astype(mx.float32), eps,
                                      activation == "silu")
    return lean.with_running(tuple(outputs), x, running_mean, running_var, sync=sync, momentum=momentum)
