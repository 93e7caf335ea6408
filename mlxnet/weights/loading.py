"""Put a flat ``{key: array}`` dict into an ``mlx.nn.Module``, reporting every mismatch at once."""
from __future__ import annotations

from typing import Mapping

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ..errors import MlxnetError, summary


def check_weights(model: nn.Module, weights: Mapping[str, mx.array], *, strict: bool = True) -> list[str]:
    """One line per problem: missing keys, unexpected keys (both only if ``strict``) and shape
    mismatches (always), each naming the key and the expected vs found shape."""
    expected = {k: tuple(v.shape) for k, v in tree_flatten(model.parameters())}
    problems = []
    for key, shape in expected.items():
        if key not in weights:
            if strict:
                problems.append(f"missing key {key}: expected shape {shape}")
        elif tuple(weights[key].shape) != shape:
            problems.append(f"shape mismatch for {key}: expected {shape}, found {tuple(weights[key].shape)}")
    if strict:
        problems += [f"unexpected key {k}: found shape {tuple(v.shape)}" for k, v in weights.items() if k not in expected]
    return problems


def _bad_values(model: nn.Module, weights: Mapping[str, mx.array]) -> list[str]:
    """A float parameter given integer values, or NaN/Inf: silent wrong answers otherwise (an
    integer tensor would be cast and run; one NaN spreads through every output)."""
    expected = dict(tree_flatten(model.parameters()))
    problems = []
    for key, value in weights.items():
        if key not in expected or not mx.issubdtype(expected[key].dtype, mx.floating):
            continue
        if not mx.issubdtype(value.dtype, mx.floating):
            problems.append(f"{key}: {str(value.dtype).rsplit('.', 1)[-1]} values for a floating-point parameter")
        elif value.size and not mx.isfinite(value).all().item():
            bad = int((~mx.isfinite(value)).sum().item())
            problems.append(f"{key}: {bad} of {value.size} values are NaN or infinite")
    return problems


def load_into(model: nn.Module, weights: Mapping[str, mx.array], strict: bool = True, *,
              source: str | None = None) -> nn.Module:
    """Check ``weights`` against ``model.parameters()`` and load them (dtypes as given).

    Every problem is reported at once, in one line (the first few and the count).
    ``strict=False`` skips missing and unexpected keys (the model keeps its values for the
    former) but still refuses shape mismatches. ``source`` (a file name) goes into the message.
    """
    problems = check_weights(model, weights, strict=strict) + _bad_values(model, weights)
    if problems:
        where = f" ({source})" if source else ""
        raise MlxnetError(summary(f"weights{where} do not fit {type(model).__name__}", problems))
    known = {k for k, _ in tree_flatten(model.parameters())}
    model.load_weights([(k, v) for k, v in weights.items() if k in known], strict=False)
    return model
