"""Detection metrics: ultralytics' ``yolo val`` numbers (mAP50-95, mAP50, per-class P and R), and
COCO's variant of the same idea, written from the algorithms' descriptions.

Per image, each prediction is marked a true positive at each IoU threshold 0.50:0.95:0.05
(:func:`match`); over the dataset, per class, the predictions sorted by score give a
precision/recall curve whose area is the class's AP (:func:`ap_per_class`). Two conventions:

- ``ultralytics`` (``yolo val``'s numbers, ultralytics 8.4): at each threshold the predictions,
  highest score first (NMS's order), each take the unclaimed label of their class with the highest
  IoU, a hit where it reaches the threshold (on the network input: the command maps the labels
  there, as ``yolo val`` does); AP is the trapezoid area under the monotone precision
  envelope sampled at 101 recall points (so a perfect class scores 0.995, not 1: the envelope
  drops to 0 at recall 1).
- ``coco`` (pycocotools' COCOeval, area range "all", no crowd labels, every prediction kept):
  each prediction, highest score first, takes the unmatched label of its class with the highest
  IoU >= threshold; AP is the mean of the envelope's precision at the 101 recall points (0 past
  the highest recall reached).

Precision and recall per class are ultralytics': read off the curves at the confidence where the
mean F1 over classes (smoothed) is highest.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

IOU_THRESHOLDS = np.linspace(0.5, 0.95, 10)
METHODS = ("ultralytics", "coco")


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(N, 4) x (M, 4) xyxy -> (N, M) IoU (0 where the union is empty)."""
    a, b = np.asarray(a, np.float64).reshape(-1, 4), np.asarray(b, np.float64).reshape(-1, 4)
    w = np.clip(np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0]), 0, None)
    h = np.clip(np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1]), 0, None)
    inter = w * h
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area_a[:, None] + area_b[None, :] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(union > 0, inter / union, 0.0)


def match(pred_boxes: np.ndarray, pred_scores: np.ndarray, pred_classes: np.ndarray, label_boxes: np.ndarray,
          label_classes: np.ndarray, method: str = "ultralytics",
          thresholds: np.ndarray = IOU_THRESHOLDS) -> np.ndarray:
    """One image's (K, T) boolean: prediction k is a true positive at threshold t."""
    if len(pred_scores) == 0 or len(label_classes) == 0:
        return np.zeros((len(pred_scores), len(thresholds)), bool)
    return match_iou(box_iou(label_boxes, pred_boxes), pred_scores, pred_classes, label_classes, method, thresholds)


def match_iou(iou: np.ndarray, pred_scores: np.ndarray, pred_classes: np.ndarray, label_classes: np.ndarray,
              method: str = "ultralytics", thresholds: np.ndarray = IOU_THRESHOLDS,
              ignored: np.ndarray | None = None) -> np.ndarray:
    """:func:`match` from a (labels, predictions) overlap matrix: box or mask IoU, keypoint OKS.
    ``ignored`` (coco): labels COCOeval ignores (a pose label without a visible keypoint); a
    prediction is matched to one only where no other label is left for it, and is then
    neither right nor wrong: -1 in the result's int8 marks (see :func:`Stats.add`)."""
    k, t = len(pred_scores), len(thresholds)
    correct = np.zeros((k, t), bool)
    if k == 0 or len(label_classes) == 0:
        return correct
    iou = iou * (np.asarray(label_classes)[:, None] == np.asarray(pred_classes)[None, :])  # same class only
    if method == "ultralytics":
        # ultralytics 8.4's match_predictions: the predictions in the given order (NMS's, highest
        # score first), each takes the unclaimed label of its class with the highest IoU (ties: the
        # lower label index), a hit where that IoU reaches the threshold, each threshold on its
        # own. (ultralytics 8.3 let each prediction pick its best label, taken or not, the first
        # in order keeping it.)
        matched = np.zeros((len(label_classes), t), bool)
        rows = np.arange(t)
        for p in np.flatnonzero((iou >= thresholds.min()).any(axis=0)):
            available = np.where(matched, 0.0, iou[:, p, None])
            best = available.argmax(axis=0)
            correct[p] = available[best, rows] >= thresholds
            matched[best, rows] |= correct[p]
        return correct
    if method != "coco":
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    by_score = np.argsort(-np.asarray(pred_scores), kind="stable")
    skip = np.zeros(len(label_classes), bool) if ignored is None else np.asarray(ignored, bool)
    marks = np.zeros((k, t), np.int8)
    for j, threshold in enumerate(thresholds):
        taken = np.zeros(len(label_classes), bool)
        for p in by_score:
            for pool in (~skip, skip):  # COCOeval: labels it keeps first, ignored ones after
                candidates = np.where(taken | ~pool, -1.0, iou[:, p])
                best = int(np.argmax(candidates))
                if candidates[best] >= threshold and candidates[best] > 0:
                    taken[best] = True
                    marks[p, j] = -1 if skip[best] else 1
                    break
    return marks if ignored is not None else marks > 0


@dataclass
class Stats:
    """What every image adds: its predictions' true-positive marks, scores and classes, and its
    labels' classes."""

    correct: list[np.ndarray] = field(default_factory=list)
    scores: list[np.ndarray] = field(default_factory=list)
    classes: list[np.ndarray] = field(default_factory=list)
    label_classes: list[np.ndarray] = field(default_factory=list)
    images_with: dict[int, int] = field(default_factory=dict)  # class -> images holding a label of it

    ignored: list[np.ndarray] = field(default_factory=list)

    def add(self, correct: np.ndarray, scores: np.ndarray, classes: np.ndarray, label_classes: np.ndarray) -> None:
        """``correct``: :func:`match`'s marks (bool, or int8 with -1 for a prediction matched to an
        ignored label at that threshold); ``label_classes``: the labels that count."""
        marks = np.asarray(correct).reshape(-1, len(IOU_THRESHOLDS))
        self.correct.append(marks > 0)
        self.ignored.append(marks < 0)
        self.scores.append(np.asarray(scores, np.float64).reshape(-1))
        self.classes.append(np.asarray(classes, np.int64).reshape(-1))
        labels = np.asarray(label_classes, np.int64).reshape(-1)
        self.label_classes.append(labels)
        for c in np.unique(labels).tolist():
            self.images_with[c] = self.images_with.get(c, 0) + 1

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        t = len(IOU_THRESHOLDS)
        join = (lambda parts, empty: np.concatenate(parts) if parts else empty)
        return (join(self.correct, np.zeros((0, t), bool)), join(self.scores, np.zeros(0)),
                join(self.classes, np.zeros(0, np.int64)), join(self.label_classes, np.zeros(0, np.int64)))

    def ignored_marks(self) -> np.ndarray:
        return np.concatenate(self.ignored) if self.ignored else np.zeros((0, len(IOU_THRESHOLDS)), bool)


def curve(correct: np.ndarray, scores: np.ndarray, labels: int,
          ignored: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One class's (recall, precision), each (K, T), down the predictions sorted by score
    (ties keep their order); ``ignored`` predictions count neither way at their thresholds."""
    order = np.argsort(-scores, kind="stable")
    counted = np.ones_like(correct) if ignored is None else ~ignored[order]
    tp = np.cumsum(correct[order] & counted, axis=0)
    fp = np.cumsum(~correct[order] & counted, axis=0)
    return tp / max(labels, 1), tp / np.maximum(tp + fp, 1)


def average_precision(recall: np.ndarray, precision: np.ndarray, method: str = "ultralytics") -> float:
    """Area under one (recall, precision) curve at 101 recall points (see the module's doc)."""
    points = np.linspace(0, 1, 101)
    if method == "ultralytics":
        # ultralytics 8.4: the curve drops to precision 0 just past the highest recall reached
        # (a sentinel there), not along a ramp from the last precision to 0 at recall 1.
        r = np.concatenate([[0.0], recall, [recall[-1] if len(recall) else 1.0], [1.0]])
        p = np.concatenate([[1.0], precision, [0.0], [0.0]])
        p = np.maximum.accumulate(p[::-1])[::-1]  # the envelope: best precision at this recall or more
        y = np.interp(points, r, p)
        return float(np.sum((y[1:] + y[:-1]) / 2 * np.diff(points)))
    if len(recall) == 0:
        return 0.0
    p = np.maximum.accumulate(np.asarray(precision, np.float64)[::-1])[::-1]
    at = np.searchsorted(recall, points, side="left")
    q = np.where(at < len(p), p[np.minimum(at, len(p) - 1)], 0.0)
    return float(q.mean())


def _smooth(y: np.ndarray, fraction: float = 0.05) -> np.ndarray:
    """A box filter over ``2 * fraction`` of the points, ends repeated (ultralytics' F1 smoothing)."""
    n = round(len(y) * fraction * 2) // 2 + 1
    padded = np.concatenate([np.full(n // 2, y[0]), y, np.full(n // 2, y[-1])])
    return np.convolve(padded, np.ones(n) / n, mode="valid")


@dataclass
class Result:
    """Per class with labels (in class order): AP at each threshold, P, R; and the means."""

    classes: np.ndarray  # (C,) class ids with at least one label
    labels: np.ndarray  # (C,) label count
    images: np.ndarray  # (C,) images holding the class
    ap: np.ndarray  # (C, T)
    precision: np.ndarray  # (C,)
    recall: np.ndarray  # (C,)

    @property
    def map50(self) -> float:
        return float(self.ap[:, 0].mean()) if len(self.ap) else 0.0

    @property
    def map(self) -> float:
        return float(self.ap.mean()) if len(self.ap) else 0.0

    @property
    def mp(self) -> float:
        return float(self.precision.mean()) if len(self.precision) else 0.0

    @property
    def mr(self) -> float:
        return float(self.recall.mean()) if len(self.recall) else 0.0


def ap_per_class(stats: Stats, method: str = "ultralytics") -> Result:
    """Every class that has labels: its AP at each IoU threshold and its P and R (see the module)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    correct, scores, classes, label_classes = stats.arrays()
    ignored = stats.ignored_marks()
    ids, counts = np.unique(label_classes, return_counts=True)
    t = len(IOU_THRESHOLDS)
    ap = np.zeros((len(ids), t))
    grid = np.linspace(0, 1, 1000)  # confidences at which P and R are read
    p_at = np.zeros((len(ids), grid.size))
    r_at = np.zeros((len(ids), grid.size))
    for i, (c, n) in enumerate(zip(ids.tolist(), counts.tolist())):
        mine = classes == c
        if not mine.any():
            continue  # no prediction: AP, P and R 0
        recall, precision = curve(correct[mine], scores[mine], n, ignored[mine])
        s = np.sort(scores[mine])[::-1]
        # np.interp wants increasing x: negated confidences. Above the top score, P is 1 and R 0.
        r_at[i] = np.interp(-grid, -s, recall[:, 0], left=0)
        p_at[i] = np.interp(-grid, -s, precision[:, 0], left=1)
        ap[i] = [average_precision(recall[:, j], precision[:, j], method) for j in range(t)]
    if len(ids):
        f1 = 2 * p_at * r_at / (p_at + r_at + 1e-16)
        best = int(_smooth(f1.mean(axis=0), 0.1).argmax())
        precision_c, recall_c = p_at[:, best], r_at[:, best]
    else:
        precision_c = recall_c = np.zeros(0)
    images = np.array([stats.images_with.get(c, 0) for c in ids.tolist()], np.int64)
    return Result(ids, counts, images, ap, precision_c, recall_c)
