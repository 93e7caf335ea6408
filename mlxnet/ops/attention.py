"""Softmax and scaled dot-product attention.

The CPU fast path of softmax uses the arithmetic-only exp of :mod:`.activations` (MLX's CPU
exp is scalar, and a ViT's softmax runs over millions of scores). On GPUs the op's GPU path
is MLX's fused built-in (``mx.softmax`` / ``mx.fast.scaled_dot_product_attention``), which is
already the fastest there.
"""
from __future__ import annotations

from typing import Any

import mlx.core as mx

from ..errors import MlxnetError

from .activations import _exp_below
from .registry import register


def _softmax_last(x: mx.array) -> mx.array:
    e = _exp_below(x, mx.stop_gradient(x.max(axis=-1, keepdims=True)))
    return e / e.sum(axis=-1, keepdims=True)


def _array(x: Any, what: str, op: str) -> mx.array:
    if not isinstance(x, mx.array):
        raise MlxnetError(f"{op}: {what} must be an mlx array, got {type(x).__name__}")
    return x


def _softmax_check(x: mx.array, *, axis: int = -1, dtype: mx.Dtype | None = None) -> tuple:
    """PyTorch's rules: ``dtype`` casts the input first; a 0-d input takes axis 0 or -1."""
    x = _array(x, "x", "softmax")
    if dtype is not None:
        if not isinstance(dtype, mx.Dtype) or not mx.issubdtype(dtype, mx.floating):
            raise MlxnetError(f"softmax: dtype must be a floating mlx dtype, got {dtype!r}")
        x = x.astype(dtype)
    if not isinstance(axis, int) or not -max(x.ndim, 1) <= axis < max(x.ndim, 1):
        raise MlxnetError(f"softmax: axis {axis!r} is out of range for an input of shape {tuple(x.shape)}")
    if x.ndim == 0:
        return (x.reshape(1),), {"axis": 0}, lambda y: y.reshape(())
    return (x,), {"axis": axis % x.ndim}


def _softmax_builtin(x: mx.array, *, axis: int = -1) -> mx.array:
    return mx.softmax(x.astype(mx.float32), axis=axis).astype(x.dtype)


def _softmax_example() -> tuple[tuple, dict]:
    return (mx.random.normal((3, 5, 37)) * 4,), {}


def _softmax_cpu(x: mx.array, *, axis: int = -1) -> mx.array:
    xf = mx.moveaxis(x.astype(mx.float32), axis, -1)
    return mx.moveaxis(_softmax_last(xf), -1, axis).astype(x.dtype)


@register("softmax", cpu=_softmax_cpu, kernel=_softmax_builtin, check=_softmax_check,
          example=_softmax_example)
def softmax(x: mx.array, *, axis: int = -1, dtype: mx.Dtype | None = None) -> mx.array:
    """Softmax along ``axis``, computed in float32 (after casting ``x`` to ``dtype``, if given)."""
    if x.shape[axis] == 0:
        return x
    xf = x.astype(mx.float32)
    e = mx.exp(xf - mx.stop_gradient(xf.max(axis=axis, keepdims=True)))
    return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype)


def _sdpa_check(q: mx.array, k: mx.array, v: mx.array, bias: mx.array | None = None, *,
                scale: float | None = None, dropout_p: float = 0.0,
                key: mx.array | None = None) -> tuple:
    """Shapes (..., L, E), (..., S, E), (..., S, Ev), bias broadcast to (..., L, S); the scale
    defaults to 1/√E (PyTorch's)."""
    op = "scaled_dot_product_attention"
    q, k, v = (_array(a, n, op) for a, n in ((q, "q"), (k, "k"), (v, "v")))
    if min(q.ndim, k.ndim, v.ndim) < 2 or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise MlxnetError(f"{op}: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not fit "
                          "(..., L, E), (..., S, E), (..., S, Ev)")
    scores = (*q.shape[:-1], k.shape[-2])
    try:
        lead = mx.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        if bias is not None:
            mx.broadcast_shapes(_array(bias, "bias", op).shape, (*lead, *scores[-2:]))
    except ValueError:
        raise MlxnetError(f"{op}: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
                          + (f" and bias {tuple(bias.shape)}" if bias is not None else "")
                          + " do not broadcast together") from None
    if not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
        raise MlxnetError(f"{op}: dropout_p must be in [0, 1), got {dropout_p!r}")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    args = (q, k, v) if bias is None else (q, k, v, bias)
    return args, {"scale": scale, "dropout_p": float(dropout_p), "key": key}


def _sdpa_builtin(q: mx.array, k: mx.array, v: mx.array, bias: mx.array | None = None, *,
                  scale: float, dropout_p: float = 0.0, key: mx.array | None = None) -> mx.array:
    four_d = q.ndim == k.ndim == v.ndim == 4 and q.shape[:2] == k.shape[:2] == v.shape[:2]
    if dropout_p or not four_d:  # MLX's fused attention: (B, heads, tokens, dims), no dropout
        return scaled_dot_product_attention.op.definition(q, k, v, bias, scale=scale,
                                                          dropout_p=dropout_p, key=key)
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=bias)


def _sdpa_example() -> tuple[tuple, dict]:
    q, k, v = (mx.random.normal((2, 3, 10, 16)) for _ in range(3))
    return (q, k, v, mx.random.normal((1, 3, 10, 10))), {"scale": 0.25}


@register("scaled_dot_product_attention", kernel=_sdpa_builtin, check=_sdpa_check,
          example=_sdpa_example)
def scaled_dot_product_attention(q: mx.array, k: mx.array, v: mx.array, bias: mx.array | None = None,
                                 *, scale: float | None = None, dropout_p: float = 0.0,
                                 key: mx.array | None = None) -> mx.array:
    """softmax(q·kᵀ·scale + bias)·v over (..., tokens, dims); bias is added to the scores.

    Scores, softmax and the weighted sum run in float32 whatever the inputs' dtype (half
    precision scores lose the small differences softmax amplifies), as PyTorch's fused kernels
    accumulate. ``dropout_p`` drops attention weights (training; scaled by 1/(1 − p)), drawn
    from ``key`` or MLX's global generator."""
    scores = (q.astype(mx.float32) * scale) @ k.astype(mx.float32).swapaxes(-1, -2)
    if bias is not None:
        scores = scores + bias.astype(mx.float32)
    weights = softmax(scores, axis=-1)
    if dropout_p:
        keep = mx.random.bernoulli(1.0 - dropout_p, weights.shape, key=key)
        weights = mx.where(keep, weights / (1.0 - dropout_p), 0.0)
    return (weights @ v.astype(mx.float32)).astype(v.dtype)
