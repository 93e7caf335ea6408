"""The argument checks of the transposed convolutions (the registry's ``check``): the plan
(:func:`.plan.plan`) is the one check; the faces plan again only for the geometry."""
from __future__ import annotations

from typing import Any

import mlx.core as mx

from .plan import plan


def _check(nd: int, x: mx.array, weight: mx.array, bias: mx.array | None = None, **params: Any) -> tuple:
    # plan() is the one argument check; the faces call it again only for the geometry.
    plan(x, weight, bias, nd, **{"stride": 1, "padding": 0, "output_padding": 0, "dilation": 1,
                                 "groups": 1, **params})
    return ((x, weight) if bias is None else (x, weight, bias)), params


def conv_transpose2d(*args: Any, **params: Any) -> tuple:
    return _check(2, *args, **params)


def conv_transpose1d(*args: Any, **params: Any) -> tuple:
    return _check(1, *args, **params)
