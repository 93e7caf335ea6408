"""What a segment or pose model's predictions overlap their labels by, for ``val detect``: mask
IoU on the image's pixels and COCO's object keypoint similarity (OKS), as (labels, predictions)
matrices that :func:`mlxnet.evaluation.metrics.match_iou` matches like box IoU.

Masks are compared at the image's own resolution, as pycocotools compares them (a polygon
label filled with OpenCV, as ultralytics rasterises its labels). OKS follows pycocotools'
``computeOks``: per visible label keypoint ``exp(-d² / (2 s² (2σ)²))`` averaged, ``s²`` the
label's area (a YOLO-format label has none: its box's area × 0.53, ultralytics' stand-in for
a person's segment area); a label without a visible keypoint is compared through its box, and
COCOeval ignores it.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

# COCO's per-keypoint falloffs (nose, eyes, ears, shoulders, elbows, wrists, hips, knees, ankles).
COCO_SIGMAS = np.array([0.26, 0.25, 0.25, 0.35, 0.35, 0.79, 0.79, 0.72, 0.72, 0.62, 0.62, 1.07, 1.07, 0.87, 0.87,
                        0.89, 0.89]) / 10
AREA_FROM_BOX = 0.53  # ultralytics: a pose label's area when only its box is known


def sigmas_for(keypoints: int) -> np.ndarray:
    """COCO's falloffs for its 17 keypoints; ultralytics' 1 / keypoints each for other sets."""
    return COCO_SIGMAS if keypoints == 17 else np.full(keypoints, 1.0 / keypoints)


def with_visibility(points: np.ndarray) -> np.ndarray:
    """Keypoints (..., P, 2 or 3) as (..., P, 3): a visibility of 1 where there is none."""
    if points.shape[-1] > 2:
        return points
    return np.concatenate([points, np.ones((*points.shape[:-1], 1))], axis=-1)


def polygon_masks(polygons: Sequence[np.ndarray | None], boxes: np.ndarray, image_hw: tuple[int, int]) -> np.ndarray:
    """(N, H, W) bool label masks: each polygon (P, 2) in pixels filled; a label without one
    (a box line) fills its box."""
    import cv2

    h, w = image_hw
    out = np.zeros((len(boxes), h, w), np.uint8)
    for i, (polygon, box) in enumerate(zip(polygons, boxes)):
        if polygon is None:
            x1, y1, x2, y2 = box
            polygon = np.array([[x1, y1], [x2, y1], [x2, y2], [x1, y2]])
        cv2.fillPoly(out[i], [np.round(polygon).astype(np.int32)], 1)
    return out.astype(bool)


def mask_iou(label_masks: np.ndarray, pred_masks: np.ndarray, label_boxes: np.ndarray,
             pred_boxes: np.ndarray) -> np.ndarray:
    """(N, K) IoU of boolean masks (N, H, W) and (K, H, W); only pairs whose boxes meet are
    compared pixel by pixel (a mask lies inside its box), over the boxes' common part."""
    n, k = len(label_masks), len(pred_masks)
    out = np.zeros((n, k))
    if n == 0 or k == 0:
        return out
    label_area = label_masks.reshape(n, -1).sum(1).astype(np.float64)
    pred_area = pred_masks.reshape(k, -1).sum(1).astype(np.float64)
    lb, pb = _pixel_spans(label_boxes, label_masks.shape[1:]), _pixel_spans(pred_boxes, pred_masks.shape[1:])
    for i in range(n):
        x1 = np.maximum(lb[i, 0], pb[:, 0])
        y1 = np.maximum(lb[i, 1], pb[:, 1])
        x2 = np.minimum(lb[i, 2], pb[:, 2])
        y2 = np.minimum(lb[i, 3], pb[:, 3])
        for j in np.flatnonzero((x2 > x1) & (y2 > y1)):
            inter = np.count_nonzero(label_masks[i, y1[j]:y2[j], x1[j]:x2[j]] & pred_masks[j, y1[j]:y2[j], x1[j]:x2[j]])
            union = label_area[i] + pred_area[j] - inter
            out[i, j] = inter / union if union > 0 else 0.0
    return out


def _pixel_spans(boxes: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """Whole-pixel [x1, y1, x2, y2) spans holding each box's mask (a pixel or two of margin:
    polygon fills and box cuts round differently), clipped to the image."""
    b = np.asarray(boxes, np.float64).reshape(-1, 4)
    spans = np.column_stack([np.floor(b[:, 0]) - 1, np.floor(b[:, 1]) - 1, np.ceil(b[:, 2]) + 2, np.ceil(b[:, 3]) + 2])
    return np.clip(spans, 0, [hw[1], hw[0], hw[1], hw[0]]).astype(np.int64)


def keypoint_oks(label_points: np.ndarray, pred_points: np.ndarray, label_boxes: np.ndarray,
                 label_areas: np.ndarray) -> np.ndarray:
    """(N, K) OKS of labels' keypoints (N, P, 3: x, y, visibility) and predictions' (K, P, 2+)
    (pycocotools' computeOks)."""
    n, k = len(label_points), len(pred_points)
    out = np.zeros((n, k))
    if n == 0 or k == 0:
        return out
    variances = (2 * sigmas_for(label_points.shape[1])) ** 2
    px, py = pred_points[..., 0].astype(np.float64), pred_points[..., 1].astype(np.float64)
    for i in range(n):
        gx, gy, visible = (label_points[i, :, c].astype(np.float64) for c in range(3))
        seen = visible > 0
        if seen.any():
            dx, dy = px - gx, py - gy
        else:  # no visible keypoint: the distance to a box twice the label's, around it
            x0, y0, w, h = label_boxes[i, 0], label_boxes[i, 1], *(label_boxes[i, 2:] - label_boxes[i, :2])
            lo_x, hi_x, lo_y, hi_y = x0 - w, x0 + 2 * w, y0 - h, y0 + 2 * h
            dx = np.maximum(0, lo_x - px) + np.maximum(0, px - hi_x)
            dy = np.maximum(0, lo_y - py) + np.maximum(0, py - hi_y)
        e = (dx ** 2 + dy ** 2) / variances / (label_areas[i] + np.spacing(1)) / 2
        if seen.any():
            e = e[:, seen]
        out[i] = np.exp(-e).sum(1) / e.shape[1]
    return out


def coco_rle(mask: np.ndarray) -> dict:
    """A boolean (H, W) mask as COCO's compressed run-length encoding ({"size": [H, W],
    "counts": str}: column-major runs, zeros first, each run after the second stored as its
    difference from the run two before, in 5-bit groups offset by 48), as pycocotools writes
    it."""
    flat = np.asarray(mask, bool).ravel(order="F")
    edges = np.flatnonzero(np.diff(flat.astype(np.int8))) + 1
    bounds = np.concatenate([[0], edges, [flat.size]])
    runs = np.diff(bounds).tolist()
    if flat.size and flat[0]:
        runs = [0] + runs  # the counts start with a run of zeros, empty here
    chars = []
    for i, run in enumerate(runs):
        x = run - runs[i - 2] if i > 2 else run
        while True:
            group, x = x & 0x1F, x >> 5
            more = x != -1 if group & 0x10 else x != 0
            chars.append(chr((group | 0x20 if more else group) + 48))
            if not more:
                break
    return {"size": [int(mask.shape[0]), int(mask.shape[1])], "counts": "".join(chars)}
