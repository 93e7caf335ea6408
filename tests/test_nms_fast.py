"""The blocked, per-class NMS against a straightforward greedy loop (torchvision's semantics):
identical kept indices on random boxes, with tied scores, degenerate and out-of-range boxes."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
from hypothesis import given, settings, strategies as st

from mlxnet.ops.nms import definition
from mlxnet.ops.nms import nms


def reference(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray | None, iou: float, max_det: int,
              max_wh: float = 7680.0) -> list[int]:
    """One kept box at a time, every pair's IoU computed on its own (float32, as torchvision)."""
    b = boxes.astype(np.float32)
    if classes is not None:
        b = b + (classes.astype(np.float32) * np.float32(max_wh))[:, None]
    order = list(np.argsort(-scores.astype(np.float32), kind="stable"))
    area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    keep: list[int] = []
    removed = set()
    with np.errstate(divide="ignore", invalid="ignore"):
        for pos, i in enumerate(order):
            if i in removed:
                continue
            keep.append(int(i))
            if len(keep) == max_det:
                break
            for j in order[pos + 1:]:
                w = max(min(b[i, 2], b[j, 2]) - max(b[i, 0], b[j, 0]), np.float32(0))
                h = max(min(b[i, 3], b[j, 3]) - max(b[i, 1], b[j, 1]), np.float32(0))
                inter = np.float32(w * h)
                value = np.float32(inter / np.float32(area[i] + area[j] - inter))
                if float(value) > iou:
                    removed.add(j)
    return keep


@st.composite
def problems(draw):
    n = draw(st.integers(0, 60))
    grid = draw(st.sampled_from([4.0, 50.0]))  # a coarse grid makes equal and touching boxes likely
    xy = np.array(draw(st.lists(st.lists(st.integers(0, 20), min_size=2, max_size=2), min_size=n, max_size=n)),
                  np.float32).reshape(n, 2) * grid / 4
    wh = np.array(draw(st.lists(st.lists(st.integers(0, 12), min_size=2, max_size=2), min_size=n, max_size=n)),
                  np.float32).reshape(n, 2) * grid / 4  # 0: degenerate (zero area) boxes
    boxes = np.concatenate([xy, xy + wh], axis=1)
    if n and draw(st.booleans()):  # a few inverted or huge boxes: the per-class split must notice
        k = draw(st.integers(0, n - 1))
        boxes[k] = draw(st.sampled_from([[30, 30, 10, 10], [0, 0, 20000, 20000], [-9000, 0, 5, 5]]))
    scores = np.array(draw(st.lists(st.sampled_from([0.1, 0.5, 0.5, 0.9, 0.25]), min_size=n, max_size=n)),
                      np.float32)  # few values: many ties
    classes = np.array(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), np.int32)
    aware = draw(st.booleans())
    iou = draw(st.sampled_from([0.0, 0.3, 0.5, 0.7, 1.0]))
    max_det = draw(st.integers(1, 70))
    return boxes, scores, classes if aware else None, iou, max_det


@settings(max_examples=300, deadline=None)
@given(problems())
def test_equals_the_reference_loop(problem) -> None:
    boxes, scores, classes, iou, max_det = problem
    got = nms(mx.array(boxes), mx.array(scores), None if classes is None else mx.array(classes),
              iou_threshold=iou, max_det=max_det)
    assert np.array(got).tolist() == reference(boxes, scores, classes, iou, max_det)


def test_blocks_equal_one_block(monkeypatch) -> None:
    """More candidates than a block: the blocked pass keeps exactly what one matrix would."""
    rng = np.random.default_rng(0)
    xy = rng.uniform(0, 300, (700, 2)).astype(np.float32)
    boxes = np.concatenate([xy, xy + rng.uniform(5, 60, (700, 2)).astype(np.float32)], axis=1)
    scores = rng.choice(np.float32([0.2, 0.4, 0.6]), 700)
    args = (mx.array(boxes), mx.array(scores))
    whole = np.array(nms(*args, iou_threshold=0.5, max_det=1000)).tolist()
    monkeypatch.setattr(definition, "_BLOCK", 64)
    assert np.array(nms(*args, iou_threshold=0.5, max_det=1000)).tolist() == whole
    assert whole == reference(boxes, scores, None, 0.5, 1000)


def test_float32_limit_is_the_double_comparison() -> None:
    """IoUs next to the threshold compare as torchvision's float-vs-double test does."""
    for t in (0.0, 0.1, 0.3, 0.45, 0.5, 0.7, 0.9, 1.0):
        v = np.float32(t)
        near = [np.nextafter(v, np.float32(-1)), v, np.nextafter(v, np.float32(2))]
        assert [bool(x > definition._float32_limit(t)) for x in near] == [float(x) > t for x in near]


def test_per_class_only_where_the_offsets_separate_the_classes() -> None:
    """The split is taken for ordinary boxes and refused where a box reaches past ``max_wh``
    into the next class's offset range, or is not finite (one pass over all keeps it exact)."""
    b = np.array([[0, 0, 10, 10], [5, 5, 20, 20], [0, 0, 10, 10]], np.float32)
    cls = np.array([0, 1, 1])
    order = np.arange(3)
    offset = b + (cls.astype(np.float32) * np.float32(7680))[:, None]
    groups = definition._class_groups(offset, order, cls)
    assert groups is not None and [g.tolist() for g in groups] == [[0], [1, 2]]
    huge = b.copy()
    huge[0] = [0, 0, 9000, 10]
    assert definition._class_groups(huge + (cls * np.float32(7680))[:, None], order, cls) is None
    bad = offset.copy()
    bad[1, 2] = np.nan
    assert definition._class_groups(bad, order, cls) is None
