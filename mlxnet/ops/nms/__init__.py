"""Greedy non-maximum suppression with torchvision's semantics, class-aware through offsets.
One face: the exact definition on the host (:mod:`.definition` says why there is no kernel)."""
from __future__ import annotations

import mlx.core as mx

from ..core.registry import register
from . import definition


def _example() -> tuple[tuple, dict]:
    k = mx.random.split(mx.random.key(21), 3)
    xy = mx.random.uniform(0, 100, (200, 2), key=k[0])
    wh = mx.random.uniform(5, 40, (200, 2), key=k[1])
    classes = mx.random.randint(0, 3, (200,), key=k[2])
    scores = mx.random.uniform(shape=(200,), key=mx.random.key(22))
    return (mx.concatenate([xy, xy + wh], axis=1), scores, classes), {"iou_threshold": 0.5}


nms = register("nms", example=_example)(definition.nms)

__all__ = ["nms"]
