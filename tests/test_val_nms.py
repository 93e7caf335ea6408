"""NMS for validation: mlxnet's kept indices equal torchvision's (golden file from
scripts/goldens/golden_nms.py), and `yolo val`'s multi-label candidates equal a plain NumPy
definition written from ultralytics' description."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from mlxnet import ops
from mlxnet.models.yolo_process import MAX_NMS, MAX_WH
from mlxnet.models.yolo_val import candidates, detections, detections_many, highest

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "fixtures" / "nms" / "nms_golden.npz"


def _golden_module():
    spec = importlib.util.spec_from_file_location("golden_nms", ROOT / "scripts" / "goldens" / "golden_nms.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


golden_nms = _golden_module()
CASES = golden_nms.cases()
PARAMS = [(name, iou, op) for name in CASES for iou in golden_nms.THRESHOLDS[name] for op in ("batched_nms", "nms")]


@pytest.mark.parametrize("name, iou, op", PARAMS)
def test_kept_indices_equal_torchvision(name, iou, op) -> None:
    golden = np.load(GOLDEN)
    boxes, scores, classes = CASES[name]
    # The inputs are regenerated from seeds: the same bytes as the golden script's, or no test.
    assert str(golden[f"{name}/sha256"]) == golden_nms.digest(boxes, scores, classes)
    kept = np.array(ops.nms(mx.array(boxes), mx.array(scores), mx.array(classes) if op == "batched_nms" else None,
                            iou_threshold=iou, max_det=len(boxes)))
    expected = golden[f"{name}/{iou}/{op}"].astype(np.int64)
    np.testing.assert_array_equal(kept[:len(expected)], expected)  # the same boxes, in the same order
    mask = golden.get(f"{name}/{iou}/{op}/mask")
    if mask is None:
        assert len(kept) == len(expected)
    else:
        np.testing.assert_array_equal(np.flatnonzero(np.unpackbits(mask)[:len(boxes)]), np.sort(kept))


def test_the_golden_file_is_small_and_has_ties() -> None:
    assert GOLDEN.stat().st_size < 16_000
    _, scores, _ = CASES["ties"]
    assert len(np.unique(scores)) <= 5


# --- multi-label candidates: a NumPy definition from the description ---------------------------

def reference(head: np.ndarray, conf: float, iou: float, max_det: int, multi_label: bool,
              max_wh: float = 7680.0) -> list[tuple[int, int, float]]:
    """ultralytics' non_max_suppression as its docs describe it, one candidate at a time: an
    anchor takes part if its best class score is over conf; multi-label, each of its classes over
    conf is a candidate (anchor by anchor, classes ascending), else its best class; boxes offset
    by class * max_wh; greedy NMS in descending score order (equal scores: the earlier candidate),
    IoU > iou suppresses; the first max_det. Returns (anchor, class, score) of the kept."""
    found = []
    for a in range(head.shape[0]):
        s = head[a, 4:]
        if not s.max() > conf:
            continue
        x, y, w, h = (float(v) for v in head[a, :4])
        box = [x - w / 2, y - h / 2, x + w / 2, y + h / 2]
        chosen = [c for c in range(len(s)) if s[c] > conf] if multi_label else [int(np.argmax(s))]
        found += [(a, c, float(s[c]), [v + c * max_wh for v in box]) for c in chosen]
    found.sort(key=lambda f: -f[2])  # Python's sort is stable: equal scores keep their order

    def overlap(p: list[float], q: list[float]) -> float:
        w = max(0.0, min(p[2], q[2]) - max(p[0], q[0]))
        h = max(0.0, min(p[3], q[3]) - max(p[1], q[1]))
        union = (p[2] - p[0]) * (p[3] - p[1]) + (q[2] - q[0]) * (q[3] - q[1]) - w * h
        return w * h / union if union > 0 else 0.0

    kept: list[tuple[int, int, float, list[float]]] = []
    for f in found:
        if all(overlap(f[3], k[3]) <= iou for k in kept):
            kept.append(f)
    return [(a, c, s) for a, c, s, _ in kept[:max_det]]


def head_output(seed: int, anchors: int = 400, classes: int = 6) -> np.ndarray:
    """A head's (A, 4 + nc) output: boxes on a grid of whole pixels (so that float32 and Python's
    float64 agree on every IoU), scores of a few levels (ties), several classes over conf."""
    rng = np.random.default_rng(seed)
    centre = rng.integers(20, 300, (anchors, 2)) * 2
    size = rng.integers(4, 60, (anchors, 2)) * 2
    scores = rng.choice([0.0005, 0.002, 0.01, 0.3, 0.6, 0.9], (anchors, classes), p=[.5, .2, .1, .1, .05, .05])
    return np.concatenate([centre, size, scores], axis=1).astype(np.float32)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("multi_label", [True, False])
def test_val_detections_equal_the_definition(seed, multi_label) -> None:
    head = head_output(seed)
    boxes, scores, classes = detections(head, conf=0.001, iou=0.7, max_det=300, multi_label=multi_label)
    expected = reference(head, 0.001, 0.7, 300, multi_label)
    assert len(expected) > 50
    assert classes.tolist() == [c for _, c, _ in expected]
    assert scores.tolist() == pytest.approx([s for _, _, s in expected])
    anchors = [a for a, _, _ in expected]
    centre, half = head[anchors, :2], head[anchors, 2:4] / 2
    np.testing.assert_array_equal(boxes, np.concatenate([centre - half, centre + half], axis=1))
    if multi_label:  # more candidates than one per anchor: some anchors keep two classes
        assert len(set(anchors)) < len(anchors)


def test_the_max_nms_cut_is_the_first_of_a_stable_sort() -> None:
    rng = np.random.default_rng(4)
    for n, k in [(10, 3), (1000, 100), (50_000, 30_000)]:
        scores = rng.integers(0, 20, n).astype(np.float32)  # many ties at the cut
        np.testing.assert_array_equal(highest(scores, k), np.sort(np.argsort(-scores, kind="stable")[:k]))
    head = head_output(5)
    full = detections(head, conf=0.001, iou=0.7, max_det=300)
    cut = detections(head, conf=0.001, iou=0.7, max_det=300, max_nms=150)
    assert len(cut[2]) <= 150 < len(full[2]) and cut[1].min() >= np.sort(full[1])[::-1][149]


@pytest.mark.parametrize("multi_label", [True, False])
def test_the_max_nms_cut_before_gathering_equals_cutting_every_candidate(multi_label) -> None:
    # A weak model: scores quantised (ties at the cut), most (anchor, class) pairs above conf.
    rng = np.random.default_rng(6)
    head = head_output(6).copy()
    head[:, 4:] = rng.integers(0, 50, head[:, 4:].shape) / 50
    every = candidates(head, 0.001, multi_label)
    for k in (1, 777, every[1].size - 1, every[1].size, every[1].size + 5):
        top = highest(every[1], k)
        cut = candidates(head, 0.001, multi_label, max_nms=k)
        for got, want in zip(cut, every):
            np.testing.assert_array_equal(got, want[top])


def test_a_batch_of_images_gives_each_images_detections() -> None:
    """detections_many (one NMS launch round for the batch) = detections image by image, images
    without a candidate included, with and without anchors and multi-label."""
    rng = np.random.default_rng(4)
    heads = []
    for count in (300, 0, 50, 300):
        head = np.concatenate([rng.uniform(20, 300, (300, 2)), rng.uniform(4, 80, (300, 2)),
                               rng.beta(0.3, 8, (300, 5))], axis=1).astype(np.float32)
        head[count:, 4:] = 0  # anchors past `count` pass no threshold
        heads.append(head)
    for multi_label in (True, False):
        for anchors in (True, False):
            options = dict(conf=0.01, iou=0.6, max_det=100, multi_label=multi_label, anchors=anchors)
            together = detections_many(heads, **options)
            assert len(together) == len(heads) and len(together[1][0]) == 0
            for head, got in zip(heads, together):
                # image by image: its candidates, then the nms op on them
                boxes, scores, classes, where = candidates(head, 0.01, multi_label, MAX_NMS)
                keep = (np.array(ops.nms(mx.array(boxes), mx.array(scores), mx.array(classes), iou_threshold=0.6,
                                         max_det=100, max_wh=MAX_WH)) if scores.size else np.zeros(0, np.int64))
                want = (boxes[keep], scores[keep], classes[keep]) + ((where[keep],) if anchors else ())
                assert len(got) == 3 + anchors
                for a, b in zip(got, want):
                    np.testing.assert_array_equal(a, b)
                assert [len(x) for x in detections(head, **options)] == [len(x) for x in got]
