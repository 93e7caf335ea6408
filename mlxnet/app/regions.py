"""Where to erase: SAM masks from points and boxes, YOLOv8 instances turned into masks, dilation.

A click in the app and a ``--point`` of ``mlxnet erase`` go through the SAM predictor's
``predict_best``: the prompt encoder and mask decoder on the cached image embedding, then only
the mask with the best predicted IoU is upsampled to the image. The models are reached through
:class:`mlxnet.app.models.Models` (their families), never imported here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from mlxnet.errors import MlxnetError

# Default dilation, in pixels on each side. SAM's masks hug an object's outline; LaMa needs the
# object's edge pixels (and a little of its shadow) inside the hole, or it copies them back in.
# Inpaint-Anything dilates with a 15 px square kernel; 15 px a side is a little wider, which
# suits the photos of 1-12 MP that this tool takes.
DILATE_PX = 15


def dilate(mask: np.ndarray, px: int) -> np.ndarray:
    """``mask`` grown by ``px`` pixels on every side: the maximum over a (2·px+1)² square window,
    as cv2.dilate with a square kernel. Computed with running sums (time independent of ``px``)
    on the mask's bounding box only."""
    mask = np.asarray(mask, dtype=bool)
    if px < 0:
        raise MlxnetError(f"dilate: px must be >= 0, got {px}")
    box = bounding_box(mask)
    if px == 0 or box is None:
        return mask.copy()
    h, w = mask.shape
    x0, y0, x1, y1 = box
    x0, y0, x1, y1 = max(0, x0 - px), max(0, y0 - px), min(w, x1 + px), min(h, y1 + px)
    grown = _grow(_grow(mask[y0:y1, x0:x1], px, 0), px, 1)
    out = np.zeros_like(mask)
    out[y0:y1, x0:x1] = grown
    return out


def _grow(a: np.ndarray, px: int, axis: int) -> np.ndarray:
    """Max over a window of 2·px+1 along ``axis`` (zero outside), as a difference of running sums."""
    a = np.moveaxis(a, axis, 0)
    n, k = a.shape[0], 2 * px + 1
    sums = np.zeros((n + k,) + a.shape[1:], np.int32)
    np.cumsum(np.pad(a, [(px, px)] + [(0, 0)] * (a.ndim - 1)), axis=0, out=sums[1:])
    return np.moveaxis(sums[k:] - sums[:n] > 0, 0, axis)


def bounding_box(mask: np.ndarray) -> tuple[int, int, int, int] | None:
    """(x0, y0, x1, y1) of the set pixels, ends exclusive; None for an empty mask."""
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    if not len(rows):
        return None
    return int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1


def check_points(points: np.ndarray | None, size: tuple[int, int], what: str = "point") -> None:
    """Every (x, y) within the image of size (H, W)."""
    h, w = size
    for x, y in points if points is not None else []:
        if not (0 <= x <= w and 0 <= y <= h):
            raise MlxnetError(f"{what} {x:g},{y:g} lies outside the {w}x{h} image")


def check_box(box: Sequence[float], size: tuple[int, int], what: str = "box") -> None:
    x0, y0, x1, y1 = box
    if not (x0 < x1 and y0 < y1):
        raise MlxnetError(f"{what}: need X0 < X1 and Y0 < Y1, got {','.join(f'{v:g}' for v in box)}")
    check_points(np.array([[x0, y0], [x1, y1]], np.float64), size, what)


@dataclass
class Region:
    """What was selected in one image: the union mask and what made it."""

    mask: np.ndarray
    scores: list[float] = field(default_factory=list)  # SAM's predicted IoU per prompt
    instances: list[dict] = field(default_factory=list)  # --class detections (box, score, class, name)

    def add(self, mask: np.ndarray) -> None:
        self.mask |= mask


def select(image: np.ndarray, *, sam=None, detector=None, points: np.ndarray | None = None,
           labels: np.ndarray | None = None, boxes: Sequence[Sequence[float]] = (),
           mask: np.ndarray | None = None, classes: Sequence[int] | None = None,
           conf: float = 0.25) -> Region:
    """The union of every region asked for in ``image`` (H, W, 3):

    - ``points`` (N, 2) with ``labels`` (1 foreground, 0 background) with at least one
      foreground point: one SAM prompt;
    - each box (x0, y0, x1, y1): its own SAM prompt, refined by the background points if any;
    - ``mask``: (H, W) bool, added as it is;
    - ``classes``: the YOLO ``detector`` finds every instance of these class ids (score >=
      ``conf``); a segment model's own mask of each is added as it is, a detection model's box
      is a SAM prompt.

    ``sam`` is a SAM predictor (``Models.sam()``); the image is embedded once, on a fresh
    predictor sharing its weights (``sam`` itself keeps whatever image it holds), and only
    where a prompt needs it."""
    h, w = image.shape[:2]
    region = Region(np.zeros((h, w), bool))
    if mask is not None:
        if mask.shape != (h, w):
            raise MlxnetError(f"mask is {mask.shape[1]}x{mask.shape[0]} but the image is {w}x{h}")
        region.add(np.asarray(mask, bool))
    positive = points is not None and len(points) and bool(np.any(np.asarray(labels) == 1))
    detected: list[tuple[tuple, dict]] = []
    if classes:
        detections = detector.predict(image, conf=conf, classes=list(classes))
        for k, row in enumerate(detections.to_list()):
            row = {key: row[key] for key in ("box", "score", "class", "name")}
            region.instances.append(row)
            if detections.masks is not None:  # a segment model: the object's own mask
                region.add(detections.masks[k])
            else:
                detected.append((tuple(row["box"]), row))
    if not (positive or len(boxes) or detected):
        return region
    predictor = sam.fresh()
    predictor.set_image(image)
    if positive:
        found, score = predictor.predict_best(points, labels)
        region.add(found)
        region.scores.append(score)
    negative = None if points is None else np.asarray(points)[np.asarray(labels) == 0]
    negative = negative if negative is not None and len(negative) else None
    prompts = [(tuple(map(float, b)), None) for b in boxes] + detected
    for box, _ in prompts:
        neg_labels = None if negative is None else np.zeros(len(negative), np.int32)
        found, score = predictor.predict_best(negative, neg_labels, box)
        region.add(found)
        region.scores.append(score)
    return region
