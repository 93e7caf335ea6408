"""Greedy non-maximum suppression with torchvision's semantics, class-aware through offsets.

Boxes are visited in descending score order (ties: lower index first, torchvision's stable
sort); each kept box removes every later box whose IoU with it is strictly greater than the
threshold. Class-aware NMS shifts each box by ``class * max_wh`` in x and y (ultralytics'
trick), so boxes of different classes never overlap and one pass handles every class.

The reference is exact and runs on the host: the loop is inherently sequential and touches
only the few hundred candidates left after the confidence threshold, so the inputs are read
back once and the work is ``kept x candidates`` vectorised numpy steps. No GPU kernel: see
``scripts/bench/bench_ops.py`` (NMS is a small fraction of YOLOv8's forward pass on every device).
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np

from ...errors import MlxnetError
from ..core.args import shape_of


def _check(boxes: mx.array, scores: mx.array, classes: mx.array | None, iou_threshold: float,
           max_det: int) -> None:
    if not isinstance(boxes, mx.array) or boxes.ndim != 2 or boxes.shape[1] != 4:
        raise MlxnetError(f"nms: boxes must be an (N, 4) xyxy array, got shape {shape_of(boxes)}")
    n = boxes.shape[0]
    for name, a in (("scores", scores), ("classes", classes)):
        if a is not None and (not isinstance(a, mx.array) or a.shape != (n,)):
            raise MlxnetError(f"nms: {name} must have shape ({n},) to match boxes, got {shape_of(a)}")
    if not 0.0 <= iou_threshold <= 1.0:
        raise MlxnetError(f"nms: iou_threshold must be in [0, 1], got {iou_threshold}")
    if max_det < 1:
        raise MlxnetError(f"nms: max_det must be >= 1, got {max_det}")


def _greedy(b: np.ndarray, order: np.ndarray, iou_threshold: float, max_det: int) -> list[int]:
    """torchvision's CPU loop, one kept box at a time against all remaining candidates."""
    x1, y1, x2, y2 = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    areas = (x2 - x1) * (y2 - y1)
    keep: list[int] = []
    with np.errstate(divide="ignore", invalid="ignore"):
        while order.size and len(keep) < max_det:
            i, rest = order[0], order[1:]
            keep.append(int(i))
            w = np.maximum(np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]), np.float32(0))
            h = np.maximum(np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]), np.float32(0))
            inter = w * h
            iou = inter / (areas[i] + areas[rest] - inter)
            # Compared in float64 like torchvision's C++ (float IoU vs double threshold); NaN
            # (degenerate boxes) is never "greater", so such boxes are not suppressed.
            order = rest[~(iou.astype(np.float64) > iou_threshold)]
    return keep


def nms(boxes: mx.array, scores: mx.array, classes: mx.array | None = None, *,
        iou_threshold: float = 0.7, score_threshold: float | None = None, max_det: int = 300,
        max_wh: float = 7680.0) -> mx.array:
    """Indices (int32) of the boxes kept by greedy NMS, highest score first.

    boxes (N, 4) xyxy, scores (N,); classes (N,) makes it class-aware (offset ``max_wh`` per
    class), None is class-agnostic. Only scores > ``score_threshold`` take part; at most
    ``max_det`` indices are returned.
    """
    _check(boxes, scores, classes, iou_threshold, max_det)
    b = np.array(boxes.astype(mx.float32))
    s = np.array(scores.astype(mx.float32))
    candidates = np.arange(b.shape[0])
    if score_threshold is not None:
        candidates = candidates[s > score_threshold]
    if classes is not None:
        # Same float32 arithmetic as ultralytics (class * max_wh, then added to the coordinates).
        b = b + (np.array(classes).astype(np.float32) * np.float32(max_wh))[:, None]
    order = candidates[np.argsort(-s[candidates], kind="stable")]
    return mx.array(np.asarray(_greedy(b, order, iou_threshold, max_det), dtype=np.int32))
