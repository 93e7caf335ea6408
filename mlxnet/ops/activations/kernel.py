"""The GPU faces of gelu and softmax: MLX's own fused ops, measured fastest there. (silu and
sigmoid register ``FUSED``: their definition compiled, see the registry.)"""
from __future__ import annotations

import mlx.core as mx

from . import definition


def gelu(x: mx.array, *, approximate: str = "none") -> mx.array:
    return (_gelu_tanh_compiled if approximate == "tanh" else _gelu_erf_compiled)(x)


# The GPU face: each form's definition compiled, one fused kernel (see FUSED in the registry).
_gelu_erf_compiled = mx.compile(lambda x: definition.gelu(x))
_gelu_tanh_compiled = mx.compile(lambda x: definition.gelu(x, approximate="tanh"))


def softmax(x: mx.array, *, axis: int = -1) -> mx.array:
    return mx.softmax(x.astype(mx.float32), axis=axis).astype(x.dtype)
