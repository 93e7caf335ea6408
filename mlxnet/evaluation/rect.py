"""``yolo val``'s rect batches: the letterbox shape each image gets, from the dataset's image sizes.

ultralytics' val dataset (rect, pad 0.5) sorts the images by aspect ratio (height / width), cuts
the sorted list into batches of ``batch``, and gives each batch one shape: with the batch's
lowest and highest ratios ``lo`` and ``hi``, [hi, 1] if every image is wider than tall (hi < 1),
[1, 1 / lo] if every one is taller than wide (lo > 1), else [1, 1]; times ``imgsz / stride``,
plus ``pad``, rounded up, times ``stride``. So a 640 x 480 photo at imgsz 640 runs at 512 x 672,
not at the 480 x 640 of a letterbox of its own. The sizes are the headers' (EXIF orientation
applied, as ultralytics reads them), so the shapes are known before any image is decoded.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np

# EXIF orientations that swap width and height (rotated 90 or 270 degrees, mirrored or not).
_SWAPPING = {5, 6, 7, 8}


def image_hw(path: str | Path) -> tuple[int, int] | None:
    """(height, width) of an image file as displayed (EXIF orientation applied), from its header;
    None where the header does not read (the image then fails when it is decoded)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            w, h = im.size
            if im.getexif().get(274) in _SWAPPING:
                w, h = h, w
            return h, w
    except Exception:  # noqa: BLE001 - any unreadable header: no rect shape, the decode reports it
        return None


def batch_shapes(sizes: Sequence[tuple[int, int]], batch: int, imgsz: int, stride: int = 32,
                 pad: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """The images of ``sizes`` ((H, W) each) in ``yolo val``'s order, and each image's letterbox
    shape: (order (N,), shapes (N, 2) as (H, W) in input order). The order is numpy's default
    argsort of the ratios, as ultralytics sorts them, so tied ratios fall into the same batches."""
    if not len(sizes):
        return np.zeros(0, np.int64), np.zeros((0, 2), np.int64)
    s = np.asarray(sizes, np.float64)
    ratio = s[:, 0] / s[:, 1]
    order = ratio.argsort()
    ratio = ratio[order]
    shapes = np.zeros((len(sizes), 2), np.int64)
    for start in range(0, len(sizes), batch):
        lo, hi = ratio[start:start + batch].min(), ratio[start:start + batch].max()
        unit = [hi, 1.0] if hi < 1 else [1.0, 1 / lo] if lo > 1 else [1.0, 1.0]
        shape = [math.ceil(u * imgsz / stride + pad) * stride for u in unit]
        shapes[order[start:start + batch]] = shape
    return order, shapes
