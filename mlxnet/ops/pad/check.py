"""The argument check of bias_act_pad2d (the registry's ``check``); pad2d's own check is
:func:`.definition._check`, which every pad2d face calls first."""
from __future__ import annotations

import mlx.core as mx

from ...errors import MlxnetError
from ..activations import check as activation_check
from ..core.args import shape_of
from .definition import Pads, _check


def bias_act_pad2d(x: mx.array, bias: mx.array, residual: mx.array | None = None,
                   skip: mx.array | None = None, *, pads: Pads, mode: str = "reflect",
                   activation: str | None = "relu") -> tuple[tuple, dict]:
    """The argument check of :func:`bias_act_pad2d` (the registry's ``check``)."""
    if not isinstance(x, mx.array) or x.ndim != 4:
        raise MlxnetError(f"bias_act_pad2d: x must be an (N, H, W, C) array, got {shape_of(x)}")
    activation_check.bias_act(x, bias, residual, activation=activation)
    if skip is not None and (not isinstance(skip, mx.array) or skip.shape != x.shape):
        raise MlxnetError(f"bias_act_pad2d: skip must have x's shape {tuple(x.shape)}, got {shape_of(skip)}")
    pads = _check(x, pads, mode)
    return (x, bias, residual, skip), {"pads": pads, "mode": mode, "activation": activation}
