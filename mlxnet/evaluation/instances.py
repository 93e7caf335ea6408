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

from mlxnet.errors import MlxnetError

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


def polygon_masks(shapes: Sequence[np.ndarray | None], boxes: np.ndarray, image_hw: tuple[int, int]) -> np.ndarray:
    """(N, H, W) bool label masks. Each label's shape: a polygon (P, 2) in pixels (filled with
    OpenCV, as ultralytics rasterises its labels), a bool (H, W) mask (a COCO file's, made as
    pycocotools makes it), or None (a box line: its box filled)."""
    import cv2

    h, w = image_hw
    out = np.zeros((len(boxes), h, w), np.uint8)
    for i, (shape, box) in enumerate(zip(shapes, boxes)):
        if shape is not None and shape.dtype == bool:
            out[i] = shape
            continue
        if shape is None:
            x1, y1, x2, y2 = box
            shape = np.array([[x1, y1], [x2, y1], [x2, y2], [x1, y2]])
        cv2.fillPoly(out[i], [np.round(shape).astype(np.int32)], 1)
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


def coco_rle_decode(rle: dict, where: str) -> np.ndarray:
    """The bool (H, W) mask of a COCO run-length encoding: compressed (``counts`` a string, as
    :func:`coco_rle` writes it) or not (a list of runs); runs must cover H × W exactly."""
    h, w = (int(v) for v in rle["size"])
    counts = rle["counts"]
    if isinstance(counts, str):
        runs = _rle_runs(counts, where)
    elif all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts):
        runs = list(counts)
    else:
        raise MlxnetError(f"{where}: run-length counts must be whole numbers >= 0")
    if any(r < 0 for r in runs) or sum(runs) != h * w:
        raise MlxnetError(f"{where}: run-length counts cover {sum(runs)} pixels, its size {h}x{w} is {h * w}")
    values = np.zeros(len(runs), bool)
    values[1::2] = True  # zeros first, then alternating
    return np.repeat(values, runs).reshape(w, h).T


def _rle_runs(counts: str, where: str) -> list[int]:
    """pycocotools' compressed counts: 5-bit groups offset by 48, the sixth bit saying more
    follow, the last group's top bit the sign; each run after the second a difference from the
    run two before."""
    runs: list[int] = []
    x, shift = 0, 0
    for ch in counts:
        group = ord(ch) - 48
        if not 0 <= group < 64:
            raise MlxnetError(f"{where}: run-length counts hold {ch!r}, not a compressed count")
        x |= (group & 0x1F) << shift
        shift += 5
        if group & 0x20:
            continue
        if group & 0x10:
            x |= -1 << shift
        if len(runs) > 2:
            x += runs[-2]
        runs.append(x)
        x, shift = 0, 0
    if shift:
        raise MlxnetError(f"{where}: run-length counts end inside a count")
    return runs


def coco_polygon_mask(polygons: Sequence[np.ndarray], image_hw: tuple[int, int]) -> np.ndarray:
    """The bool (H, W) mask of a COCO object's polygons (each (P, 2) in pixels), filled as
    pycocotools fills them (``frPyObjects`` then ``merge``), so that mask IoU against COCO-format
    labels is COCOeval's: each polygon's outline traced on a 5× grid, the pixels whose centres
    lie between the outline's crossings of their column set, the polygons' masks joined."""
    h, w = image_hw
    out = np.zeros(h * w, bool)
    for polygon in polygons:
        out |= _polygon_runs(np.asarray(polygon, np.float64).reshape(-1, 2), h, w)
    return out.reshape(w, h).T


def _polygon_runs(xy: np.ndarray, h: int, w: int) -> np.ndarray:
    """One polygon as pycocotools' rleFrPoly rasterises it, as a column-major flat mask."""
    scale = 5.0
    x = _trunc(scale * xy[:, 0] + 0.5)  # C's (int)(v + .5): towards zero, below zero too
    y = _trunc(scale * xy[:, 1] + 0.5)
    x, y = np.append(x, x[0]), np.append(y, y[0])
    us, vs = [], []
    for j in range(len(xy)):  # every grid step along each edge, walked from its lower end
        xs, xe, ys, ye = x[j], x[j + 1], y[j], y[j + 1]
        dx, dy = abs(xe - xs), abs(ys - ye)
        flip = (dx >= dy and xs > xe) or (dx < dy and ys > ye)
        if flip:
            xs, xe, ys, ye = xe, xs, ye, ys
        if dx >= dy:
            t = np.arange(dx + 1)
            t = dx - t if flip else t
            s = (ye - ys) / dx if dx else 0.0
            us.append(t + xs)
            vs.append(_trunc(ys + s * t + 0.5))
        else:
            t = np.arange(dy + 1)
            t = dy - t if flip else t
            s = (xe - xs) / dy
            vs.append(t + ys)
            us.append(_trunc(xs + s * t + 0.5))
    u, v = np.concatenate(us), np.concatenate(vs)
    # Where the outline crosses from one grid column to the next: a pixel column's boundary point.
    step = np.flatnonzero(u[1:] != u[:-1]) + 1
    xd = np.where(u[step] < u[step - 1], u[step], u[step] - 1).astype(np.float64)
    xd = (xd + 0.5) / scale - 0.5
    keep = (np.floor(xd) == xd) & (xd >= 0) & (xd <= w - 1)
    yd = np.minimum(v[step], v[step - 1]).astype(np.float64)
    yd = np.ceil(np.clip((yd + 0.5) / scale - 0.5, 0, h))
    starts = np.sort(np.append(xd[keep].astype(np.int64) * h + yd[keep].astype(np.int64), h * w))
    # Each boundary toggles the fill; the flat column-major index order is the runs' order.
    toggles = np.zeros(h * w + 1, np.int64)
    np.add.at(toggles, starts, 1)
    return (np.cumsum(toggles)[: h * w] % 2).astype(bool)


def _trunc(values: np.ndarray) -> np.ndarray:
    return np.trunc(values).astype(np.int64)
