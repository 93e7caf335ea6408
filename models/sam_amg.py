"""Segment everything: SAM's automatic mask generator (``SamAutomaticMaskGenerator``).

A regular grid of single foreground points is run through the predictor in batches (three masks
per point); masks are kept when the predicted IoU exceeds ``pred_iou_thresh`` and the stability
score (IoU of the mask thresholded at ±``stability_score_offset``) reaches
``stability_score_thresh``; duplicates are removed by box NMS on the predicted IoU. Crop layers
and small-region cleanup of the original are not implemented (single full-image crop).
"""
from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from mlxnet.errors import MlxnetError
from mlxnet.image import ImageInput
from mlxnet.ops import nms

from .sam import SamPredictor, apply_coords


def build_point_grid(n_per_side: int) -> np.ndarray:
    """(n², 2) xy points at the centres of an n×n grid of [0, 1]², row by row."""
    offset = 1 / (2 * n_per_side)
    side = np.linspace(offset, 1 - offset, n_per_side)
    xs = np.tile(side[None, :], (n_per_side, 1))
    ys = np.tile(side[:, None], (1, n_per_side))
    return np.stack([xs, ys], axis=-1).reshape(-1, 2)


def stability_score(logits: mx.array, threshold: float, offset: float) -> mx.array:
    """|logits > t + offset| / |logits > t - offset| per mask (the first is inside the second)."""
    inter = (logits > threshold + offset).sum(axis=(-2, -1)).astype(mx.float32)
    union = (logits > threshold - offset).sum(axis=(-2, -1)).astype(mx.float32)
    return inter / union


def masks_to_boxes(masks: mx.array) -> mx.array:
    """(N, H, W) bool → (N, 4) int32 xyxy boxes (inclusive max pixel); empty masks give zeros."""
    n, h, w = masks.shape
    if n == 0:
        return mx.zeros((0, 4), mx.int32)

    def edges(profile: mx.array, size: int) -> tuple[mx.array, mx.array]:
        coords = mx.arange(size, dtype=mx.int32)
        last = mx.max(mx.where(profile, coords, 0), axis=-1)
        first = mx.min(mx.where(profile, coords, size), axis=-1)
        return first, last

    top, bottom = edges(mx.any(masks, axis=-1), h)
    left, right = edges(mx.any(masks, axis=-2), w)
    boxes = mx.stack([left, top, right, bottom], axis=-1)
    empty = (right < left) | (bottom < top)
    return mx.where(empty[:, None], 0, boxes)


class SamAutomaticMaskGenerator:
    """Masks for everything in an image, like segment-anything's generator (no crop layers)."""

    def __init__(self, predictor: SamPredictor, points_per_side: int = 32, points_per_batch: int = 64,
                 pred_iou_thresh: float = 0.88, stability_score_thresh: float = 0.95,
                 stability_score_offset: float = 1.0, box_nms_thresh: float = 0.7,
                 point_grid: np.ndarray | None = None) -> None:
        if (points_per_side is None) == (point_grid is None):
            raise MlxnetError("SamAutomaticMaskGenerator: give exactly one of points_per_side and point_grid")
        if points_per_side is not None and points_per_side < 1:
            raise MlxnetError(f"SamAutomaticMaskGenerator: points_per_side must be >= 1, got {points_per_side}")
        if points_per_batch < 1:
            raise MlxnetError(f"SamAutomaticMaskGenerator: points_per_batch must be >= 1, got {points_per_batch}")
        self.predictor = predictor
        self.point_grid = build_point_grid(points_per_side) if point_grid is None else np.asarray(point_grid)
        self.points_per_batch = points_per_batch
        self.pred_iou_thresh = pred_iou_thresh
        self.stability_score_thresh = stability_score_thresh
        self.stability_score_offset = stability_score_offset
        self.box_nms_thresh = box_nms_thresh

    def generate(self, image: ImageInput | None = None) -> list[dict[str, Any]]:
        """One record per mask, highest predicted IoU first: ``segmentation`` (H, W) bool, ``area``,
        ``bbox`` (x, y, w, h), ``predicted_iou``, ``point_coords``, ``stability_score``, ``crop_box``.

        ``image`` (a path, a PIL image or an (H, W, 3) array, as :meth:`SamPredictor.set_image`
        takes) is embedded first; None reuses the image already set on the predictor.
        """
        if image is not None:
            self.predictor.set_image(image)
        elif not self.predictor.is_image_set:
            raise MlxnetError("generate: no image given and none set on the predictor")
        h, w = self.predictor.original_size
        points = self.point_grid * np.array([[w, h]])
        parts = [self._process_batch(points[i:i + self.points_per_batch], (h, w))
                 for i in range(0, len(points), self.points_per_batch)]
        data = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        if len(data["iou_preds"]):
            keep = np.array(nms(mx.array(data["boxes"].astype(np.float32)), mx.array(data["iou_preds"]),
                                iou_threshold=self.box_nms_thresh, max_det=len(data["iou_preds"])))
            data = {k: v[keep] for k, v in data.items()}
        return [{
            "segmentation": data["masks"][i],
            "area": int(data["masks"][i].sum()),
            "bbox": [int(b) for b in (data["boxes"][i, 0], data["boxes"][i, 1],
                                      data["boxes"][i, 2] - data["boxes"][i, 0],
                                      data["boxes"][i, 3] - data["boxes"][i, 1])],
            "predicted_iou": float(data["iou_preds"][i]),
            "point_coords": [data["points"][i].tolist()],
            "stability_score": float(data["stability"][i]),
            "crop_box": [0, 0, w, h],
        } for i in range(len(data["iou_preds"]))]

    def _process_batch(self, points: np.ndarray, size: tuple[int, int]) -> dict[str, np.ndarray]:
        model = self.predictor.model
        coords = apply_coords(points, size, model.img_size).astype(np.float32)
        logits, iou, _ = self.predictor.predict_batch(
            mx.array(coords)[:, None, :], mx.ones((len(points), 1), mx.int32),
            multimask_output=True, return_logits=True)
        logits = logits.reshape(-1, *logits.shape[2:])
        iou = np.array(iou.astype(mx.float32)).reshape(-1)
        pts = np.repeat(points, logits.shape[0] // len(points), axis=0)
        keep = np.arange(len(iou))
        if self.pred_iou_thresh > 0.0:  # as SAM: a threshold <= 0 disables the filter
            keep = keep[iou[keep] > self.pred_iou_thresh]
        logits = logits[mx.array(keep)] if len(keep) else logits[:0]
        stab = np.array(stability_score(logits, model.mask_threshold, self.stability_score_offset))
        if self.stability_score_thresh > 0.0:
            sel = np.nonzero(stab >= self.stability_score_thresh)[0]
            logits, keep, stab = (logits[mx.array(sel)] if len(sel) else logits[:0]), keep[sel], stab[sel]
        masks = logits > model.mask_threshold
        boxes = masks_to_boxes(masks)
        return {"masks": np.array(masks), "boxes": np.array(boxes), "iou_preds": iou[keep],
                "points": pts[keep], "stability": stab}
