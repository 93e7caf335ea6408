"""Synthetic detections for the tracker's reference tests, and ultralytics' BYTETracker run on them:
shared by tests/test_track_reference.py and scripts/goldens/golden_bytetrack.py (which stores its
ids), with no mlxnet import, so the golden script runs where only ultralytics is installed."""
from __future__ import annotations

import os
import tempfile
from types import SimpleNamespace

import numpy as np

# ultralytics' bytetrack.yaml
SETTINGS = SimpleNamespace(tracker_type="bytetrack", track_high_thresh=0.25, track_low_thresh=0.1,
                           new_track_thresh=0.25, track_buffer=30, match_thresh=0.8, fuse_score=True)


def scene(seed: int, frames: int = 60, objects: int = 6) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Objects moving linearly (some crossing), each detection jittered, missed now and then,
    scored low at times (occlusion), plus a few one-frame false positives; shuffled order."""
    rng = np.random.default_rng(seed)
    start = rng.uniform([50, 50], [600, 400], size=(objects, 2))
    velocity = rng.uniform(-6, 6, size=(objects, 2))
    size = rng.uniform([30, 60], [80, 160], size=(objects, 2))
    out = []
    for t in range(frames):
        rows, scores = [], []
        for k in range(objects):
            if rng.random() < 0.08 or (k == 0 and 20 <= t < 26):  # missed; object 0 hidden for 6 frames
                continue
            c = start[k] + velocity[k] * t + rng.normal(0, 1.0, 2)
            w, h = size[k] * rng.uniform(0.97, 1.03, 2)
            rows.append([c[0] - w / 2, c[1] - h / 2, c[0] + w / 2, c[1] + h / 2])
            scores.append(rng.uniform(0.12, 0.24) if rng.random() < 0.15 else rng.uniform(0.4, 0.95))
        for _ in range(rng.poisson(0.3)):  # false positives
            x, y = rng.uniform(0, 600), rng.uniform(0, 400)
            rows.append([x, y, x + 40, y + 80])
            scores.append(rng.uniform(0.2, 0.6))
        order = rng.permutation(len(rows))
        out.append((np.array(rows, np.float64).reshape(-1, 4)[order], np.array(scores)[order],
                    np.zeros(len(rows))))
    return out


class Boxes:
    """What BYTETracker.update reads of ultralytics' Boxes: conf, cls, xywh, boolean indexing."""

    def __init__(self, xyxy: np.ndarray, conf: np.ndarray, cls: np.ndarray) -> None:
        self.xyxy, self.conf, self.cls = xyxy, conf, cls

    @property
    def xywh(self) -> np.ndarray:
        x1, y1, x2, y2 = self.xyxy.T
        return np.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], axis=1)

    def __getitem__(self, mask) -> "Boxes":
        return Boxes(self.xyxy[mask], self.conf[mask], self.cls[mask])

    def __len__(self) -> int:
        return len(self.conf)


def ultralytics_ids(seed: int) -> list[dict[int, int]]:
    """Per frame, detection index -> track id, as ultralytics' BYTETracker assigns them."""
    os.environ.setdefault("YOLO_CONFIG_DIR", tempfile.mkdtemp(prefix="ultralytics-"))  # its settings file, not ~
    from ultralytics.trackers import byte_tracker

    theirs = byte_tracker.BYTETracker(SETTINGS)
    frames = []
    for boxes, scores, classes in scene(seed):
        reference = theirs.update(Boxes(boxes.astype(np.float32), scores.astype(np.float32),
                                        classes.astype(np.float32)))
        frames.append({int(row[7]): int(row[4]) for row in reference})
    return frames
