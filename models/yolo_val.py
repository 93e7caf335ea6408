"""A YOLOv8 head's output to detections the way ``yolo val`` makes them, on the host.

``yolo val`` calls ultralytics' non_max_suppression with ``multi_label=True``: an anchor whose
best class score passes ``conf`` enters once for *every* class whose score passes it (at conf
0.001 that is often several), each (anchor, class) pair a candidate of its own, in anchor-major
order; then at most ``max_nms`` candidates (highest scores), class-aware greedy NMS (each class
offset by ``max_wh``) and the first ``max_det`` kept. The predictor (``mlxnet detect``) keeps
one class per anchor, its best (``multi_label=False``), which is also what this does then.
"""
from __future__ import annotations

from typing import Sequence

import mlx.core as mx
import numpy as np

from mlxnet import ops
from .yolo_process import MAX_NMS, MAX_WH, xywh2xyxy


def candidates(head: np.ndarray, conf: float, multi_label: bool = True, max_nms: int | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One image's (A, 4 + nc) head output -> the NMS candidates: xyxy boxes (K, 4), scores (K,),
    classes (K,) and the anchor each came from (K,), in ultralytics' order; with ``max_nms``,
    only the ``max_nms`` highest (:func:`highest`), still in that order."""
    scores = head[:, 4:]
    nc = scores.shape[1]
    anchors = np.flatnonzero(scores.max(axis=1) > conf)
    # A box with a NaN or infinite coordinate (weights that overflow) is no detection.
    anchors = anchors[np.isfinite(head[anchors, :4]).all(axis=1)]
    if multi_label and nc > 1:  # ultralytics: multi_label &= nc > 1
        # (anchor, class) pairs in row-major order: anchor by anchor, classes ascending. The cut
        # to max_nms comes before any box is gathered: a weak model at conf 0.001 passes nearly
        # every one of 8400 anchors × 80 classes.
        pair_scores = scores[anchors].ravel()
        pairs = np.flatnonzero(pair_scores > conf)
        picked = pair_scores[pairs]
        if max_nms is not None and pairs.size > max_nms:
            top = highest(picked, max_nms)
            pairs, picked = pairs[top], picked[top]
        rows, cls = np.divmod(pairs, nc)
        return xywh2xyxy(head[anchors[rows], :4]), picked, cls.astype(np.int32), anchors[rows]
    if max_nms is not None and anchors.size > max_nms:
        best = scores[anchors].max(axis=1)
        anchors = anchors[highest(best, max_nms)]
    cls = scores[anchors].argmax(axis=1)
    return xywh2xyxy(head[anchors, :4]), scores[anchors, cls], cls.astype(np.int32), anchors


def highest(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` highest scores, ties taken lowest index first (the first ``k`` of a
    stable descending sort), in increasing index order: NMS's own stable sort then sees the
    candidates in their original order. A partition, not a sort: at conf 0.001 a weak model's
    anchors can give hundreds of thousands of (anchor, class) pairs."""
    if scores.size <= k:
        return np.arange(scores.size)
    kth = np.partition(scores, scores.size - k)[scores.size - k]  # the k-th highest value
    above = np.flatnonzero(scores > kth)
    tied = np.flatnonzero(scores == kth)[:k - above.size]
    return np.sort(np.concatenate([above, tied]))


def detections(head: np.ndarray, *, conf: float = 0.001, iou: float = 0.7, max_det: int = 300,
               multi_label: bool = True, agnostic: bool = False, max_nms: int = MAX_NMS,
               anchors: bool = False) -> tuple[np.ndarray, ...]:
    """One image's head output -> (boxes (K, 4) xyxy in the network input's pixels, scores (K,),
    classes (K,)), highest score first; ``anchors``: and the anchor each came from (K,)."""
    return detections_many([head], conf=conf, iou=iou, max_det=max_det, multi_label=multi_label, agnostic=agnostic,
                           max_nms=max_nms, anchors=anchors)[0]


def detections_many(heads: Sequence[np.ndarray], *, conf: float = 0.001, iou: float = 0.7, max_det: int = 300,
                    multi_label: bool = True, agnostic: bool = False, max_nms: int = MAX_NMS,
                    anchors: bool = False) -> list[tuple[np.ndarray, ...]]:
    """:func:`detections` of each image's head output, their NMS run together
    (:func:`mlxnet.ops.nms_many`: on a GPU one wait for the batch, not one per image)."""
    found = [candidates(np.asarray(head, np.float32), conf, multi_label, max_nms) for head in heads]
    problems = [(mx.array(boxes), mx.array(scores), None if agnostic else mx.array(classes))
                for boxes, scores, classes, _ in found if scores.size]
    kept = iter(ops.nms_many(problems, iou_threshold=iou, max_det=max_det, max_wh=MAX_WH))
    out = []
    for boxes, scores, classes, where in found:
        if scores.size == 0:
            empty = (np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int32))
            out.append(empty + ((np.zeros(0, np.int64),) if anchors else ()))
            continue
        keep = np.array(next(kept))
        out.append((boxes[keep], scores[keep], classes[keep]) + ((where[keep],) if anchors else ()))
    return out
