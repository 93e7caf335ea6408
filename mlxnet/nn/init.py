"""Random weights that keep activations at their scale through the depth.

Layer-by-layer checks on random weights mean something only if every layer sees values of
order one: with a small uniform init the features of a deep net shrink towards zero (flagged
all-zero in float16) and with all-zero weights the output is constant. This gives every weight
of two or more dimensions (convolutions, linears; the output axis first) He-normal values,
std = sqrt(2 / fan_in), every bias zero and every normalisation the identity (scale one,
shift zero, running mean zero, running variance one).
"""
from __future__ import annotations

import math
from typing import Callable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

_NORM_ONES = ("running_var",)
_NORM_ZEROS = ("running_mean",)


def _is_norm(module: nn.Module) -> bool:
    """MLX's normalisations and any module named as one (mlxnet's LayerNorm, LayerNorm2d,
    FrozenBatchNorm2d): an identity when initialised (a zero scale would zero every output)."""
    return (isinstance(module, (nn.BatchNorm, nn.LayerNorm, nn.GroupNorm, nn.RMSNorm))
            or type(module).__name__.endswith(("Norm", "Norm2d")))


def scale_preserving_init(model: nn.Module, seed: int = 0,
                          keep: Callable[[str], bool] = lambda path: False) -> nn.Module:
    """Re-initialise ``model`` in place (see the module docstring) and return it; parameters
    and buffers whose dotted path ``keep`` accepts are left as they are."""
    keys = iter(mx.random.split(mx.random.key(seed), len(tree_flatten(model.parameters())) + 1))
    norms = {name for name, m in model.named_modules() if _is_norm(m)}
    updates = []
    for path, value in tree_flatten(model.parameters()):
        key = next(keys)
        if keep(path) or not mx.issubdtype(value.dtype, mx.floating):
            continue
        owner, _, leaf = path.rpartition(".")
        if owner in norms:
            new = mx.ones_like(value) if leaf in ("weight",) + _NORM_ONES else mx.zeros_like(value)
        elif leaf == "weight" and value.ndim >= 2:
            fan_in = math.prod(value.shape[1:])
            new = mx.random.normal(value.shape, key=key) * math.sqrt(2.0 / fan_in)
        elif leaf in _NORM_ONES:
            new = mx.ones_like(value)
        else:
            new = mx.zeros_like(value)
        updates.append((path, new.astype(value.dtype)))
    model.load_weights(updates, strict=False)
    mx.eval(model.parameters())
    return model
