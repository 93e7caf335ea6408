"""layer_norm's CPU fast path: mlxnet's C++ primitive (:mod:`mlxnet._native`), one row per step
on every core with the definition's float32 statistics; MLX's CPU layer norm runs on one core.
Elsewhere (other dtypes, no primitives) the definition."""
from __future__ import annotations

import mlx.core as mx

from ... import _native
from .definition import layer_norm as _definition


def layer_norm(x: mx.array, weight: mx.array | None = None, bias: mx.array | None = None,
               *, eps: float = 1e-5) -> mx.array:
    native = _native.on_cpu()
    if native is None or x.dtype != mx.float32:
        return _definition(x, weight, bias, eps=eps)
    as_f32 = (lambda a: None if a is None else a.astype(mx.float32))
    return native.layer_norm(x, as_f32(weight), as_f32(bias), eps)
