"""ByteTrack (Zhang et al., "ByteTrack: Multi-Object Tracking by Associating Every Detection Box",
ECCV 2022): every detection box is used, the low-scoring ones too, in two association stages.

Per frame (Algorithm 1 of the paper, with ultralytics' default settings, ``bytetrack.yaml``):

1. Detections split by score: high (>= ``high``) and low (between ``low`` and ``high``).
2. Every confirmed track, tracked or recently lost, is moved one frame by its Kalman filter.
3. First association: high detections to those tracks, cost 1 - IoU (times the detection's score
   with ``fuse_score``, so a confident box wins a tie), optimal assignment (Hungarian, scipy's
   ``linear_sum_assignment``), pairs costing more than ``match`` rejected. A lost track matched
   here is found again, with its old id.
4. Second association: low detections to the tracks still unmatched that were tracked last frame
   (not the lost ones), cost 1 - IoU, threshold 0.5. This is ByteTrack's point: an occluded
   object's box scores low but still continues its track. Unmatched low boxes are dropped.
5. Tracks born last frame (unconfirmed) take the high detections left, threshold 0.7; those left
   unmatched are dropped: one frame's false positive makes no track.
6. Tracked tracks still unmatched become lost; a lost track is forgotten after
   ``buffer`` frames at 30 frames/s (scaled to the video's rate).
7. High detections left over, scoring >= ``new``, start tracks: confirmed at once on the first
   frame, else unconfirmed until matched in the next frame.

A track's id is a positive integer, counted per tracker from 1 and never reused. The tracker is
class-agnostic, as ultralytics' is: a box's class does not gate its match.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from enum import Enum
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment

from mlxnet.tracking.kalman import KalmanBoxFilter, xyah_to_xyxy, xyxy_to_xyah


@dataclass(frozen=True)
class TrackerSettings:
    """ultralytics' ``bytetrack.yaml`` defaults."""

    high: float = 0.25  # track_high_thresh: first-stage detections
    low: float = 0.1  # track_low_thresh: second-stage detections score above this
    new: float = 0.25  # new_track_thresh: a leftover high detection starts a track
    buffer: int = 30  # track_buffer: frames (at 30 frames/s) a lost track is kept
    match: float = 0.8  # match_thresh: the first stage's largest accepted cost
    fuse_score: bool = True  # fuse_score: the first stage's IoU is weighted by the score


class _State(Enum):
    TRACKED = 1
    LOST = 2
    REMOVED = 3


class _Track:
    def __init__(self, xyah: np.ndarray, score: float, cls: int) -> None:
        self.xyah, self.score, self.cls = xyah, score, cls
        self.mean: np.ndarray | None = None
        self.cov: np.ndarray | None = None
        self.id = 0
        self.state = _State.TRACKED
        self.confirmed = False
        self.last_frame = 0  # the last frame it was matched in
        self.start_frame = 0
        self.det = -1  # this frame's detection index, -1 if unmatched

    def box(self) -> np.ndarray:
        """xyxy: the filter's estimate, else the box it was born with."""
        return xyah_to_xyxy(self.mean[:4] if self.mean is not None else self.xyah)[0]


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(len(a), len(b)) IoU of xyxy boxes."""
    a, b = np.asarray(a, np.float64).reshape(-1, 4), np.asarray(b, np.float64).reshape(-1, 4)
    if not len(a) or not len(b):
        return np.zeros((len(a), len(b)))
    x1 = np.maximum(a[:, None, 0], b[None, :, 0])
    y1 = np.maximum(a[:, None, 1], b[None, :, 1])
    x2 = np.minimum(a[:, None, 2], b[None, :, 2])
    y2 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area_a = np.clip(a[:, 2] - a[:, 0], 0, None) * np.clip(a[:, 3] - a[:, 1], 0, None)
    area_b = np.clip(b[:, 2] - b[:, 0], 0, None) * np.clip(b[:, 3] - b[:, 1], 0, None)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.maximum(union, 1e-12), 0.0)


def _assign(cost: np.ndarray, limit: float) -> tuple[list[tuple[int, int]], list[int], list[int]]:
    """The best matching among pairs costing at most ``limit``: the (row, column) pairs, and the
    rows and columns left.

    Gated, not "assign everything, then drop the pairs over the limit": a pair is worth making
    when it costs less than leaving both unmatched (``limit``), so the matching minimises the sum
    of ``cost - limit`` over its pairs. ByteTrack's reference code (and ultralytics') get this
    from lapjv's ``cost_limit``; ungated, one track's expensive best pairing can leave a cheap
    pair unmade."""
    rows, cols = cost.shape
    if not rows or not cols:
        return [], list(range(rows)), list(range(cols))
    # Pairs over the limit cost nothing (0): never better than no pair, and dropped below.
    r, c = linear_sum_assignment(np.where(cost <= limit, cost - limit, 0.0))
    pairs = [(i, j) for i, j in zip(r, c) if cost[i, j] <= limit]
    used_r, used_c = {i for i, _ in pairs}, {j for _, j in pairs}
    return pairs, [i for i in range(rows) if i not in used_r], [j for j in range(cols) if j not in used_c]


def _per_detection(value: Any, count: int) -> bool:
    """Whether a result's field holds one row per detection: an array, or an array-like such as
    instance masks (a sequence that an index array cuts), of ``count`` rows."""
    if isinstance(value, np.ndarray):
        return value.ndim > 0 and len(value) == count
    if isinstance(value, (str, bytes, tuple, list, dict)):
        return False
    return hasattr(value, "__getitem__") and hasattr(value, "__len__") and len(value) == count


class ByteTracker:
    """ByteTrack over one video's frames, in order: :meth:`update` once per frame."""

    def __init__(self, frame_rate: float = 30.0, settings: TrackerSettings | None = None) -> None:
        self.settings = settings or TrackerSettings()
        self.kalman = KalmanBoxFilter()
        self.max_lost = max(1, int(round(frame_rate / 30.0 * self.settings.buffer)))
        self.frame = 0
        self._next_id = 1
        self._tracked: list[_Track] = []  # matched last frame (confirmed or not)
        self._lost: list[_Track] = []

    def update(self, boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """One frame's detections (xyxy boxes (N, 4), scores (N,), classes (N,)) in; out, the
        indices of the detections that belong to a confirmed track this frame and those tracks'
        ids, both (K,) int arrays, in detection order."""
        s = self.settings
        self.frame += 1
        boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
        scores = np.asarray(scores, np.float64).reshape(-1)
        classes = np.zeros(len(scores), np.int64) if classes is None else np.asarray(classes).reshape(-1)
        xyah = xyxy_to_xyah(boxes)
        high = np.flatnonzero(scores >= s.high)
        low = np.flatnonzero((scores > s.low) & (scores < s.high))
        for t in [*self._tracked, *self._lost]:
            t.det = -1

        unconfirmed = [t for t in self._tracked if not t.confirmed]
        confirmed = [t for t in self._tracked if t.confirmed]
        pool = confirmed + self._lost
        for t in pool:
            if t.state is not _State.TRACKED:
                t.mean = t.mean.copy()
                t.mean[7] = 0.0  # a lost track's height stops changing while unseen
            t.mean, t.cov = self.kalman.predict(t.mean, t.cov)

        # Stage 1: high detections to every confirmed track, tracked or lost.
        cost = self._cost(pool, boxes[high], scores[high] if s.fuse_score else None)
        pairs, left_tracks, left_high = _assign(cost, s.match)
        for i, j in pairs:
            self._match(pool[i], high[j], xyah, scores, classes)

        # Stage 2: low detections to the tracks that were tracked and are still unmatched.
        remaining = [pool[i] for i in left_tracks if pool[i].state is _State.TRACKED]
        pairs, left_remaining, _ = _assign(self._cost(remaining, boxes[low], None), 0.5)
        for i, j in pairs:
            self._match(remaining[i], low[j], xyah, scores, classes)
        for i in left_remaining:
            remaining[i].state = _State.LOST

        # Stage 3: last frame's newborn tracks take the high detections left, or are dropped.
        high_left = high[left_high]
        cost = self._cost(unconfirmed, boxes[high_left], scores[high_left] if s.fuse_score else None)
        pairs, left_unconfirmed, left_high = _assign(cost, 0.7)
        for i, j in pairs:
            self._match(unconfirmed[i], high_left[j], xyah, scores, classes)
        for i in left_unconfirmed:
            unconfirmed[i].state = _State.REMOVED

        # New tracks from the confident leftovers.
        born = []
        for j in high_left[left_high]:
            if scores[j] < s.new:
                continue
            t = _Track(xyah[j], float(scores[j]), int(classes[j]))
            t.mean, t.cov = self.kalman.initiate(xyah[j])
            t.id, self._next_id = self._next_id, self._next_id + 1
            t.start_frame = t.last_frame = self.frame
            t.confirmed = self.frame == 1  # the first frame has no history to confirm against
            t.det = int(j)
            born.append(t)

        for t in pool:  # lost too long: forgotten
            if t.state is _State.LOST and self.frame - t.last_frame > self.max_lost:
                t.state = _State.REMOVED
        everyone = [*unconfirmed, *pool, *born]
        self._tracked = [t for t in everyone if t.state is _State.TRACKED]
        self._lost = [t for t in everyone if t.state is _State.LOST]
        self._drop_duplicates()

        shown = sorted((t.det, t.id) for t in self._tracked if t.confirmed and t.det >= 0)
        return (np.array([d for d, _ in shown], np.int64), np.array([i for _, i in shown], np.int64))

    def update_detections(self, detections: Any) -> tuple[Any, np.ndarray]:
        """:meth:`update` for a detector's result (a dataclass with ``boxes``, ``scores`` and
        ``classes``, as ``YOLO.predict`` returns): the same kind of result holding only the
        detections of confirmed tracks, and their ids. Every per-detection array of it (masks,
        keypoints: any with one row per box) is cut alike."""
        kept, ids = self.update(detections.boxes, detections.scores, detections.classes)
        count = len(detections.boxes)
        rows = {f.name: getattr(detections, f.name)[kept] for f in fields(detections)
                if _per_detection(getattr(detections, f.name), count)}
        return replace(detections, **rows), ids

    def _cost(self, tracks: list[_Track], boxes: np.ndarray, scores: np.ndarray | None) -> np.ndarray:
        similarity = iou_matrix(np.array([t.box() for t in tracks]).reshape(-1, 4), boxes)
        if scores is not None:
            similarity = similarity * scores[None, :]
        return 1.0 - similarity

    def _match(self, t: _Track, j: int, xyah: np.ndarray, scores: np.ndarray, classes: np.ndarray) -> None:
        t.mean, t.cov = self.kalman.update(t.mean, t.cov, xyah[j])
        t.score, t.cls, t.det = float(scores[j]), int(classes[j]), int(j)
        t.state, t.confirmed, t.last_frame = _State.TRACKED, True, self.frame

    def _drop_duplicates(self) -> None:
        """A lost track overlapping a tracked one almost entirely (IoU > 0.85) is the same object
        twice: the one followed for fewer frames goes."""
        if not self._tracked or not self._lost:
            return
        overlap = iou_matrix(np.array([t.box() for t in self._tracked]), np.array([t.box() for t in self._lost]))
        drop_tracked, drop_lost = set(), set()
        for i, j in zip(*np.nonzero(overlap > 0.85)):
            a, b = self._tracked[i], self._lost[j]
            if a.last_frame - a.start_frame > b.last_frame - b.start_frame:
                drop_lost.add(j)
            else:
                drop_tracked.add(i)
        self._tracked = [t for i, t in enumerate(self._tracked) if i not in drop_tracked]
        self._lost = [t for j, t in enumerate(self._lost) if j not in drop_lost]
