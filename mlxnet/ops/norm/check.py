"""layer_norm's and batch_norm_train's argument checks (the registry's ``check``)."""
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


ACTIVATIONS = (None, "silu")


def batch_norm_train(x: mx.array, weight: mx.array, bias: mx.array, running_mean: mx.array | None = None,
                     running_var: mx.array | None = None, *, eps: float = 1e-5, activation: str | None = None,
                     sync: bool = False, momentum: float = 0.1) -> tuple:
    if not isinstance(x, mx.array) or x.ndim < 2:
        raise MlxnetError(f"batch_norm_train: expected an array of at least 2 dimensions (..., channels), got "
                          f"{shape_of(x)}")
    if x.size // max(x.shape[-1], 1) < 2:
        raise MlxnetError(f"batch_norm_train: needs more than one value per channel, got shape {tuple(x.shape)}")
    for what, a in (("weight", weight), ("bias", bias)):
        if not isinstance(a, mx.array) or a.shape != x.shape[-1:]:
            raise MlxnetError(f"batch_norm_train: {what} must have shape ({x.shape[-1]},) for an input of shape "
                              f"{tuple(x.shape)}, got {shape_of(a)}")
    if (running_mean is None) != (running_var is None):
        raise MlxnetError("batch_norm_train: give both running_mean and running_var, or neither")
    for what, a in (("running_mean", running_mean), ("running_var", running_var)):
        if a is not None and (not isinstance(a, mx.array) or a.shape != x.shape[-1:]):
            raise MlxnetError(f"batch_norm_train: {what} must have shape ({x.shape[-1]},) for an input of shape "
                              f"{tuple(x.shape)}, got {shape_of(a)}")
    if not isinstance(eps, (int, float)) or eps < 0:
        raise MlxnetError(f"batch_norm_train: eps must be a number >= 0, got {eps!r}")
    if not isinstance(momentum, (int, float)) or not 0 <= momentum <= 1:
        raise MlxnetError(f"batch_norm_train: momentum must be a number in [0, 1], got {momentum!r}")
    if activation not in ACTIVATIONS:
        raise MlxnetError(f"batch_norm_train: activation must be None or 'silu', got {activation!r}")
    args = (x, weight, bias) if running_mean is None else (x, weight, bias, running_mean, running_var)
    return args, {"eps": float(eps), "activation": activation, "sync": bool(sync), "momentum": float(momentum)}
