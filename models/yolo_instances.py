"""Instance masks and keypoints of segment and pose models, as ultralytics' predictors make them.

masks:      process_mask_native (``retina_masks=True``: masks at the image's own resolution). Each
            detection's mask logits are its coefficients times the prototypes (stride 4); the
            stack is upsampled by the smallest factor (1, 2 or 4) that puts the letterbox's
            padding on whole pixels, the padding cut off, the rest resized to the image
            (bilinear, half-pixel centres), thresholded at 0 and cut to the detection's box
            (pixel columns x1 <= c < x2, rows alike). Detections whose mask is then empty are
            dropped, as ultralytics drops them.
keypoints:  scale_coords: the letterbox undone (padding, then gain) and clipped to the image;
            a third column, where the model has one, is the visibility probability.
"""
from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from .yolo_process import letterbox_ratio_pad

def instance_masks(protos: mx.array, coefficients: mx.array, boxes: np.ndarray,
                   image_hw: tuple[int, int]) -> np.ndarray:
    """(K, H, W) bool masks on the image from the prototypes (mh, mw, nm) of its letterboxed
    input, the detections' coefficients (K, nm) and their boxes on the image (K, 4) xyxy.

    Each axis's upsampling, crop and resize are one linear map (two bilinear interpolations
    composed), so a mask is ``rows @ logits @ cols.T``: two matrix products on the device."""
    h, w = image_hw
    k = coefficients.shape[0]
    if k == 0:
        return np.zeros((0, h, w), bool)
    mh, mw, nm = protos.shape
    logits = (coefficients.astype(mx.float32) @ protos.reshape(-1, nm).astype(mx.float32).T).reshape(k, mh, mw)
    gain = min(4 * mh / h, 4 * mw / w)
    pad = (4 * mh - max(round(h * gain), 1)) | (4 * mw - max(round(w * gain), 1))
    f = 4 // math.gcd(4, pad | pad // 2)
    # scale_masks on the f-times upsampled maps: the content's span from the two shapes.
    gain = min(f * mh / h, f * mw / w)
    top = round((f * mh - max(round(h * gain), 1)) / 2 - 0.1)
    left = round((f * mw - max(round(w * gain), 1)) / 2 - 0.1)
    rows = _axis_map(mh, f, top, top + max(round(h * gain), 1), h)
    cols = _axis_map(mw, f, left, left + max(round(w * gain), 1), w)
    masks = (mx.array(rows) @ logits @ mx.array(cols).T) > 0
    return crop_to_boxes(np.array(masks), boxes)


def _bilinear(n_in: int, n_out: int, scale: float) -> np.ndarray:
    """(n_out, n_in) weights of a bilinear resize along one axis as PyTorch's interpolate
    computes it (half-pixel centres, no antialiasing, edges clamped)."""
    src = np.maximum((np.arange(n_out) + 0.5) * scale - 0.5, 0.0)
    lo = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    hi = np.minimum(lo + 1, n_in - 1)
    frac = src - lo
    out = np.zeros((n_out, n_in))
    np.add.at(out, (np.arange(n_out), lo), 1 - frac)
    np.add.at(out, (np.arange(n_out), hi), frac)
    return out


def _axis_map(m: int, f: int, lo: int, hi: int, n: int) -> np.ndarray:
    """(n, m) float32: upsample m by f, keep [lo, hi), resize that to n."""
    up = _bilinear(m, m * f, 1 / f) if f > 1 else np.eye(m)
    return (_bilinear(hi - lo, n, (hi - lo) / n) @ up[lo:hi]).astype(np.float32)


def crop_to_boxes(masks: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Masks (K, H, W) zeroed outside their boxes (K, 4) xyxy: pixel (r, c) stays where
    x1 <= c < x2 and y1 <= r < y2."""
    _, h, w = masks.shape
    cols, rows = np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32)
    b = boxes.astype(np.float32)
    inside_x = (cols[None] >= b[:, 0:1]) & (cols[None] < b[:, 2:3])  # (K, W)
    inside_y = (rows[None] >= b[:, 1:2]) & (rows[None] < b[:, 3:4])  # (K, H)
    return masks & inside_y[:, :, None] & inside_x[:, None, :]


def keypoints_to_image(points: np.ndarray, input_hw: tuple[int, int], image_hw: tuple[int, int]) -> np.ndarray:
    """Keypoints (K, P, 2 or 3) on the letterboxed input -> on the image, clipped to it."""
    (gain_h, gain_w), (pad_x, pad_y) = letterbox_ratio_pad(input_hw, image_hw)
    out = points.astype(np.float32, copy=True)
    out[..., 0] = np.clip((out[..., 0] - pad_x) / gain_w, 0, image_hw[1])
    out[..., 1] = np.clip((out[..., 1] - pad_y) / gain_h, 0, image_hw[0])
    return out
