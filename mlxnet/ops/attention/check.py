"""The argument check of scaled dot-product attention (the registry's ``check``)."""
from __future__ import annotations

import mlx.core as mx

from ...errors import MlxnetError
from ..core.args import as_array


def scaled_dot_product_attention(q: mx.array, k: mx.array, v: mx.array, bias: mx.array | None = None, *,
                                 scale: float | None = None, dropout_p: float = 0.0,
                                 key: mx.array | None = None) -> tuple:
    """Shapes (..., L, E), (..., S, E), (..., S, Ev), bias broadcast to (..., L, S); the scale
    defaults to 1/√E (PyTorch's)."""
    op = "scaled_dot_product_attention"
    q, k, v = (as_array(a, n, op) for a, n in ((q, "q"), (k, "k"), (v, "v")))
    if min(q.ndim, k.ndim, v.ndim) < 2 or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise MlxnetError(f"{op}: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not fit "
                          "(..., L, E), (..., S, E), (..., S, Ev)")
    scores = (*q.shape[:-1], k.shape[-2])
    try:
        lead = mx.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        if bias is not None:
            mx.broadcast_shapes(as_array(bias, "bias", op).shape, (*lead, *scores[-2:]))
    except ValueError:
        raise MlxnetError(f"{op}: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
                          + (f" and bias {tuple(bias.shape)}" if bias is not None else "")
                          + " do not broadcast together") from None
    if not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
        raise MlxnetError(f"{op}: dropout_p must be in [0, 1), got {dropout_p!r}")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    args = (q, k, v) if bias is None else (q, k, v, bias)
    return args, {"scale": scale, "dropout_p": float(dropout_p), "key": key}
