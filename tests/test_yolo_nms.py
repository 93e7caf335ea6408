"""The NMS op (torchvision semantics, class-aware offsets) and YOLOv8's postprocess vs ultralytics."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import mlxnet
from mlxnet import ops
from mlxnet.models.yolo_process import postprocess

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "yolo"


def _golden_script():
    spec = importlib.util.spec_from_file_location("golden_yolo", ROOT / "scripts" / "goldens" / "golden_yolo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def keep(boxes, scores, classes=None, **kw) -> list[int]:
    cls = None if classes is None else mx.array(np.asarray(classes, np.int32))
    out = ops.nms(mx.array(np.asarray(boxes, np.float32)), mx.array(np.asarray(scores, np.float32)), cls, **kw)
    assert out.dtype == mx.int32
    return np.array(out).tolist()


@pytest.mark.parametrize("case", ["default", "iou045", "agnostic", "maxdet"])
def test_postprocess_equals_ultralytics_non_max_suppression(case):
    """A seeded (1, 84, 500) prediction full of overlaps, each case's thresholds; exact equality."""
    meta = json.loads((FIXTURES / "yolo_golden.json").read_text())
    pred = _golden_script().synthetic_prediction()
    assert pred.astype(np.float64).sum() == pytest.approx(meta["nms_input_sum"], rel=1e-12)
    kw = meta["nms_cases"][case]
    det = postprocess(mx.array(pred[0].T), conf=kw["conf_thres"], iou=kw["iou_thres"], max_det=kw["max_det"],
                      agnostic=kw.get("agnostic", False))
    expected = np.array(mx.load(str(FIXTURES / "yolo_golden.safetensors"))[f"nms.{case}"])
    np.testing.assert_array_equal(det, expected)
    assert len(det) >= 7


def test_overlap_above_threshold_is_suppressed_equal_is_not():
    boxes = [[0, 0, 10, 10], [0, 0, 10, 8], [0, 0, 10, 5]]  # IoU with box 0: 0.8, 0.5
    assert keep(boxes, [0.9, 0.8, 0.7], iou_threshold=0.5) == [0, 2]  # 0.5 is not > 0.5
    assert keep(boxes, [0.9, 0.8, 0.7], iou_threshold=0.49) == [0]
    assert keep(boxes, [0.7, 0.8, 0.9], iou_threshold=0.85) == [2, 1, 0]  # highest score first


def test_suppression_is_greedy_not_pairwise():
    # 1 overlaps 0 and 2, but 0 and 2 do not overlap: 0 removes 1, so 2 survives.
    boxes = [[0, 0, 10, 10], [3, 0, 13, 10], [6, 0, 16, 10]]
    assert keep(boxes, [0.9, 0.8, 0.7], iou_threshold=0.3) == [0, 2]


def test_ties_keep_the_lower_index_first():
    boxes = [[0, 0, 10, 10], [1, 0, 11, 10], [50, 50, 60, 60]]
    assert keep(boxes, [0.5, 0.5, 0.5], iou_threshold=0.5) == [0, 2]


def test_classes_separate_boxes_unless_agnostic():
    boxes = [[0, 0, 10, 10], [0, 0, 10, 10]]
    assert keep(boxes, [0.9, 0.8], [0, 1]) == [0, 1]
    assert keep(boxes, [0.9, 0.8], [3, 3]) == [0]
    assert keep(boxes, [0.9, 0.8]) == [0]


def test_score_threshold_max_det_and_empty_input():
    boxes = [[i * 20, 0, i * 20 + 10, 10] for i in range(6)]
    scores = [0.1, 0.9, 0.3, 0.8, 0.5, 0.7]
    assert keep(boxes, scores, score_threshold=0.5) == [1, 3, 5]
    assert keep(boxes, scores, max_det=2) == [1, 3]
    assert keep(np.zeros((0, 4)), np.zeros((0,))) == []


def test_degenerate_boxes_are_never_suppressed():
    boxes = [[5, 5, 5, 5], [5, 5, 5, 5], [0, 0, 10, 10]]  # zero area: IoU 0/0 is NaN, not > threshold
    assert keep(boxes, [0.9, 0.8, 0.7], iou_threshold=0.1) == [0, 1, 2]


def test_bad_arguments_are_one_line_errors():
    b, s = mx.zeros((3, 4)), mx.zeros((3,))
    with pytest.raises(mlxnet.MlxnetError, match=r"boxes must be an \(N, 4\) xyxy array, got shape \(3, 5\)"):
        ops.nms(mx.zeros((3, 5)), s)
    with pytest.raises(mlxnet.MlxnetError, match=r"scores must have shape \(3,\)"):
        ops.nms(b, mx.zeros((4,)))
    with pytest.raises(mlxnet.MlxnetError, match=r"classes must have shape \(3,\)"):
        ops.nms(b, s, mx.zeros((2,), mx.int32))
    with pytest.raises(mlxnet.MlxnetError, match="iou_threshold must be in"):
        ops.nms(b, s, iou_threshold=1.5)
    with pytest.raises(mlxnet.MlxnetError, match="conf and iou must be in"):
        postprocess(mx.zeros((10, 84)), conf=2.0)


def test_nms_is_a_registered_op_with_its_kernel():
    op = ops.get("nms")
    assert op.definition is not None and op.has_kernel
    assert {k.kernel for k in op.sources} == {"nms_mask", "nms_scan"}


@pytest.mark.gpu
def test_gpu_nms_equals_cpu(gpu):
    args, kwargs = ops.get("nms").example()
    on_gpu = np.array(ops.nms(*args, **kwargs))
    with mlxnet.use_device("cpu"):
        on_cpu = np.array(ops.nms(*args, **kwargs))
    np.testing.assert_array_equal(on_gpu, on_cpu)
    assert 10 < len(on_cpu) < 200
