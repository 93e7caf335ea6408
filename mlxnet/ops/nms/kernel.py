"""nms's GPU face (custom_kernels/nms.kern): torchvision's CUDA algorithm, a suppression bit mask
built in parallel and one sequential scan over it, both on the device; same kept indices as the
definition, bit for bit.

The host part is the definition's: the candidates (score threshold), the class offsets, the
stable descending sort (:func:`definition.prepared`). The sorted boxes go to
``nms_mask`` (one thread per row and 32-column word: bit set where the row's box removes the
later column's, IoU in the definition's float32 arithmetic) and ``nms_scan`` (one group: 32 rows
at a time, kept rows OR their words into the removed bits, stops at ``max_det`` kept). Only the
scan's kept bits (one word per 32 rows) come back.

The prefix rule of the definition holds here too (a box's fate depends only on the boxes before
it): the first pass takes the first ``max(4 * max_det, _FIRST_ROWS)`` sorted candidates, and
only when fewer than ``max_det`` of them are kept does a pass over four times more follow. The
definition runs instead where the kernels cannot give its answer: coordinates not finite or
beyond ``_MAX_COORD`` (the kernel's arithmetic never meets inf or NaN, see the kernel file), or
more candidates needed than the scan's shared memory holds (``_MAX_ROWS``).
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..core.kernel_source import PortableKernel, int_params
from . import definition

_GROUP = 256  # threads per group of the mask kernel
_SCAN_GROUP = 256  # NMS_GROUP in the kernel file: the scan is exactly one group of these
_MAX_ROWS = 32 * 1024  # NMS_MAX_WORDS (1024) words of 32 rows in the scan's shared memory
# A 640² image's 8400 anchors (YOLOv8 at conf 0.001) in one pass, whole words; the mask of that
# many rows is 9 MB, built in tens of microseconds, and the scan reads only what it needs.
_FIRST_ROWS = 8448
# Coordinates (after the class offsets) up to this magnitude keep every product and sum of the
# IoU finite in float32 (2e18 squared, times 3, is far below float32's 3.4e38).
_MAX_COORD = 1e18

NMS_MASK = PortableKernel("nms.kern", "nms_mask", ["b", "p"], ["mask"])
NMS_SCAN = PortableKernel("nms.kern", "nms_scan", ["mask", "p"], ["keep"])


def kept_rows(boxes: np.ndarray, limit: np.float32, max_det: int) -> np.ndarray:
    """Positions (into the sorted ``boxes``) of the first ``max_det`` rows greedy NMS keeps, run on
    the device: ``boxes`` (n, 4) float32 in descending score order. One array goes up (the boxes,
    then the limit: every host array is a transfer of its own) and one comes back (the kept bits)."""
    return kept_from_bits(launch(boxes, limit, max_det), boxes.shape[0], max_det)


def launch(boxes: np.ndarray, limit: np.float32, max_det: int) -> mx.array:
    """The kernels of :func:`kept_rows`, not waited for: the kept bits, one word per 32 rows."""
    n = boxes.shape[0]
    words = (n + 31) // 32
    params = int_params((n, words, max_det))
    packed = np.concatenate([boxes.reshape(-1), np.float32([limit])])
    (mask,) = NMS_MASK([mx.array(packed), params],
                       template=[], grid=(n * words, 1, 1), threadgroup=(_GROUP, 1, 1),
                       output_shapes=[(n * words,)], output_dtypes=[mx.uint32])
    (keep,) = NMS_SCAN([mask, params], template=[], grid=(_SCAN_GROUP if n else 0, 1, 1),
                       threadgroup=(_SCAN_GROUP, 1, 1), output_shapes=[(words,)], output_dtypes=[mx.uint32])
    return keep


def kept_from_bits(keep: mx.array, n: int, max_det: int) -> np.ndarray:
    bits = np.unpackbits(np.array(keep).astype("<u4").view(np.uint8), bitorder="little")
    return np.flatnonzero(bits[:n])[:max_det]


def nms_many(problems: list[tuple[mx.array, mx.array, mx.array | None]], *, iou_threshold: float = 0.7,
             score_threshold: float | None = None, max_det: int = 300, max_wh: float = 7680.0) -> list[mx.array]:
    """:func:`nms` of each (boxes, scores, classes) problem, every first pass launched before any
    is read back: one wait for a batch of images instead of one each. A problem that its first
    pass does not settle goes on to longer prefixes on its own, as :func:`nms` does."""
    options = dict(iou_threshold=iou_threshold, score_threshold=score_threshold, max_det=max_det, max_wh=max_wh)
    limit = definition._float32_limit(iou_threshold)
    results: list[mx.array | None] = [None] * len(problems)
    first_passes = []
    for k, problem in enumerate(problems):
        order, sorted_boxes = _sorted_rows(*problem, **options)
        if sorted_boxes is None:
            results[k] = definition.nms(*problem, **options)
            continue
        size = _first_size(order.size, max_det)
        first_passes.append((k, order, sorted_boxes, size, launch(sorted_boxes[:size], limit, max_det)))
    mx.eval([keep for *_, keep in first_passes])
    for k, order, sorted_boxes, size, keep in first_passes:
        kept = _settled(order, sorted_boxes, limit, max_det, size, kept_from_bits(keep, size, max_det))
        results[k] = definition.nms(*problems[k], **options) if kept is None else mx.array(kept.astype(np.int32))
    return results


def nms(boxes: mx.array, scores: mx.array, classes: mx.array | None = None, *,
        iou_threshold: float = 0.7, score_threshold: float | None = None, max_det: int = 300,
        max_wh: float = 7680.0) -> mx.array:
    options = dict(iou_threshold=iou_threshold, score_threshold=score_threshold, max_det=max_det, max_wh=max_wh)
    order, sorted_boxes = _sorted_rows(boxes, scores, classes, **options)
    if sorted_boxes is None:
        return definition.nms(boxes, scores, classes, **options)
    limit = definition._float32_limit(iou_threshold)
    size = _first_size(order.size, max_det)
    kept = _settled(order, sorted_boxes, limit, max_det, size, kept_rows(sorted_boxes[:size], limit, max_det))
    return definition.nms(boxes, scores, classes, **options) if kept is None else mx.array(kept.astype(np.int32))


def _sorted_rows(boxes: mx.array, scores: mx.array, classes: mx.array | None, *, iou_threshold: float,
                 score_threshold: float | None, max_det: int, max_wh: float) -> tuple[np.ndarray, np.ndarray | None]:
    """The candidates' score order and their boxes in it, class offsets added (the definition's
    host part); no boxes where the kernels cannot give the definition's answer."""
    definition._check(boxes, scores, classes, iou_threshold, max_det)
    b, order, _, _ = definition.prepared(boxes, scores, classes, score_threshold, max_wh)
    sorted_boxes = b[order]
    if not (np.abs(sorted_boxes) <= _MAX_COORD).all():  # NaN compares false: not finite too
        return order, None
    return order, sorted_boxes


def _first_size(candidates: int, max_det: int) -> int:
    return min(candidates, max(definition._FIRST_PREFIX * max_det, _FIRST_ROWS), _MAX_ROWS)


def _settled(order: np.ndarray, sorted_boxes: np.ndarray, limit: np.float32, max_det: int, size: int,
             kept: np.ndarray) -> np.ndarray | None:
    """The kept indices, given the ``kept`` rows of a pass over the first ``size``: settled once
    ``max_det`` are kept or every candidate was in the pass, else passes over four times more
    rows follow. None where more rows are needed than the scan holds (the definition runs)."""
    while kept.size < max_det and size < order.size:
        if size >= _MAX_ROWS:
            return None
        size = min(order.size, size * 4, _MAX_ROWS)
        kept = kept_rows(sorted_boxes[:size], limit, max_det)
    return order[kept]
