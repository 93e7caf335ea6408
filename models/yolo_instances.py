"""Instance masks and keypoints of segment and pose models, as ultralytics' predictors make them.

masks:      process_mask_native (``retina_masks=True``: masks at the image's own resolution). Each
            detection's mask logits are its coefficients times the prototypes (stride 4); the
            stack is upsampled by the smallest factor (1, 2 or 4) that puts the letterbox's
            padding on whole pixels, the padding cut off, the rest resized to the image
            (bilinear, half-pixel centres), thresholded at 0 and cut to the detection's box
            (pixel columns x1 <= c < x2, rows alike; only those are computed). Detections whose
            mask is then empty are dropped, as ultralytics drops them.
keypoints:  scale_coords: the letterbox undone (padding, then gain) and clipped to the image;
            a third column, where the model has one, is the visibility probability.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import mlx.core as mx
import numpy as np

from mlxnet.errors import MlxnetError

RatioPad = tuple[tuple[float, float], tuple[float, float]]  # ((gain_h, gain_w), (pad_x, pad_y)), as yolo_process's

# COCO's person skeleton: pairs of keypoint indices (nose, eyes, ears, shoulders, elbows,
# wrists, hips, knees, ankles), as ultralytics draws it.
COCO_SKELETON = ((15, 13), (13, 11), (16, 14), (14, 12), (11, 12), (5, 11), (6, 12), (5, 6), (5, 7), (6, 8),
                 (7, 9), (8, 10), (1, 2), (0, 1), (0, 2), (1, 3), (2, 4), (3, 5), (4, 6))


@dataclass(frozen=True)
class MaskLayer:
    """Instance masks in their colours, to lay over the image they were made on, composed as
    ultralytics (8.4) draws a segment model's masks: a pixel under ``count`` masks keeps
    (1 - alpha)^count of itself and gains ``alpha`` of the largest value each channel has among
    their colours (``top``), in float32 on the 0-1 scale, truncated to 8 bits. The composition
    depends on which masks cover a pixel, not on their order, so a GPU makes it in a few
    reductions (:func:`instance_masks`); pixels under no mask stay as they are."""

    count: np.ndarray  # (H, W) uint8: the masks over each pixel (at most 255 counted)
    top: np.ndarray  # (H, W, 3) uint8: each channel's largest colour value among them (0: none)
    colours: np.ndarray  # (K, 3) uint8: the masks' colours, in order
    alpha: float

    def over(self, image: np.ndarray) -> np.ndarray:
        """A copy of ``image`` (H, W, 3) uint8 with the masks laid over it."""
        import cv2  # several times NumPy's float arithmetic on a photo

        out = np.array(image, dtype=np.uint8, copy=True, order="C")
        rows, cols = np.flatnonzero(self.count.any(axis=1)), np.flatnonzero(self.count.any(axis=0))
        if rows.size == 0:
            return out
        window = (slice(rows[0], rows[-1] + 1), slice(cols[0], cols[-1] + 1))  # only where masks lie
        count = np.ascontiguousarray(self.count[window])
        scale = np.float32(255)
        # ultralytics' float32 steps, (pixel / 255 * keep + top / 255 * alpha) * 255, each
        # quotient and power looked up (the same float32 values) and the products as OpenCV's
        # float32 products: (1 - alpha)^n a product of n factors, one after another.
        ratio = np.arange(256, dtype=np.float32) / scale
        powers = np.cumprod(np.concatenate([[np.float32(1)], np.full(255, np.float32(1) - np.float32(self.alpha))]),
                            dtype=np.float32)
        keep = cv2.LUT(cv2.merge((count, count, count)), powers)
        pixels = cv2.multiply(cv2.LUT(np.ascontiguousarray(out[window]), ratio), keep)
        pixels = cv2.add(pixels, cv2.LUT(np.ascontiguousarray(self.top[window]), ratio * np.float32(self.alpha)))
        pixels *= scale
        np.minimum(pixels, scale, out=pixels)
        part = np.ascontiguousarray(out[window])
        cv2.copyTo(pixels.astype(np.uint8), (count > 0).view(np.uint8), part)  # astype truncates, as ultralytics
        out[window] = part
        return out


def mask_layer(masks: "InstanceMasks", colours: np.ndarray, alpha: float) -> MaskLayer:
    """The :class:`MaskLayer` of masks in these colours (K, 3), made on the host from their
    in-box pixels (a GPU makes the same layer where it makes the masks: :func:`instance_masks`)."""
    import cv2  # 8-bit arithmetic: several times NumPy's on a photo's worth of masks

    colours = np.asarray(colours, np.uint8)
    count = np.zeros(masks.image_hw, np.uint8)
    top = np.zeros((*masks.image_hw, 3), np.uint8)
    for crop, (c0, r0, c1, r1), colour in zip(masks.crops, masks.spans, colours):
        if not crop.any():
            continue
        inside = crop.view(np.uint8)
        tinted = cv2.multiply(cv2.merge((inside, inside, inside)), tuple(float(v) for v in colour) + (0.0,))
        top[r0:r1, c0:c1] = cv2.max(top[r0:r1, c0:c1], tinted)
        count[r0:r1, c0:c1] = cv2.add(count[r0:r1, c0:c1], inside)  # saturating at 255
    return MaskLayer(count, top, colours, alpha)


class InstanceMasks:
    """K boolean instance masks on an (H, W) image, each kept as the part inside its box (a
    detection's mask is cut to its box, so every pixel outside is False): memory, transfers and
    drawing grow with the boxes' area, not K whole images.

    ``spans`` (K, 4) int: each mask's [c0, r0, c1, r1) on the image; ``crops``: its (r1 - r0,
    c1 - c0) pixels. Indexing with an int gives that mask whole (H, W); with an index array, a
    slice or a boolean mask, the chosen masks; ``np.asarray`` gives them all whole (K, H, W).

    Masks made on a GPU stay there (``flat``: every crop's pixels, one after another) until
    their pixels are first read; ``layer``, where made beside them, is their :class:`MaskLayer`
    (drawing then needs no mask on the host) and ``filled`` which of them have a pixel. Masks
    made to be drawn only (``instance_masks(pixels=False)``) have those two and no pixels."""

    def __init__(self, image_hw: tuple[int, int], spans: np.ndarray, crops: Sequence[np.ndarray] | None = None, *,
                 flat: mx.array | None = None, layer: MaskLayer | None = None,
                 filled: np.ndarray | None = None) -> None:
        self.image_hw = (int(image_hw[0]), int(image_hw[1]))
        self.spans = np.asarray(spans, np.int64).reshape(-1, 4)
        if crops is not None and flat is not None:
            raise ValueError("InstanceMasks takes crops or flat, not both")
        if crops is None and flat is None and (layer is None or filled is None):
            raise ValueError("InstanceMasks without pixels needs their layer and which are filled")
        self._crops = None if crops is None else tuple(crops)
        # On the device: the flat pixels of these spans' crops, and which of them are these masks.
        self._source = None if flat is None else (flat, self.spans, np.arange(len(self.spans)))
        self.layer = layer
        self._filled = None if filled is None else np.asarray(filled, bool)
        if self._crops is not None and len(self._crops) != len(self.spans):
            raise ValueError(f"{len(self._crops)} crops for {len(self.spans)} spans")

    @classmethod
    def from_dense(cls, masks: np.ndarray) -> "InstanceMasks":
        """(K, H, W) bool masks, each kept within its pixels' bounding box."""
        masks = np.asarray(masks, bool)
        spans = np.zeros((len(masks), 4), np.int64)
        for i, m in enumerate(masks):
            rows, cols = np.flatnonzero(m.any(axis=1)), np.flatnonzero(m.any(axis=0))
            if rows.size:
                spans[i] = cols[0], rows[0], cols[-1] + 1, rows[-1] + 1
        return cls(masks.shape[1:], spans, [m[r0:r1, c0:c1].copy() for m, (c0, r0, c1, r1) in zip(masks, spans)])

    @property
    def crops(self) -> tuple[np.ndarray, ...]:
        if self._crops is None and self._source is None:
            raise MlxnetError("these instance masks were made to be drawn only, without their pixels "
                              "(pixels=False); make them with pixels=True to read them")
        if self._crops is None:  # first read of masks made on a GPU: their pixels cross now, at once
            flat, spans, picked = self._source
            sizes = (spans[:, 3] - spans[:, 1]) * (spans[:, 2] - spans[:, 0])
            pieces = np.split(np.array(flat), np.cumsum(sizes)[:-1])
            self._crops = tuple(pieces[i].reshape(r1 - r0, c1 - c0) for i, (c0, r0, c1, r1) in zip(picked, self.spans))
        return self._crops

    def __len__(self) -> int:
        return len(self.spans)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (len(self), *self.image_hw)

    def __getitem__(self, index):
        if isinstance(index, (int, np.integer)):
            out = np.zeros(self.image_hw, bool)
            c0, r0, c1, r1 = self.spans[index]
            out[r0:r1, c0:c1] = self.crops[index]
            return out
        chosen = np.arange(len(self))[index]
        layer = None
        if self.layer is not None:
            # The layer still draws the chosen masks when the others are empty.
            dropped = np.ones(len(self), bool)
            dropped[chosen] = False
            if len(np.unique(chosen)) == len(chosen) and not self.non_empty()[dropped].any():
                layer = MaskLayer(self.layer.count, self.layer.top, self.layer.colours[chosen], self.layer.alpha)
        filled = None if self._filled is None else self._filled[chosen]
        if self._crops is not None:
            return InstanceMasks(self.image_hw, self.spans[chosen], [self._crops[i] for i in chosen], layer=layer,
                                 filled=filled)
        if self._source is None:
            if layer is None:
                raise MlxnetError("cannot drop a filled mask from masks made without their pixels (pixels=False)")
            return InstanceMasks(self.image_hw, self.spans[chosen], layer=layer, filled=filled)
        out = InstanceMasks(self.image_hw, self.spans[chosen], flat=self._source[0], layer=layer, filled=filled)
        out._source = (self._source[0], self._source[1], self._source[2][chosen])  # still on the device
        return out

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self.dense()
        return out if dtype is None else out.astype(dtype)

    def dense(self) -> np.ndarray:
        """(K, H, W) bool: every mask whole."""
        out = np.zeros(self.shape, bool)
        for i, ((c0, r0, c1, r1), crop) in enumerate(zip(self.spans, self.crops)):
            out[i, r0:r1, c0:c1] = crop
        return out

    def union(self) -> np.ndarray:
        """(H, W) bool: the pixels of any mask."""
        if self.layer is not None:
            return self.layer.count > 0
        out = np.zeros(self.image_hw, bool)
        for (c0, r0, c1, r1), crop in zip(self.spans, self.crops):
            out[r0:r1, c0:c1] |= crop
        return out

    def non_empty(self) -> np.ndarray:
        """(K,) which masks have a pixel."""
        if self._filled is None:
            self._filled = np.array([crop.any() for crop in self.crops], bool)
        return self._filled

    def origins(self) -> list[tuple[int, int]]:
        """Each crop's top-left pixel (row, column) on the image."""
        return [(int(r0), int(c0)) for c0, r0, _, _ in self.spans]

    def over(self, image: np.ndarray, colours: np.ndarray, alpha: float) -> np.ndarray:
        """A copy of the image with the masks laid over it in these colours (:class:`MaskLayer`)."""
        colours = np.asarray(colours, np.uint8)
        layer = self.layer
        if layer is None or layer.alpha != alpha or not np.array_equal(layer.colours, colours):
            layer = mask_layer(self, colours, alpha)
        return layer.over(image)


def instance_masks(protos: mx.array, coefficients: mx.array, boxes: np.ndarray, image_hw: tuple[int, int],
                   ratio_pad: RatioPad | None = None, colours: np.ndarray | None = None,
                   alpha: float = 0.5, pixels: bool = True) -> InstanceMasks:
    """The K masks on the image from the prototypes (mh, mw, nm) of its letterboxed input, the
    detections' coefficients (K, nm) and their boxes on the image (K, 4) xyxy.

    Each axis's upsampling, crop and resize are one linear map (two bilinear interpolations
    composed), so a mask is ``rows @ logits @ cols.T``; and since a mask is cut to its box, only
    the box's rows and columns of the maps are multiplied. ``ratio_pad``: a letterbox's known
    gains and padding (``yolo val``'s rect shapes), whose content span the prototypes are sampled
    over directly; None: the predictor's letterbox, the span from the shapes, as ultralytics'
    retina path. ``colours`` (K, 3): the colours they will be drawn in, with ``alpha``, so that a
    GPU makes their :class:`MaskLayer` where the masks are; there, ``pixels=False`` (with
    ``colours``) keeps only that layer and which masks are filled: masks to be drawn and never
    read cost no cutting to their boxes."""
    h, w = image_hw
    k = coefficients.shape[0]
    spans = box_spans(boxes, image_hw)
    if k == 0:
        return InstanceMasks(image_hw, spans, [])
    mh, mw, nm = protos.shape
    logits = (coefficients.astype(mx.float32) @ protos.reshape(-1, nm).astype(mx.float32).T).reshape(k, mh, mw)
    if ratio_pad is not None:
        (gain_h, gain_w), (pad_x, pad_y) = ratio_pad
        rows = _span_map(mh, pad_y / 4, (pad_y + h * gain_h) / 4, h)
        cols = _span_map(mw, pad_x / 4, (pad_x + w * gain_w) / 4, w)
    else:
        gain = min(4 * mh / h, 4 * mw / w)
        pad = (4 * mh - max(round(h * gain), 1)) | (4 * mw - max(round(w * gain), 1))
        f = 4 // math.gcd(4, pad | pad // 2)
        # scale_masks on the f-times upsampled maps: the content's span from the two shapes.
        gain = min(f * mh / h, f * mw / w)
        top = round((f * mh - max(round(h * gain), 1)) / 2 - 0.1)
        left = round((f * mw - max(round(w * gain), 1)) / 2 - 0.1)
        rows = _axis_map(mh, f, top, top + max(round(h * gain), 1), h)
        cols = _axis_map(mw, f, left, left + max(round(w * gain), 1), w)
    if mx.default_device().type == mx.DeviceType.gpu:
        return _masks_on_device(logits, rows, cols, spans, image_hw, colours, alpha, pixels or colours is None)
    logits = np.array(logits)  # prototype resolution: small, on the host
    crops = [(rows[r0:r1] @ logits[i]) @ cols[c0:c1].T > 0 if c1 > c0 and r1 > r0
             else np.zeros((max(r1 - r0, 0), max(c1 - c0, 0)), bool) for i, (c0, r0, c1, r1) in enumerate(spans)]
    return InstanceMasks(image_hw, spans, crops)


def box_spans(boxes: np.ndarray, image_hw: tuple[int, int]) -> np.ndarray:
    """(K, 4) whole-pixel [c0, r0, c1, r1) spans of xyxy boxes on the image: the pixels (r, c)
    with x1 <= c < x2 and y1 <= r < y2, c from ceil(x1) to ceil(x2) (ultralytics' crop_mask);
    an inverted box's span is empty (c1 = c0 or r1 = r0)."""
    h, w = image_hw
    spans = np.ceil(np.nan_to_num(np.asarray(boxes, np.float64).reshape(-1, 4)))
    spans = np.clip(spans, 0, [w, h, w, h]).astype(np.int64)
    spans[:, 2:] = np.maximum(spans[:, 2:], spans[:, :2])
    return spans


# The float32 logits of the masks made at once on a GPU at the image's size: the peak memory.
DEVICE_MASK_BYTES = 64 << 20


def _masks_on_device(logits: mx.array, rows: np.ndarray, cols: np.ndarray, spans: np.ndarray,
                     image_hw: tuple[int, int], colours: np.ndarray | None, alpha: float,
                     pixels: bool = True) -> InstanceMasks:
    """The masks computed on a GPU: whole masks a few at a time (one batched product each, a few
    milliseconds there, where the host's per-box products are most of a photo's time), cut to
    their boxes there and kept there. Only which are empty and, given ``colours``, their
    :class:`MaskLayer` (as :func:`mask_layer` makes it) come to the host: their pixels follow
    when read."""
    h, w = image_hw
    rows_d, cols_t = mx.array(rows), mx.array(cols).T
    ys, xs = mx.arange(h)[None, :, None], mx.arange(w)[None, None, :]
    at_once = max(1, DEVICE_MASK_BYTES // (4 * h * w))
    sizes = (spans[:, 3] - spans[:, 1]) * (spans[:, 2] - spans[:, 0])
    parts, filled = [], []
    count, top = mx.zeros((h, w), mx.int32), mx.zeros((h, w, 3), mx.uint8)
    if colours is not None:
        colours = np.asarray(colours, np.uint8)
        on_device = mx.array(colours)
    for start in range(0, len(spans), at_once):
        s = mx.array(spans[start:start + at_once, :, None, None])
        inside = (ys >= s[:, 1]) & (ys < s[:, 3]) & (xs >= s[:, 0]) & (xs < s[:, 2])
        cut = ((rows_d @ logits[start:start + at_once]) @ cols_t > 0) & inside
        filled.append(cut.any(axis=(1, 2)))
        if pixels:  # each crop a copy: a few launches a mask
            parts += [cut[j, r0:r1, c0:c1].reshape(-1)
                      for j, (c0, r0, c1, r1) in enumerate(spans[start:start + at_once].tolist()) if sizes[start + j]]
        if colours is not None:  # a few reductions a chunk, whatever its masks' order
            tints = on_device[start:start + at_once, None, None, :]
            top = mx.maximum(top, (cut[..., None] * tints).max(axis=0))
            count = count + cut.astype(mx.int32).sum(axis=0)
    flat = None if not pixels else mx.concatenate(parts) if parts else mx.zeros((0,), mx.bool_)
    layer = None
    if colours is not None:
        count = mx.minimum(count, 255).astype(mx.uint8)
        mx.eval(flat, count, top, *filled)  # one wait for all
        layer = MaskLayer(np.array(count), np.array(top), colours, alpha)
    mx.eval(flat, *filled)
    return InstanceMasks(image_hw, spans, flat=flat, layer=layer, filled=np.concatenate([np.array(f) for f in filled]))


def _taps(n_in: int, n_out: int, scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A bilinear resize along one axis as PyTorch's interpolate computes it (half-pixel centres,
    no antialiasing, edges clamped): each output pixel's two input pixels and the second's weight."""
    src = np.maximum((np.arange(n_out) + 0.5) * scale - 0.5, 0.0)
    lo = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    return lo, np.minimum(lo + 1, n_in - 1), src - lo


def _span_map(m: int, lo: float, hi: float, n: int) -> np.ndarray:
    """(n, m) float32: the span [lo, hi) of an axis of m pixels resampled to n (bilinear)."""
    src = np.clip(lo + (np.arange(n) + 0.5) * (hi - lo) / n - 0.5, 0, m - 1)
    low = np.minimum(np.floor(src).astype(np.int64), m - 1)
    high = np.minimum(low + 1, m - 1)
    out = np.zeros((n, m))
    np.add.at(out, (np.arange(n), low), 1 - (src - low))
    np.add.at(out, (np.arange(n), high), src - low)
    return out.astype(np.float32)


def _axis_map(m: int, f: int, lo: int, hi: int, n: int) -> np.ndarray:
    """(n, m) float32: upsample m by f, keep [lo, hi), resize that to n. Both steps are bilinear,
    two taps each, so each output row mixes at most four of the m pixels: the map is made from
    those (a photo's axis is thousands of pixels, and a dense product of the two steps' maps was
    most of a segment photo's host time)."""
    if f > 1:
        near, far, weight = _taps(m, m * f, 1 / f)
    else:
        near = far = np.arange(m)
        weight = np.zeros(m)
    first, second, frac = _taps(hi - lo, n, (hi - lo) / n)
    first, second = first + lo, second + lo
    columns = np.stack([near[first], far[first], near[second], far[second]], axis=1)
    weights = np.stack([(1 - frac) * (1 - weight[first]), (1 - frac) * weight[first],
                        frac * (1 - weight[second]), frac * weight[second]], axis=1)
    cells = (np.arange(n)[:, None] * m + columns).reshape(-1)
    return np.bincount(cells, weights.reshape(-1), minlength=n * m).reshape(n, m).astype(np.float32)


def keypoints_to_image(points: np.ndarray, ratio_pad: RatioPad, image_hw: tuple[int, int]) -> np.ndarray:
    """Keypoints (K, P, 2 or 3) on the letterboxed input -> on the image (the letterbox's gains
    and padding undone), clipped to it."""
    (gain_h, gain_w), (pad_x, pad_y) = ratio_pad
    out = points.astype(np.float32, copy=True)
    out[..., 0] = np.clip((out[..., 0] - pad_x) / gain_w, 0, image_hw[1])
    out[..., 1] = np.clip((out[..., 1] - pad_y) / gain_h, 0, image_hw[0])
    return out


def mask_outline(mask: np.ndarray) -> np.ndarray:
    """A mask's outline as one polygon (P, 2) float32 in pixels, as ultralytics' masks2segments
    (strategy "all") makes it: its outer contours (OpenCV, simple chains), several joined into
    one path through their closest points; (0, 2) for an empty mask."""
    import cv2

    contours = cv2.findContours(np.ascontiguousarray(mask, dtype=np.uint8), cv2.RETR_EXTERNAL,
                                cv2.CHAIN_APPROX_SIMPLE)[0]
    if not contours:
        return np.zeros((0, 2), np.float32)
    parts = [c.reshape(-1, 2).astype(np.int64) for c in contours]
    return (np.concatenate(_joined(parts)) if len(parts) > 1 else parts[0]).astype(np.float32)


def _closest_pair(a: np.ndarray, b: np.ndarray) -> tuple[int, int]:
    d = ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
    i, j = np.unravel_index(np.argmin(d), d.shape)
    return int(i), int(j)


def _joined(parts: list[np.ndarray]) -> list[np.ndarray]:
    """Contours chained into one path: neighbours in the list are linked at their closest points;
    each contour is rotated to start where it is entered (turned around where it is left before
    that point) and closed; the path runs forward through the first contour, each middle one's
    arc up to where it is left, and the last, then back through the middle ones' other arcs."""
    links: list[list[int]] = [[] for _ in parts]
    for i in range(1, len(parts)):
        a, b = _closest_pair(parts[i - 1], parts[i])
        links[i - 1].append(a)
        links[i].append(b)
    last = len(parts) - 1
    closed, path = [], []
    for i, (part, ends) in enumerate(zip(parts, links)):
        if len(ends) == 2 and ends[0] > ends[1]:
            ends = [len(part) - 1 - e for e in ends]
            part = part[::-1]
        part = np.roll(part, -ends[0], axis=0)
        part = np.concatenate([part, part[:1]])
        closed.append(part)
        path.append(part if i in (0, last) else part[:ends[1] - ends[0] + 1])
    for i in range(last - 1, 0, -1):
        path.append(closed[i][abs(links[i][1] - links[i][0]):])
    return path
