"""The argument checks of gelu and softmax (the registry's ``check``)."""
from __future__ import annotations

import mlx.core as mx

from ...errors import MlxnetError
from ..core.args import as_array, shape_of

GELU_FORMS = ("none", "tanh")


def gelu(x: mx.array, *, approximate: str = "none") -> tuple[tuple, dict]:
    if approximate not in GELU_FORMS:
        raise MlxnetError(f"gelu: approximate must be one of {', '.join(map(repr, GELU_FORMS))}, "
                          f"got {approximate!r}")
    return (x,), {"approximate": approximate}


def softmax(x: mx.array, *, axis: int = -1, dtype: mx.Dtype | None = None) -> tuple:
    """PyTorch's rules: ``dtype`` casts the input first; a 0-d input takes axis 0 or -1."""
    x = as_array(x, "x", "softmax")
    if dtype is not None:
        if not isinstance(dtype, mx.Dtype) or not mx.issubdtype(dtype, mx.floating):
            raise MlxnetError(f"softmax: dtype must be a floating mlx dtype, got {dtype!r}")
        x = x.astype(dtype)
    if not isinstance(axis, int) or not -max(x.ndim, 1) <= axis < max(x.ndim, 1):
        raise MlxnetError(f"softmax: axis {axis!r} is out of range for an input of shape {tuple(x.shape)}")
    if x.ndim == 0:
        return (x.reshape(1),), {"axis": 0}, lambda y: y.reshape(())
    return (x,), {"axis": axis % x.ndim}


BIAS_ACTIVATIONS = (None, "relu")


def bias_act(x: mx.array, bias: mx.array, residual: mx.array | None = None, *,
             activation: str | None = "relu") -> tuple:
    if activation not in BIAS_ACTIVATIONS:
        raise MlxnetError(f"bias_act: activation must be None or 'relu', got {activation!r}")
    if not isinstance(x, mx.array) or x.ndim < 1:
        raise MlxnetError(f"bias_act: x must be an array of at least one axis, got {shape_of(x)}")
    if not isinstance(bias, mx.array) or bias.shape != x.shape[-1:]:
        raise MlxnetError(f"bias_act: bias must have shape ({x.shape[-1]},) for x of shape {tuple(x.shape)}, "
                          f"got {shape_of(bias)}")
    if residual is not None and (not isinstance(residual, mx.array) or residual.shape != x.shape):
        raise MlxnetError(f"bias_act: residual must have x's shape {tuple(x.shape)}, got {shape_of(residual)}")
    args = (x, bias) if residual is None else (x, bias, residual)
    return args, {"activation": activation}
