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

import mlx.core as mx

from ..core.registry import register
from . import definition, kernel


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


dfl_decode = register("dfl_decode", kernel=kernel.dfl_decode, sources=(kernel.DFL_DECODE,), example=_example,
                      edge_examples=_edge_examples)(definition.dfl_decode)

__all__ = ["dfl_decode"]
