"""dfl_decode's definition: the levels concatenated, the softmax expectation of the bins'
values, the boxes decoded around the anchor points, the classes by sigmoid."""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import mlx.core as mx
import numpy as np

from ...errors import MlxnetError
from ..activations import sigmoid, softmax


def _levels(bin_values: mx.array, maps: Sequence[mx.array], strides: Sequence[int]) -> list[tuple[mx.array, mx.array, int]]:
    """(box logits, class logits, stride) per level, checked against each other."""
    if bin_values.ndim != 1 or bin_values.size == 0:
        raise MlxnetError(f"dfl_decode: bin values must be a non-empty 1-D array, got shape {bin_values.shape}")
    if not maps or len(maps) % 2 or len(maps) // 2 != len(strides):
        raise MlxnetError(f"dfl_decode: expected a box map and a class map per stride ({len(strides)} strides), "
                          f"got {len(maps)} maps")
    bins, levels = bin_values.size, []
    for level, (box, cls, stride) in enumerate(zip(maps[0::2], maps[1::2], strides)):
        if (box.ndim != 4 or cls.ndim != 4 or box.shape[:3] != cls.shape[:3] or box.shape[-1] != 4 * bins
                or box.shape[0] != maps[0].shape[0] or cls.shape[-1] != maps[1].shape[-1]):
            raise MlxnetError(f"dfl_decode: level {level} has box map {box.shape} and class map {cls.shape}; "
                              f"expected (N, H, W, {4 * bins}) and (N, H, W, {maps[1].shape[-1]}) with the "
                              f"batch of level 0")
        levels.append((box, cls, int(stride)))
    return levels


@lru_cache(maxsize=32)
def _anchors(shapes: tuple[tuple[int, int, int], ...]) -> tuple[mx.array, mx.array]:
    """Cell centres (A, 2) in grid units and each anchor's stride (A, 1), for levels of
    (height, width, stride) (ultralytics' make_anchors)."""
    points, strides = [], []
    for h, w, stride in shapes:
        sy, sx = np.meshgrid(np.arange(h, dtype=np.float32) + 0.5, np.arange(w, dtype=np.float32) + 0.5,
                             indexing="ij")
        points.append(np.stack([sx, sy], -1).reshape(-1, 2))
        strides.append(np.full((h * w, 1), stride, np.float32))
    return mx.array(np.concatenate(points)), mx.array(np.concatenate(strides))


def dfl_decode(bin_values: mx.array, *maps: mx.array, strides: Sequence[int]) -> mx.array:
    """Decode YOLOv8's head: ``maps`` are, level by level, the box logits (N, H, W, 4·bins) and
    the class logits (N, H, W, nc); ``strides`` each level's stride in input pixels;
    ``bin_values`` (bins,) the values the DFL bins stand for (0..bins-1 as trained). Returns
    (N, A, 4 + nc) float32: x, y, w, h in input pixels, then class probabilities."""
    levels = _levels(bin_values, maps, strides)
    n, bins = maps[0].shape[0], bin_values.size
    rows = [box.shape[1] * box.shape[2] for box, _, _ in levels]
    boxes = mx.concatenate([box.reshape(n, a, 4 * bins) for (box, _, _), a in zip(levels, rows)], axis=1)
    scores = mx.concatenate([cls.reshape(n, a, cls.shape[-1]) for (_, cls, _), a in zip(levels, rows)], axis=1)
    p = softmax(boxes.reshape(n, sum(rows), 4, bins).astype(mx.float32), axis=-1)
    dist = p @ bin_values.astype(mx.float32)
    points, stride = _anchors(tuple((box.shape[1], box.shape[2], s) for box, _, s in levels))
    lo, hi = points - dist[..., :2], points + dist[..., 2:]
    xywh = mx.concatenate([(lo + hi) / 2, hi - lo], axis=-1) * stride
    return mx.concatenate([xywh, sigmoid(scores.astype(mx.float32))], axis=-1)
