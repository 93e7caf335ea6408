"""Segment everything: SAM's automatic mask generator (``SamAutomaticMaskGenerator``).

A regular grid of single foreground points is run through the predictor in batches (three masks
per point); masks are kept when the predicted IoU exceeds ``pred_iou_thresh`` and the stability
score (IoU of the mask thresholded at ±``stability_score_offset``) reaches
``stability_score_thresh``; duplicates are removed by box NMS on the predicted IoU. Crop layers
and small-region cleanup of the original are not implemented (single full-image crop).

The result is SAM's, computed in another order to bound time and memory: the IoU filter runs on
the decoder's scores before any mask is upscaled (SAM upscales all three masks of every point,
then drops most of them); masks are upscaled a few at a time (:data:`UPSCALE_BYTES`); the ones
kept wait for NMS bit-packed (an eighth of a bool mask), and only NMS's survivors are unpacked.
Peak memory is then one decoder batch plus the kept masks, whatever the grid.
"""
from __future__ import annotations

from typing import Any, Callable

import mlx.core as mx
import numpy as np

from mlxnet.errors import MlxnetError
from mlxnet.image import ImageInput
from mlxnet.ops import nms

from .sam import SamPredictor, apply_coords

# Points through the mask decoder at a time. Its activations take ~50 MB a point in float32 (the
# 64×64×256 image tokens and the 256×256×32 upscaled features, per prompt): 3 GB for SAM's batch
# of 64, under 1 GB for 16, which run as fast. A batch of points is decoded in such parts; the
# masks differ from one 64-point call by float32 rounding only (as with another points_per_batch).
DECODE_POINTS = 16
# Float32 logits upscaled at a time (128 MiB: 36 masks of a 1080×810 photo). The matrix products
# are as fast on a few masks as on many; memory is not.
UPSCALE_BYTES = 2**27

Progress = Callable[[int, int], None]  # (points done, points in all), after each batch


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
    """Masks for everything in an image, like segment-anything's generator (no crop layers).

    ``progress``: called with (points done, points in all) after each batch of points; None
    (the default) reports nothing. ``mlxnet segment --everything`` draws its progress bar with it.
    """

    def __init__(self, predictor: SamPredictor, points_per_side: int = 32, points_per_batch: int = 64,
                 pred_iou_thresh: float = 0.88, stability_score_thresh: float = 0.95,
                 stability_score_offset: float = 1.0, box_nms_thresh: float = 0.7,
                 point_grid: np.ndarray | None = None, progress: Progress | None = None) -> None:
        if (points_per_side is None) == (point_grid is None):
            raise MlxnetError("SamAutomaticMaskGenerator: give exactly one of points_per_side and point_grid")
        if points_per_side is not None and points_per_side < 1:
            raise MlxnetError(f"SamAutomaticMaskGenerator: points_per_side must be >= 1, got {points_per_side}")
        if points_per_batch < 1:
            raise MlxnetError(f"SamAutomaticMaskGenerator: points_per_batch must be >= 1, got {points_per_batch}")
        if progress is not None and not callable(progress):
            raise MlxnetError(f"SamAutomaticMaskGenerator: progress must be a callable (points done, points "
                              f"in all) or None, got {type(progress).__name__}")
        self.predictor = predictor
        self.point_grid = build_point_grid(points_per_side) if point_grid is None else np.asarray(point_grid)
        self.points_per_batch = points_per_batch
        self.pred_iou_thresh = pred_iou_thresh
        self.stability_score_thresh = stability_score_thresh
        self.stability_score_offset = stability_score_offset
        self.box_nms_thresh = box_nms_thresh
        self.progress = progress

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
        parts = []
        for start in range(0, len(points), self.points_per_batch):
            parts.append(self._process_batch(points[start:start + self.points_per_batch], (h, w)))
            if self.progress is not None:
                self.progress(min(start + self.points_per_batch, len(points)), len(points))
        data = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        if len(data["iou_preds"]):
            keep = np.array(nms(mx.array(data["boxes"].astype(np.float32)), mx.array(data["iou_preds"]),
                                iou_threshold=self.box_nms_thresh, max_det=len(data["iou_preds"])))
            data = {k: v[keep] for k, v in data.items()}
        masks = [np.unpackbits(m, axis=-1, count=w).view(bool) for m in data["packed_masks"]]
        return [{
            "segmentation": masks[i],
            "area": int(data["areas"][i]),
            "bbox": [int(b) for b in (data["boxes"][i, 0], data["boxes"][i, 1],
                                      data["boxes"][i, 2] - data["boxes"][i, 0],
                                      data["boxes"][i, 3] - data["boxes"][i, 1])],
            "predicted_iou": float(data["iou_preds"][i]),
            "point_coords": [data["points"][i].tolist()],
            "stability_score": float(data["stability"][i]),
            "crop_box": [0, 0, w, h],
        } for i in range(len(masks))]

    def _process_batch(self, points: np.ndarray, size: tuple[int, int]) -> dict[str, np.ndarray]:
        """The masks of a batch of points that pass both thresholds (bit-packed), with their
        boxes, areas, scores and points."""
        low_res, iou = self._decode(points, size)
        keep = np.arange(len(iou))
        if self.pred_iou_thresh > 0.0:  # as SAM: a threshold <= 0 disables the filter
            keep = keep[iou > self.pred_iou_thresh]  # before upscaling: nothing else looks at the rest
        per_chunk = max(1, UPSCALE_BYTES // (4 * size[0] * size[1]))
        chunks = [_no_masks(size)] + [self._upscale_and_filter(low_res, keep[i:i + per_chunk])
                                      for i in range(0, len(keep), per_chunk)]
        data = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
        index = data.pop("index")
        points_of_masks = np.repeat(points, len(iou) // len(points), axis=0)
        return {**data, "iou_preds": iou[index], "points": points_of_masks[index]}

    def _decode(self, points: np.ndarray, size: tuple[int, int]) -> tuple[mx.array, np.ndarray]:
        """Low-res logits (N, 256, 256) of every point's three masks and their predicted IoUs (N,),
        :data:`DECODE_POINTS` points at a time."""
        coords = mx.array(apply_coords(points, size, self.predictor.model.img_size).astype(np.float32))[:, None]
        parts = []
        for start in range(0, len(points), DECODE_POINTS):
            chunk = coords[start:start + DECODE_POINTS]
            part = self.predictor.predict_low_res(chunk, mx.ones((chunk.shape[0], 1), mx.int32),
                                                  multimask_output=True)
            mx.eval(part)  # now, so that its activations are freed before the next part's
            parts.append(part)
        low_res = mx.concatenate([p[0] for p in parts])
        iou = mx.concatenate([p[1] for p in parts]).astype(mx.float32)
        return low_res.reshape(-1, *low_res.shape[2:]), np.array(iou).reshape(-1)

    def _upscale_and_filter(self, low_res: mx.array, index: np.ndarray) -> dict[str, np.ndarray]:
        """Masks ``index`` of the batch at the original size, those stable enough kept."""
        threshold = self.predictor.model.mask_threshold
        logits = self.predictor.upscale_masks(low_res[mx.array(index)])
        stability = stability_score(logits, threshold, self.stability_score_offset)
        masks = logits > threshold
        boxes, areas = masks_to_boxes(masks), masks.sum(axis=(-2, -1))
        mx.eval(stability, masks, boxes, areas)
        del logits  # the largest array of the batch: gone before the next chunk is upscaled
        stability = np.array(stability)
        passing = np.arange(len(index))
        if self.stability_score_thresh > 0.0:
            passing = passing[stability >= self.stability_score_thresh]
        return {"index": index[passing], "packed_masks": np.packbits(np.array(masks)[passing], axis=-1),
                "boxes": np.array(boxes)[passing], "areas": np.array(areas).astype(np.int64)[passing],
                "stability": stability[passing]}


def _no_masks(size: tuple[int, int]) -> dict[str, np.ndarray]:
    """:meth:`SamAutomaticMaskGenerator._upscale_and_filter`'s fields, empty (the concatenation's start)."""
    h, w = size
    return {"index": np.zeros(0, np.int64), "packed_masks": np.zeros((0, h, (w + 7) // 8), np.uint8),
            "boxes": np.zeros((0, 4), np.int32), "areas": np.zeros(0, np.int64),
            "stability": np.zeros(0, np.float32)}
