"""layer_norm's argument check (the registry's ``check``)."""
from __future__ import annotations

import mlx.core as mx

from ...errors import MlxnetError
from ..core.args import shape_of


def layer_norm(x: mx.array, weight: mx.array | None = None, bias: mx.array | None = None,
               *, eps: float = 1e-5) -> tuple:
    if not isinstance(x, mx.array) or x.ndim < 1:
        raise MlxnetError(f"layer_norm: expected an array of at least 1 dimension, got "
                          f"{shape_of(x)}")
    for what, a in (("weight", weight), ("bias", bias)):
        if a is not None and (not isinstance(a, mx.array) or a.shape != x.shape[-1:]):
            raise MlxnetError(f"layer_norm: {what} must have shape ({x.shape[-1]},) for an input of shape "
                              f"{tuple(x.shape)}, got {shape_of(a)}")
    if not isinstance(eps, (int, float)) or eps < 0:
        raise MlxnetError(f"layer_norm: eps must be a number >= 0, got {eps!r}")
    return (x, weight, bias), {"eps": float(eps)}
