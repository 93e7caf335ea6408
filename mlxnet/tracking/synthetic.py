"""Synthetic tracking scenes with known ground truth, and their MOT metrics (py-motmetrics: MOTA,
IDF1, ID switches), for the tests and ``scripts/bench/mot_synthetic.py``.

A scene is what a detector would give a tracker, frame by frame, for objects whose identities are
known: boxes moving at constant velocity (some bouncing off the frame's edges), jittered as a
detector's are, sometimes missed, scored low while partly occluded and missed while fully hidden,
with a few one-frame false positives; each frame's detections in a random order. The ground truth
holds every object in view, occluded or not, so a track lost behind an occluder counts as misses.

Kinds (:data:`KINDS`):

- ``linear``: objects crossing the frame in all directions, 5% of detections missed;
- ``crossing``: pairs of same-size objects passing through each other on one row (the
  association must keep who is who while they overlap);
- ``occlusion``: objects passing behind an occluder band: low scores while entering and leaving
  it, no detection while fully behind it (a few frames);
- ``crowded``: twenty objects at once, 10% missed, jitter and false positives.

The metrics' hypotheses are the tracker's shown boxes (the detections of confirmed tracks) with
their ids; a hypothesis matches a truth box at IoU >= 0.5 (MOTChallenge's 2D threshold).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

KINDS = ("linear", "crossing", "occlusion", "crowded")
WIDTH, HEIGHT = 1280, 720
MATCH_IOU = 0.5


@dataclass
class Scene:
    """Per frame: the truth (object ids (K,), xyxy boxes (K, 4)) and the detections (xyxy boxes
    (N, 4), scores (N,))."""

    name: str
    truth: list[tuple[np.ndarray, np.ndarray]]
    detections: list[tuple[np.ndarray, np.ndarray]]


def _box(c: np.ndarray, size: np.ndarray) -> np.ndarray:
    return np.concatenate([c - size / 2, c + size / 2])


def make_scene(kind: str, seed: int, frames: int = 150) -> Scene:
    """One seeded scene of ``kind`` (:data:`KINDS`)."""
    if kind not in KINDS:
        raise ValueError(f"unknown scene kind {kind!r}; kinds: {', '.join(KINDS)}")
    rng = np.random.default_rng([KINDS.index(kind), seed])
    miss = {"linear": 0.05, "crossing": 0.05, "occlusion": 0.03, "crowded": 0.10}[kind]
    fp_rate = {"linear": 0.3, "crossing": 0.3, "occlusion": 0.3, "crowded": 0.8}[kind]
    if kind == "crossing":
        # Pairs on rows: one starts left moving right, the other right moving left; same sizes.
        pairs = 4
        rows = np.linspace(120, HEIGHT - 120, pairs)
        speed = rng.uniform(4, 9, size=pairs)
        start = np.concatenate([np.stack([np.full(pairs, 80.0), rows], 1),
                                np.stack([np.full(pairs, WIDTH - 80.0), rows + rng.uniform(-8, 8, pairs)], 1)])
        velocity = np.concatenate([np.stack([speed, np.zeros(pairs)], 1), np.stack([-speed, np.zeros(pairs)], 1)])
        size = np.tile(rng.uniform([40, 90], [60, 130], size=(pairs, 2)), (2, 1))
    else:
        n = {"linear": 8, "occlusion": 8, "crowded": 20}[kind]
        start = rng.uniform([60, 60], [WIDTH - 60, HEIGHT - 60], size=(n, 2))
        velocity = rng.uniform(-7, 7, size=(n, 2))
        size = rng.uniform([30, 60], [90, 180], size=(n, 2))
        if kind == "occlusion":  # all cross the occluder: start left of it, move right
            start[:, 0] = rng.uniform(40, 400, n)
            velocity[:, 0] = rng.uniform(5, 9, n)
    occluder = (600.0, 700.0)  # an x band (a pillar) in the occlusion scenes
    truth, detections = [], []
    position, v = start.copy(), velocity.copy()
    for _ in range(frames):
        ids, boxes, det_boxes, scores = [], [], [], []
        for k in range(len(position)):
            box = _box(position[k], size[k])
            if box[2] < 0 or box[0] > WIDTH or box[3] < 0 or box[1] > HEIGHT:
                continue  # out of view: not in the truth either
            ids.append(k)
            boxes.append(box)
            score = rng.uniform(0.5, 0.95)
            if kind == "occlusion":
                hidden = max(0.0, min(box[2], occluder[1]) - max(box[0], occluder[0])) / (box[2] - box[0])
                if hidden > 0.7:
                    continue  # behind the pillar: no detection
                if hidden > 0.2:
                    score = rng.uniform(0.12, 0.24)  # partly hidden: the detector is unsure
            if rng.random() < miss:
                continue
            jitter = rng.normal(0, 0.02, 4) * np.repeat(size[k], 2) if kind != "crossing" else \
                rng.normal(0, 0.015, 4) * np.repeat(size[k], 2)
            det_boxes.append(box + jitter)
            scores.append(score)
        for _ in range(rng.poisson(fp_rate)):  # a one-frame false positive
            c = rng.uniform([0, 0], [WIDTH, HEIGHT])
            det_boxes.append(_box(c, rng.uniform([30, 60], [90, 180])))
            scores.append(rng.uniform(0.2, 0.6))
        order = rng.permutation(len(scores))
        truth.append((np.array(ids, np.int64), np.array(boxes, np.float64).reshape(-1, 4)))
        detections.append((np.array(det_boxes, np.float64).reshape(-1, 4)[order], np.array(scores)[order]))
        position += v
        if kind in ("linear", "crowded"):  # bounce off the edges: objects stay in view, and turn
            out = (position < 40) | (position > np.array([WIDTH - 40, HEIGHT - 40]))
            v[out] *= -1
    return Scene(f"{kind}-{seed}", truth, detections)


def scenes(seeds: Sequence[int] = (0, 1, 2), frames: int = 150) -> list[Scene]:
    """Every kind, for each seed."""
    return [make_scene(kind, seed, frames) for kind in KINDS for seed in seeds]


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    from mlxnet.tracking.bytetrack import iou_matrix

    return iou_matrix(a, b)


def track_scene(scene: Scene, make_tracker: Callable[[], object]) -> list[tuple[np.ndarray, np.ndarray]]:
    """The tracker's output per frame: (ids (K,), xyxy boxes (K, 4)) of its shown boxes."""
    tracker = make_tracker()
    out = []
    for boxes, scores in scene.detections:
        kept, ids = tracker.update(boxes, scores)  # type: ignore[attr-defined]
        out.append((ids, boxes[kept]))
    return out


def accumulate(scene: Scene, hypotheses: list[tuple[np.ndarray, np.ndarray]]):
    """A motmetrics ``MOTAccumulator`` of a scene's truth against hypotheses. The distances are
    1 - IoU, no pair below :data:`MATCH_IOU` (computed here: motmetrics 1.4's own
    ``iou_matrix`` calls ``np.asfarray``, gone in NumPy 2)."""
    mm = _motmetrics()
    acc = mm.MOTAccumulator(auto_id=True)
    for (truth_ids, truth_boxes), (hyp_ids, hyp_boxes) in zip(scene.truth, hypotheses):
        iou = _iou(truth_boxes, hyp_boxes)
        dist = np.where(iou >= MATCH_IOU, 1.0 - iou, np.nan)
        acc.update(truth_ids.tolist(), np.asarray(hyp_ids).tolist(), dist)
    return acc


METRICS = ("mota", "idf1", "num_switches", "num_false_positives", "num_misses", "precision", "recall",
           "num_unique_objects", "mostly_tracked")


def mot_metrics(results: dict[str, tuple[Scene, list[tuple[np.ndarray, np.ndarray]]]]) -> dict[str, dict]:
    """motmetrics' summary per scene and ``OVERALL`` (every scene's events together)."""
    mm = _motmetrics()
    names = list(results)
    accs = [accumulate(scene, hyp) for scene, hyp in results.values()]
    summary = mm.metrics.create().compute_many(accs, names=names, metrics=list(METRICS), generate_overall=True)
    return {name: {m: float(summary.loc[name, m]) for m in METRICS} for name in summary.index}


def _motmetrics():
    try:
        import motmetrics
    except ImportError as e:
        raise ImportError("MOT metrics need py-motmetrics: pip install motmetrics (in the test extra)") from e
    return motmetrics
