"""Greedy non-maximum suppression with torchvision's semantics, class-aware through offsets.

Two faces with the same kept indices: the exact definition on the host (:mod:`.definition`),
which the CPU runs, and on GPU back ends the kernel face (:mod:`.kernel`,
custom_kernels/nms.kern): the suppression bit mask and the sequential scan on the device, the
sort and the prefix rule on the host, the definition where the kernels cannot serve.
"""
from __future__ import annotations

import mlx.core as mx

from ..core.registry import register
from . import definition, kernel


def _example() -> tuple[tuple, dict]:
    k = mx.random.split(mx.random.key(21), 3)
    xy = mx.random.uniform(0, 100, (200, 2), key=k[0])
    wh = mx.random.uniform(5, 40, (200, 2), key=k[1])
    classes = mx.random.randint(0, 3, (200,), key=k[2])
    scores = mx.random.uniform(shape=(200,), key=mx.random.key(22))
    return (mx.concatenate([xy, xy + wh], axis=1), scores, classes), {"iou_threshold": 0.5}


def _edge_examples() -> list[tuple[tuple, dict]]:
    # One box: every kernel input under 8 elements (Metal's constant address space); none.
    one = (mx.array([[1.0, 2.0, 5.0, 7.0]]), mx.array([0.5]), None)
    empty = (mx.zeros((0, 4)), mx.zeros((0,)), None)
    return [(one, {}), (empty, {})]


nms = register("nms", kernel=kernel.nms, sources=(kernel.NMS_MASK, kernel.NMS_SCAN), example=_example,
               edge_examples=_edge_examples)(definition.nms)



def nms_many(problems: list[tuple[mx.array, mx.array, mx.array | None]], *, iou_threshold: float = 0.7,
             score_threshold: float | None = None, max_det: int = 300, max_wh: float = 7680.0) -> list[mx.array]:
    """:func:`nms` of several independent problems (each image's boxes, scores, classes), the
    same kept indices each; where the kernel face runs, all of them are launched before any
    answer is read back (one wait for the batch, not one per image)."""
    options = dict(iou_threshold=iou_threshold, score_threshold=score_threshold, max_det=max_det, max_wh=max_wh)
    if nms.op.uses_kernel():
        return kernel.nms_many(list(problems), **options)
    return [nms(*problem, **options) for problem in problems]


__all__ = ["nms", "nms_many"]
