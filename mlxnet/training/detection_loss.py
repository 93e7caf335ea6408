"""The YOLOv8 detection loss: ultralytics' ``v8DetectionLoss`` (8.4), written here in MLX.

Every anchor (a cell of the stride-8, 16 and 32 maps) predicts 4 × 16 distance bins and one logit
per class. A task-aligned assigner (Feng et al., TOOD, 2021) picks each object's anchors: among
the anchors whose centre lies inside the object's box (a side under ``stride_val`` pixels first
widened to it about its centre), the ``topk`` with the highest alignment ``score^alpha · CIoU^beta``
(score: the anchor's probability of the object's class; CIoU: its predicted box against the
object's); an anchor chosen by several objects keeps the one it overlaps most. The loss is then

- box: ``1 − CIoU`` of each positive anchor's box against its object's,
- dfl: distribution focal loss (Li et al., GFL, 2020): cross-entropy of the two bins around each
  true side length, weighted by how close the length lies to each,
- cls: binary cross-entropy of every anchor's class logits against soft targets (a positive's
  class target is its alignment, normalised so that each object's best anchor gets its best IoU),

each summed over anchors (box and dfl weighted by the positive's target score) and divided by the
sum of all target scores (at least 1), then scaled by the gains (7.5, 0.5, 1.5). The assignment is
made on detached predictions: no gradient flows through it.

Shapes are static: positives are masks, not gathered lists, so the loss compiles and runs on any
back end, and an image without objects, or a batch without any, gives finite zero box and dfl terms.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import mlx.core as mx
import numpy as np

REG_MAX = 16  # distance bins per box side


@dataclass(frozen=True)
class LossSettings:
    """ultralytics' defaults (``box``, ``cls``, ``dfl`` gains; the assigner's ``topk``, ``alpha``, ``beta``)."""

    box: float = 7.5
    cls: float = 0.5
    dfl: float = 1.5
    topk: int = 10
    alpha: float = 0.5
    beta: float = 6.0


@dataclass(frozen=True)
class Targets:
    """A batch's objects, padded to the most any image has: ``boxes`` (B, M, 4) xyxy in input
    pixels, ``classes`` (B, M) int32. A padding row is all zeros (as in ultralytics, a box whose
    coordinates sum to 0 is no object)."""

    boxes: mx.array
    classes: mx.array

    @classmethod
    def from_lists(cls, boxes: Sequence[np.ndarray], classes: Sequence[np.ndarray], *,
                   bucket: bool = False) -> "Targets":
        """One (n_i, 4) xyxy pixel array and (n_i,) class array per image. With ``bucket`` the
        padding goes up to the next power of two (at least 8), so that a compiled loss sees a
        handful of shapes over a run instead of one per batch; padding rows change nothing."""
        most = max((len(b) for b in boxes), default=0)
        if bucket:
            most = max(8, 1 << max(most - 1, 0).bit_length())
        padded = np.zeros((len(boxes), most, 4), np.float32)
        ids = np.zeros((len(boxes), most), np.int32)
        for i, (b, c) in enumerate(zip(boxes, classes)):
            padded[i, :len(b)] = b
            ids[i, :len(c)] = c
        return cls(mx.array(padded), mx.array(ids))


def anchors(input_hw: tuple[int, int], strides: Sequence[int]) -> tuple[mx.array, mx.array]:
    """Anchor centres (A, 2) in grid units (x, y; cell index + 0.5) and each anchor's stride (A, 1),
    level by level, row-major within a level: the order of the head's outputs."""
    points, stride_of = [], []
    for s in strides:
        h, w = input_hw[0] // s, input_hw[1] // s
        ys, xs = np.meshgrid(np.arange(h, dtype=np.float32) + 0.5, np.arange(w, dtype=np.float32) + 0.5, indexing="ij")
        points.append(np.stack([xs, ys], -1).reshape(-1, 2))
        stride_of.append(np.full((h * w, 1), s, np.float32))
    return mx.array(np.concatenate(points)), mx.array(np.concatenate(stride_of))


def ciou(a: mx.array, b: mx.array, eps: float = 1e-7) -> mx.array:
    """Complete IoU (Zheng et al., 2020) of xyxy boxes ``a`` and ``b`` (broadcast), without the
    last axis: IoU − centre distance² / enclosing diagonal² − α·v, v measuring the aspect ratios'
    disagreement and α = v / (1 − IoU + v) taken as a constant (no gradient), as ultralytics does."""
    ax1, ay1, ax2, ay2 = (a[..., i] for i in range(4))
    bx1, by1, bx2, by2 = (b[..., i] for i in range(4))
    w1, h1 = ax2 - ax1, ay2 - ay1 + eps
    w2, h2 = bx2 - bx1, by2 - by1 + eps
    inter = mx.maximum(mx.minimum(ax2, bx2) - mx.maximum(ax1, bx1), 0) * \
        mx.maximum(mx.minimum(ay2, by2) - mx.maximum(ay1, by1), 0)
    union = w1 * h1 + w2 * h2 - inter + eps
    iou = inter / union
    cw = mx.maximum(ax2, bx2) - mx.minimum(ax1, bx1)
    ch = mx.maximum(ay2, by2) - mx.minimum(ay1, by1)
    c2 = cw ** 2 + ch ** 2 + eps
    rho2 = ((bx1 + bx2 - ax1 - ax2) ** 2 + (by1 + by2 - ay1 - ay2) ** 2) / 4
    v = (4 / math.pi ** 2) * (mx.arctan(w2 / h2) - mx.arctan(w1 / h1)) ** 2
    alpha = mx.stop_gradient(v / (1 - iou + v + eps))
    return iou - (rho2 / c2 + v * alpha)


def decode_distances(pred_dist: mx.array) -> mx.array:
    """(B, A, 4·16) bin logits -> (B, A, 4) expected side lengths in grid units (left, top, right,
    bottom): the softmax-weighted mean of the bins 0..15."""
    b, a, _ = pred_dist.shape
    probs = mx.softmax(pred_dist.reshape(b, a, 4, REG_MAX), axis=-1)
    return probs @ mx.arange(REG_MAX, dtype=pred_dist.dtype)


def _widened(gt: mx.array, valid: mx.array, min_side: float) -> mx.array:
    """Object boxes whose sides are under ``min_side`` widened to it about their centre (the
    assigner's candidate region; ultralytics 8.4's small-object rule)."""
    centre = (gt[..., :2] + gt[..., 2:]) / 2
    size = gt[..., 2:] - gt[..., :2]
    size = mx.where((size < min_side) & valid[..., None], mx.array(min_side, gt.dtype), size)
    return mx.concatenate([centre - size / 2, centre + size / 2], axis=-1)


@dataclass(frozen=True)
class Assignment:
    """Per anchor (B, A): whether it is a positive, its object's box (xyxy pixels) and its soft
    class targets (B, A, C)."""

    foreground: mx.array
    boxes: mx.array
    scores: mx.array


def assign(scores: mx.array, boxes: mx.array, points: mx.array, targets: Targets, *, num_classes: int,
           topk: int = 10, alpha: float = 0.5, beta: float = 6.0, min_side: float = 16.0,
           eps: float = 1e-9) -> Assignment:
    """The task-aligned assignment. ``scores`` (B, A, C) probabilities, ``boxes`` (B, A, 4) xyxy
    pixels, ``points`` (A, 2) anchor centres in pixels; ``min_side``: the middle level's stride."""
    scores, boxes = mx.stop_gradient(scores), mx.stop_gradient(boxes)
    bsz, count, _ = boxes.shape
    gt, labels = targets.boxes, targets.classes
    m = gt.shape[1]
    if m == 0:
        return Assignment(mx.zeros((bsz, count), mx.bool_), mx.zeros((bsz, count, 4)),
                          mx.zeros((bsz, count, num_classes)))
    valid = gt.sum(-1) > 0  # (B, M)
    region = _widened(gt, valid, min_side)[:, :, None, :]  # (B, M, 1, 4)
    x, y = points[None, None, :, 0], points[None, None, :, 1]
    inside = ((x - region[..., 0] > eps) & (y - region[..., 1] > eps)
              & (region[..., 2] - x > eps) & (region[..., 3] - y > eps))
    candidate = inside & valid[..., None]  # (B, M, A)
    # Each object's class probability at every anchor, and its CIoU with every predicted box.
    class_scores = mx.take_along_axis(scores.transpose(0, 2, 1), labels[..., None].astype(mx.int32), axis=1)
    overlaps = mx.where(candidate, mx.maximum(ciou(gt[:, :, None, :], boxes[:, None, :, :]), 0), 0)
    align = mx.where(candidate, class_scores ** alpha * overlaps ** beta, 0)
    # The top-k anchors of each object by alignment, kept where they lie in its region.
    k = min(topk, count)
    top = mx.argpartition(-align, kth=k - 1, axis=-1)[..., :k]
    chosen = mx.put_along_axis(mx.zeros(align.shape, mx.int32), top, mx.array(1, mx.int32), axis=-1)
    positive = (chosen > 0) & candidate
    # An anchor chosen by several objects keeps the one it overlaps most.
    several = positive.sum(axis=1, keepdims=True) > 1
    best = mx.argmax(overlaps, axis=1, keepdims=True)  # (B, 1, A)
    is_best = mx.arange(m)[None, :, None] == best
    positive = mx.where(several, is_best, positive)
    foreground = positive.any(axis=1)  # (B, A)
    owner = mx.argmax(positive.astype(mx.int32), axis=1)  # (B, A): the object index (0 when none)
    target_labels = mx.take_along_axis(labels.astype(mx.int32), owner, axis=1)
    target_boxes = mx.take_along_axis(gt, owner[..., None], axis=1)
    # Soft targets: alignment rescaled so each object's best anchor gets its best overlap.
    align = align * positive
    best_align = align.max(axis=-1, keepdims=True)
    best_overlap = (overlaps * positive).max(axis=-1, keepdims=True)
    norm = (align * best_overlap / (best_align + eps)).max(axis=1)  # (B, A)
    one_hot = mx.arange(num_classes)[None, None, :] == target_labels[..., None]
    target_scores = mx.where(one_hot & foreground[..., None], norm[..., None], 0)
    return Assignment(foreground, target_boxes, target_scores)


def _bce_with_logits(x: mx.array, t: mx.array) -> mx.array:
    # log(1 + e^x) as logaddexp, whose gradient is sigmoid(x) everywhere (a max/abs spelling
    # has none at exactly 0, where freshly initialised logits sit).
    return mx.logaddexp(x, mx.array(0, x.dtype)) - x * t


def _dfl(pred_dist: mx.array, target: mx.array) -> mx.array:
    """(B, A, 4·16) logits and (B, A, 4) side lengths in grid units -> (B, A): the distribution
    focal loss, averaged over the four sides."""
    b, a, _ = pred_dist.shape
    target = mx.clip(target, 0, REG_MAX - 1 - 0.01)
    left = mx.floor(target).astype(mx.int32)
    w_left = (left + 1).astype(target.dtype) - target
    logp = pred_dist.reshape(b, a, 4, REG_MAX)
    logp = logp - mx.logsumexp(logp, axis=-1, keepdims=True)
    at_left = mx.take_along_axis(logp, left[..., None], axis=-1)[..., 0]
    at_right = mx.take_along_axis(logp, left[..., None] + 1, axis=-1)[..., 0]
    return -(at_left * w_left + at_right * (1 - w_left)).mean(axis=-1)


def detection_loss(outputs: mx.array, targets: Targets, input_hw: tuple[int, int], *, num_classes: int,
                   strides: Sequence[int] = (8, 16, 32), settings: LossSettings = LossSettings(),
                   total: Callable[[mx.array], mx.array] | None = None,
                   batch_size: int | None = None) -> tuple[mx.array, mx.array]:
    """ultralytics' v8 detection loss of a batch.

    ``outputs``: the head's raw outputs (B, A, 4·16 + C) (:meth:`mlxnet.models.yolo.YOLOv8.train_outputs`);
    ``targets``: the batch's objects; ``input_hw``: the network input's (H, W).

    Returns ``(loss, parts)``: ``parts`` = (box, cls, dfl), each already times its gain, the
    per-image values ultralytics logs; ``loss`` = their sum times the batch size, the value
    ultralytics back-propagates (so gradients, and gradient accumulation, match its own).

    Data-parallel, each process holding a share of one batch: ``total`` sums a value over the
    processes (:func:`mlxnet.distributed.all_sum`) and ``batch_size`` is the whole batch's; each
    process's ``loss`` and ``parts`` are then its share of the one-process values (they add up
    to them over the processes).
    """
    if outputs.dtype not in (mx.float32, mx.float64):  # half precision: the loss in float32
        outputs = outputs.astype(mx.float32)
    bsz = outputs.shape[0]
    pred_dist, logits = outputs[..., :4 * REG_MAX], outputs[..., 4 * REG_MAX:]
    points, stride = anchors(input_hw, strides)
    distances = decode_distances(pred_dist)
    pred_boxes = mx.concatenate([points - distances[..., :2], points + distances[..., 2:]], axis=-1)  # grid units
    found = assign(mx.sigmoid(logits), pred_boxes * stride, points * stride, targets, num_classes=num_classes,
                   topk=settings.topk, alpha=settings.alpha, beta=settings.beta,
                   min_side=float(strides[1] if len(strides) > 1 else strides[0]))
    score_sum = mx.stop_gradient(found.scores.sum())
    total_score = mx.maximum(total(score_sum) if total is not None else score_sum, 1)
    cls = _bce_with_logits(logits, found.scores).sum() / total_score
    weight = found.scores.sum(-1) * found.foreground  # (B, A): zero off the positives
    # Off the positives the target is a unit box around the anchor, so that no term computed
    # there (and multiplied by a zero weight) can be infinite or NaN.
    target = mx.where(found.foreground[..., None], found.boxes / stride,
                      mx.concatenate([points - 0.5, points + 0.5], axis=-1))
    box = ((1 - ciou(pred_boxes, target)) * weight).sum() / total_score
    sides = mx.concatenate([points - target[..., :2], target[..., 2:] - points], axis=-1)
    dfl = (_dfl(pred_dist, sides) * weight).sum() / total_score
    parts = mx.stack([box * settings.box, cls * settings.cls, dfl * settings.dfl])
    return parts.sum() * (batch_size or bsz), parts
