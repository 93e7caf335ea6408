"""YOLOv8's head decoding: boxes from distributions over distance bins (DFL), classes by sigmoid.

Per level the head gives box logits (N, H, W, 4·bins), a distribution over ``bins`` distances
for each side (left, top, right, bottom) of the box around every cell centre, and class logits
(N, H, W, nc). The decoded output is (N, A, 4 + nc) in float32: x, y, w, h in input pixels and
the class probabilities, anchors level by level, row-major within a level (ultralytics' order).

The definition concatenates the levels, takes the softmax expectation of the bins' values and
decodes the boxes around the anchor points. The GPU kernel (custom_kernels/dfl_decode.kern)
does all of it in one pass that reads each level's maps where they are: no concatenation, and
no softmax over rows of 16 (which MLX runs a block per row).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import mlx.core as mx
import numpy as np

from ..errors import MlxnetError
from .activations import sigmoid
from .attention import softmax
from .kernel_source import PortableKernel, int_params
from .registry import register

MAX_LEVELS = 4  # the kernel's level slots (YOLOv8 has 3; its P2 and P6 variants 4)
_GROUP = 256

DFL_DECODE = PortableKernel("dfl_decode.kern", "dfl_decode",
                            ["v", "b0", "c0", "b1", "c1", "b2", "c2", "b3", "c3", "p"], ["out"])


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


def _kernel(bin_values: mx.array, *maps: mx.array, strides: Sequence[int]) -> mx.array:
    levels = _levels(bin_values, maps, strides)
    n, nc, bins = maps[0].shape[0], maps[1].shape[-1], bin_values.size
    anchors = sum(box.shape[1] * box.shape[2] for box, _, _ in levels)
    cols = 4 + nc
    largest = max([n * anchors * cols] + [m.size for m in maps])
    if len(levels) > MAX_LEVELS or largest >= 2**31 - _GROUP or n > 65535:
        return dfl_decode.__wrapped__(bin_values, *maps, strides=strides)
    dtype = maps[0].dtype
    placeholder = mx.zeros((1,), dtype)
    inputs, params = [bin_values.astype(mx.float32)], [n, nc, bins]
    for slot in range(MAX_LEVELS):
        if slot < len(levels):
            box, cls, stride = levels[slot]
            inputs += [box.astype(dtype), cls.astype(dtype)]
            params += [box.shape[1] * box.shape[2], box.shape[2], stride]
        else:
            inputs += [placeholder, placeholder]
            params += [0, 1, 1]
    (out,) = DFL_DECODE(inputs + [int_params(tuple(params))], template=[("T", dtype)],
                        grid=(anchors * cols, n, 1), threadgroup=(_GROUP, 1, 1),
                        output_shapes=[(n, anchors, cols)], output_dtypes=[mx.float32])
    return out


def _example() -> tuple[tuple, dict]:
    keys = mx.random.split(mx.random.key(31), 7)
    maps = []
    for level, (h, w) in enumerate([(4, 6), (2, 3), (1, 2)]):
        maps += [mx.random.normal((2, h, w, 4 * 5), key=keys[2 * level]) * 2,
                 mx.random.normal((2, h, w, 3), key=keys[2 * level + 1])]
    return (mx.arange(5, dtype=mx.float32), *maps), {"strides": (8, 16, 32)}


def _edge_examples() -> list[tuple[tuple, dict]]:
    tiny = (mx.array([1.0]), mx.array([[[[0.5, -1.0, 2.0, 0.0]]]]), mx.array([[[[0.3]]]]))
    empty = (mx.arange(4, dtype=mx.float32), mx.zeros((0, 2, 2, 16)), mx.zeros((0, 2, 2, 3)))
    return [(tiny, {"strides": (8,)}), (empty, {"strides": (8,)})]


@register("dfl_decode", kernel=_kernel, sources=(DFL_DECODE,), example=_example, edge_examples=_edge_examples)
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
