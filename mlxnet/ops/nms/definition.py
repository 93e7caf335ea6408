"""Greedy non-maximum suppression with torchvision's semantics, class-aware through offsets.

Boxes are visited in descending score order (ties: lower index first, torchvision's stable
sort); each kept box removes every later box whose IoU with it is strictly greater than the
threshold. Class-aware NMS shifts each box by ``class * max_wh`` in x and y (ultralytics'
trick), so boxes of different classes never overlap and one pass handles every class.

The definition is exact and runs on the host: the loop is inherently sequential, so the inputs
are read back once. At evaluation settings (confidence 0.001: every one of a 640² image's 8400
anchors is a candidate) one kept box at a time against all the others is too slow, so the work is
cut twice without changing a bit of the result: class-aware NMS runs per class (the offsets make
it exactly that, checked on the coordinates; otherwise one pass over all), and each pass builds
its IoU matrix in vectorised blocks and walks booleans. ``scripts/bench/bench_nms.py`` measures
it. GPU back ends run the kernel face instead (:mod:`.kernel`), which shares :func:`prepared` and
keeps the same indices.
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


def _iou_rows(b: np.ndarray, areas: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """IoU of boxes ``rows`` against boxes ``cols`` as a (rows, cols) matrix: the same float32
    operations, in the same order, as one step of the sequential loop (so the same bits)."""
    r, c = b[rows], b[cols]
    w = np.maximum(np.minimum(r[:, None, 2], c[None, :, 2]) - np.maximum(r[:, None, 0], c[None, :, 0]),
                   np.float32(0))
    h = np.maximum(np.minimum(r[:, None, 3], c[None, :, 3]) - np.maximum(r[:, None, 1], c[None, :, 1]),
                   np.float32(0))
    inter = w * h
    return inter / (areas[rows][:, None] + areas[cols][None, :] - inter)


# Candidates whose pairwise IoU matrix is built at once; larger groups go in blocks of this many,
# so memory stays at a few MB whatever N (8400 candidates would be a 280 MB matrix).
_BLOCK = 1024


def _float32_limit(threshold: float) -> np.float32:
    """The float32 ``t`` with ``iou > t`` exactly when ``float(iou) > threshold`` for every float32
    IoU: torchvision's C++ compares the float IoU with a double threshold, and converting each
    IoU to float64 would cost a copy of every matrix."""
    t = np.float32(threshold)
    return t if float(t) <= threshold else np.nextafter(t, np.float32(-np.inf))


def _greedy(b: np.ndarray, areas: np.ndarray, order: np.ndarray, iou_threshold: float,
            max_det: int) -> list[int]:
    """torchvision's greedy loop over ``order`` (descending score), as boolean matrices.

    A block of candidates gets its pairwise "suppresses" matrix in one vectorised step; the
    sequential pass then only reads booleans, and the block's kept boxes suppress the later
    blocks in one more matrix step. Same result as one kept box at a time: a box is dropped iff
    an earlier kept box has IoU > threshold with it."""
    keep: list[int] = []
    alive = order
    limit = _float32_limit(iou_threshold)
    with np.errstate(divide="ignore", invalid="ignore"):
        while alive.size and len(keep) < max_det:
            block, alive = alive[:_BLOCK], alive[_BLOCK:]
            # NaN (degenerate boxes) is never "greater", so such boxes are not suppressed.
            over = np.triu(_iou_rows(b, areas, block, block) > limit, 1)
            removed = np.zeros(block.size, bool)
            # Only a box that overlaps a later one can remove anything: walk those alone, in
            # order (a box's fate is settled by the earlier ones), the rest stay as they are.
            for i in np.flatnonzero(over.any(axis=1)).tolist():
                if not removed[i]:
                    removed |= over[i]
            # Later boxes never change an earlier one's fate: the first max_det survivors are it.
            kept_here = np.flatnonzero(~removed)[:max_det - len(keep)]
            keep.extend(block[kept_here].tolist())
            if alive.size and len(keep) < max_det:
                rows = block[kept_here]
                hit = (_iou_rows(b, areas, rows, alive) > limit).any(axis=0)
                alive = alive[~hit]
    return keep


def _class_groups(b: np.ndarray, order: np.ndarray, cls: np.ndarray) -> list[np.ndarray] | None:
    """``order`` split by class (each part keeps its order), if the offset boxes of different
    classes cannot overlap: then class-aware NMS is NMS per class, on small sets. None when they
    might (coordinates beyond ``max_wh``, or not finite): one pass over all keeps it exact."""
    sub = b[order]
    if not np.isfinite(sub).all():
        return None
    by_class = np.argsort(cls[order], kind="stable")  # stable: each class keeps the score order
    sorted_classes = cls[order][by_class]
    starts = np.flatnonzero(np.concatenate([[True], sorted_classes[1:] != sorted_classes[:-1]]))
    if starts.size < 2:
        return None
    xs = sub[by_class]
    lo = np.minimum.reduceat(np.minimum(xs[:, 0], xs[:, 2]), starts)
    hi = np.maximum.reduceat(np.maximum(xs[:, 0], xs[:, 2]), starts)
    span = np.argsort(lo, kind="stable")
    # Zero intersection is IoU 0 (or NaN), never "greater" than a threshold in [0, 1]: touching is fine.
    if np.any(hi[span][:-1] > lo[span][1:]):
        return None
    return [order[part] for part in np.split(by_class, starts[1:])]


def descending(scores: np.ndarray) -> np.ndarray:
    """``np.argsort(-scores, kind="stable")`` for float32 scores, four times faster at 8400: each
    score becomes an unsigned key in the order of ``-score`` (-0 counted as 0, NaN last, as
    NumPy sorts), its index in the low 32 bits breaks ties, and one plain sort of the 64-bit
    words gives the order (NumPy's stable float argsort is a merge sort; this is a SIMD sort)."""
    v = -scores.astype(np.float32) + np.float32(0)  # -0 + 0 is +0: equal scores, equal keys
    bits = v.view(np.uint32).astype(np.uint64)
    key = np.where(bits >> 31 == 1, ~bits & 0xFFFFFFFF, bits | 0x80000000)
    key[np.isnan(v)] = 0xFFFFFFFF  # above every number's key (+inf's is 0xFF800000)
    words = (key << np.uint64(32)) | np.arange(v.size, dtype=np.uint64)
    return (np.sort(words) & 0xFFFFFFFF).astype(np.intp)


def prepared(boxes: mx.array, scores: mx.array, classes: mx.array | None, score_threshold: float | None,
             max_wh: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """The host side every face shares: the (offset) float32 boxes, the candidates in descending
    score order (stable: ties keep the lower index first), the boxes' areas and the classes."""
    b = np.array(boxes.astype(mx.float32))
    s = np.array(scores.astype(mx.float32))
    candidates = np.arange(b.shape[0])
    if score_threshold is not None:
        candidates = candidates[s > score_threshold]
    if classes is not None:
        # Same float32 arithmetic as ultralytics (class * max_wh, then added to the coordinates).
        b = b + (np.array(classes).astype(np.float32) * np.float32(max_wh))[:, None]
    order = candidates[descending(s[candidates])]
    areas = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    cls = np.array(classes) if classes is not None else None
    return b, order, areas, cls


def nms(boxes: mx.array, scores: mx.array, classes: mx.array | None = None, *,
        iou_threshold: float = 0.7, score_threshold: float | None = None, max_det: int = 300,
        max_wh: float = 7680.0) -> mx.array:
    """Indices (int32) of the boxes kept by greedy NMS, highest score first.

    boxes (N, 4) xyxy, scores (N,); classes (N,) makes it class-aware (offset ``max_wh`` per
    class), None is class-agnostic. Only scores > ``score_threshold`` take part; at most
    ``max_det`` indices are returned.
    """
    _check(boxes, scores, classes, iou_threshold, max_det)
    b, order, areas, cls = prepared(boxes, scores, classes, score_threshold, max_wh)
    # A box's fate depends only on the boxes before it in score order, so NMS over a prefix of
    # the order keeps exactly the boxes the whole run keeps in that prefix: once a prefix holds
    # max_det kept boxes, they are the answer. At conf 0.001 (tens of thousands of candidates,
    # most of them far below the 300th kept box) the prefix is a small part of the work.
    size = min(order.size, _FIRST_PREFIX * max_det)
    while True:
        keep = _kept(b, areas, order[:size], cls, iou_threshold, max_det)
        if len(keep) >= max_det or size >= order.size:
            return mx.array(np.asarray(keep, dtype=np.int32))
        size = min(order.size, size * 4)


# The first prefix of the score order tried (times max_det); each retry takes four times more.
_FIRST_PREFIX = 4


def _kept(b: np.ndarray, areas: np.ndarray, order: np.ndarray, cls: np.ndarray | None, iou_threshold: float,
          max_det: int) -> list[int]:
    """The first ``max_det`` boxes of ``order`` kept by greedy NMS (class-aware given ``cls``)."""
    groups = _class_groups(b, order, cls) if cls is not None else None
    if groups is None:
        return _greedy(b, areas, order, iou_threshold, max_det)
    # Each class's kept boxes, back in the global score order (ties: lower index first).
    rank = np.empty(b.shape[0], np.int64)
    rank[order] = np.arange(order.size)
    kept = np.concatenate([np.asarray(_greedy(b, areas, g, iou_threshold, max_det), np.int64) for g in groups])
    return kept[np.argsort(rank[kept], kind="stable")][:max_det].tolist()
