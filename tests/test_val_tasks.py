"""`val detect` on segment and pose checkpoints: mask mAP (mask IoU) and keypoint mAP (OKS), the
coco metric equal to pycocotools' COCOeval (iouType segm / keypoints) on the same labels and
predictions, and the command's report."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mlxnet.evaluation import instances as inst
from mlxnet.evaluation.dataset import Instances
from mlxnet.evaluation.metrics import Stats, ap_per_class, match_iou
from mlxnet.commands.val import instance_overlap
from test_detect_tasks import saved_checkpoint
from test_yolo_arch import seeded_net

H, W = 60, 80
BUS = Path(__file__).parent / "fixtures" / "yolo" / "bus.jpg"


def _box_of(mask: np.ndarray) -> np.ndarray:
    ys, xs = np.nonzero(mask)
    return np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], np.float64)


def _segment_case(rng):
    """Images of polygon labels, and predictions: shifted copies of some labels' masks (cut to
    their own boxes, as the predictor cuts them), strays, scores at random."""
    images = []
    for _ in range(4):
        polygons, classes = [], []
        for _ in range(rng.integers(2, 5)):
            cx, cy, r = rng.uniform(12, W - 12), rng.uniform(12, H - 12), rng.uniform(4, 11)
            angles = np.sort(rng.uniform(0, 2 * np.pi, 6))
            polygons.append(np.column_stack([cx + r * np.cos(angles), cy + r * np.sin(angles)]))
            classes.append(int(rng.integers(0, 3)))
        boxes = np.array([[p[:, 0].min(), p[:, 1].min(), p[:, 0].max(), p[:, 1].max()] for p in polygons])
        labels = Instances(boxes, np.array(classes), polygons)
        truth = inst.polygon_masks(polygons, boxes, (H, W))
        masks, pred_classes = [], []
        for m, c in zip(truth, classes):
            for _ in range(rng.integers(0, 3)):
                dy, dx = rng.integers(-1, 2, 2)
                masks.append(np.roll(m, (dy, dx), axis=(0, 1)))
                pred_classes.append(c if rng.random() < 0.85 else int(rng.integers(0, 3)))
        for _ in range(rng.integers(1, 3)):  # strays
            stray = np.zeros((H, W), bool)
            y, x = rng.integers(0, H - 8), rng.integers(0, W - 8)
            stray[y:y + 8, x:x + 8] = True
            masks.append(stray)
            pred_classes.append(int(rng.integers(0, 3)))
        masks = np.array(masks)
        images.append((labels, masks, np.array([_box_of(m) for m in masks]), rng.random(len(masks)),
                       np.array(pred_classes)))
    return images


def _cocoeval(iou_type: str, gts: list, dts: list, categories: int, max_dets: int = 100,
              hw: tuple[int, int] = (H, W)) -> np.ndarray:
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    truth = COCO()
    truth.dataset = {"images": [{"id": i, "height": hw[0], "width": hw[1]} for i in range(len({g["image_id"] for g in gts}))],
                     "annotations": gts, "categories": [{"id": c, "name": str(c)} for c in range(categories)]}
    truth.createIndex()
    evaluation = COCOeval(truth, truth.loadRes(dts), iou_type)
    evaluation.params.areaRng, evaluation.params.areaRngLbl = [[0, 1e10]], ["all"]
    evaluation.params.maxDets = [max_dets]
    evaluation.evaluate()
    evaluation.accumulate()
    precision = evaluation.eval["precision"][:, :, :, 0, 0]  # (T, R, K)
    present = [k for k in range(precision.shape[2]) if (precision[:, :, k] > -1).any()]
    return np.array([[precision[:, :, k].mean(), precision[0, :, k].mean()] for k in present])


def test_mask_map_equals_cocoeval_segm():
    pytest.importorskip("pycocotools")
    from pycocotools import mask as rle

    stats, gts, dts = Stats(), [], []
    for image_id, (labels, masks, boxes, scores, classes) in enumerate(_segment_case(np.random.default_rng(5))):
        overlap, counted, ignored = instance_overlap("segment", labels, masks, boxes, (H, W), "coco")
        stats.add(match_iou(overlap, scores, classes, labels.classes, "coco", ignored=ignored), scores, classes,
                  labels.classes[counted])
        truth = inst.polygon_masks(labels.polygons, labels.boxes, (H, W))
        for m, c in zip(truth, labels.classes):
            code = rle.encode(np.asfortranarray(m.astype(np.uint8)))
            gts.append({"id": len(gts) + 1, "image_id": image_id, "category_id": int(c), "segmentation": code,
                        "area": float(rle.area(code)), "bbox": list(rle.toBbox(code)), "iscrowd": 0})
        for m, s, c in zip(masks, scores, classes):
            dts.append({"image_id": image_id, "category_id": int(c), "score": float(s),
                        "segmentation": rle.encode(np.asfortranarray(m.astype(np.uint8)))})
    _same_as_cocoeval(stats, _cocoeval("segm", gts, dts, 3), classes=3)


def test_keypoint_map_equals_cocoeval_keypoints():
    """Labels with invisible keypoints and with none visible (COCOeval ignores those)."""
    pytest.importorskip("pycocotools")
    rng = np.random.default_rng(7)
    stats, gts, dts = Stats(), [], []
    for image_id in range(4):
        n = int(rng.integers(2, 5))
        centres = rng.uniform(15, [W - 15, H - 15], (n, 2))
        points = np.concatenate([centres[:, None] + rng.normal(0, 5, (n, 17, 2)), rng.integers(0, 3, (n, 17, 1))], -1)
        points[0, :, 2] = 0  # the first label shows no keypoint
        boxes = np.concatenate([points[..., :2].min(1) - 2, points[..., :2].max(1) + 2], axis=1)
        classes = rng.integers(0, 2, n)
        labels = Instances(boxes, classes, [None] * n, points)
        preds, pred_classes = [], []
        for p, c in zip(points, classes):
            for _ in range(rng.integers(1, 3)):
                preds.append(np.concatenate([p[:, :2] + rng.normal(0, rng.uniform(0.3, 4)), rng.random((17, 1))], -1))
                pred_classes.append(int(c))
        preds.append(np.concatenate([rng.uniform(0, W, (17, 1)), rng.uniform(0, H, (17, 1)), np.ones((17, 1))], -1))
        pred_classes.append(0)
        preds, pred_classes, scores = np.array(preds), np.array(pred_classes), rng.random(len(preds))
        overlap, counted, ignored = instance_overlap("pose", labels, preds, np.zeros((len(preds), 4)), (H, W), "coco")
        stats.add(match_iou(overlap, scores, pred_classes, classes, "coco", ignored=ignored), scores, pred_classes,
                  classes[counted])
        for p, b, c in zip(points, boxes, classes):
            gts.append({"id": len(gts) + 1, "image_id": image_id, "category_id": int(c), "iscrowd": 0,
                        "keypoints": p.reshape(-1).tolist(), "num_keypoints": int((p[:, 2] > 0).sum()),
                        "bbox": [b[0], b[1], b[2] - b[0], b[3] - b[1]],
                        "area": float((b[2] - b[0]) * (b[3] - b[1]) * inst.AREA_FROM_BOX)})
        for p, s, c in zip(preds, scores, pred_classes):
            dts.append({"image_id": image_id, "category_id": int(c), "score": float(s),
                        "keypoints": p.reshape(-1).tolist()})
    _same_as_cocoeval(stats, _cocoeval("keypoints", gts, dts, 2), classes=2)


def _same_as_cocoeval(stats: Stats, theirs: np.ndarray, classes: int) -> None:
    """Per class (mAP50-95, mAP50) of the coco metric equal COCOeval's, neither 0 nor 1 overall."""
    result = ap_per_class(stats, "coco")
    ours = np.column_stack([result.ap.mean(axis=1), result.ap[:, 0]])
    assert ours.shape == theirs.shape == (classes, 2)
    assert 0.05 < ours[:, 0].mean() < 0.95
    np.testing.assert_allclose(ours, theirs, atol=1e-6)


@pytest.mark.parametrize("name", ["yolo11n-seg", "yolov8n-pose"])
def test_val_detect_reports_mask_or_pose_metrics(name, tmp_path):
    """Labels made from the model's own predictions on bus.jpg (as `detect --save-txt` writes
    them): the masks' or keypoints' mAP is high, and both metrics print."""
    net = seeded_net(name)
    weights = saved_checkpoint(name, tmp_path)  # a -seg one with masks that have pixels
    root = tmp_path / "data"
    (root / "images").mkdir(parents=True)
    (root / "images" / "bus.jpg").write_bytes(BUS.read_bytes())
    run = [sys.executable, "-m", "mlxnet"]
    made = subprocess.run(run + ["detect", str(root / "images" / "bus.jpg"), "-w", str(weights), "-o",
                                 str(tmp_path / "pred"), "--imgsz", "320", "--conf", "0.3", "--max-det", "6",
                                 "--save-txt"], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    (root / "labels").mkdir()
    (root / "labels" / "bus.txt").write_text((tmp_path / "pred" / "labels" / "bus.txt").read_text())
    spec = {"path": str(root), "val": "images", "names": {i: f"c{i}" for i in range(net.nc)}}
    if name.endswith("-pose"):
        spec["kpt_shape"] = [17, 3]
    (root / "data.yaml").write_text(json.dumps(spec))
    saved = tmp_path / "predictions.json"
    for metric in ("ultralytics", "coco"):
        done = subprocess.run(run + ["val", "detect", str(root / "data.yaml"), "-w", str(weights), "--imgsz", "320",
                                     "--json", "--metric", metric, "--save-json", str(saved)],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        metrics = json.loads(done.stdout.splitlines()[-1])["metrics"]
        task = metrics["masks" if name.endswith("-seg") else "keypoints"]
        assert task["instances"] == metrics["instances"] > 0
        assert task["map50"] > 0.5, task
    # The saved predictions through COCOeval against the same labels: the coco numbers.
    pytest.importorskip("pycocotools")
    from pycocotools import mask as rle

    from mlxnet.evaluation.dataset import read_instances
    from mlxnet.image import load_image

    image = load_image(BUS)
    found = read_instances(root / "images" / "bus.jpg", image.shape[1], image.shape[0], net.nc,
                           (17, 3) if name.endswith("-pose") else None)
    gts = []
    for k, (box, c) in enumerate(zip(found.boxes, found.classes)):
        g = {"id": k + 1, "image_id": 0, "category_id": int(c), "iscrowd": 0,
             "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]]}
        if name.endswith("-seg"):
            m = inst.polygon_masks([found.polygons[k]], found.boxes[k:k + 1], image.shape[:2])[0]
            g["segmentation"] = rle.encode(np.asfortranarray(m.astype(np.uint8)))
            g["area"] = float(rle.area(g["segmentation"]))
        else:
            g["keypoints"] = found.keypoints[k].reshape(-1).tolist()
            g["num_keypoints"] = int((found.keypoints[k][:, 2] > 0).sum())
            g["area"] = float((box[2] - box[0]) * (box[3] - box[1]) * inst.AREA_FROM_BOX)
        gts.append(g)
    dts = json.loads(saved.read_text())
    assert all(("segmentation" in d) == name.endswith("-seg") and ("keypoints" in d) != name.endswith("-seg")
               for d in dts)
    for d in dts:
        d["image_id"] = 0
    theirs = _cocoeval("segm" if name.endswith("-seg") else "keypoints", gts, dts, net.nc, max_dets=300,
                       hw=image.shape[:2])
    ours = np.array([[c["map50_95"], c["map50"]] for c in task["classes"]])
    np.testing.assert_allclose(ours, theirs, atol=1e-6)
    text = subprocess.run(run + ["val", "detect", str(root), "-w", str(weights), "--imgsz", "320"],
                          capture_output=True, text=True).stdout
    assert ("Mask(P" if name.endswith("-seg") else "Pose(P") in text and "Box(P" in text


@pytest.mark.parametrize("name", ["yolo11n-seg", "yolov8n-pose"])
def test_val_detect_on_a_coco_file_equals_cocoeval(name, tmp_path):
    """A COCO instances file with segmentations (polygons, one object in two parts, and
    run-length masks) or keypoints and areas, the labels the model's own predictions on bus.jpg:
    the command's coco numbers for masks or keypoints equal COCOeval's reading the same file and
    the command's --save-json."""
    pytest.importorskip("pycocotools")
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    from mlxnet.image import load_image

    seg = name.endswith("-seg")
    weights = saved_checkpoint(name, tmp_path)
    images = tmp_path / "images"
    images.mkdir()
    (images / "bus.jpg").write_bytes(BUS.read_bytes())
    run = [sys.executable, "-m", "mlxnet"]
    made = subprocess.run(run + ["detect", str(images / "bus.jpg"), "-w", str(weights), "-o", str(tmp_path / "pred"),
                                 "--imgsz", "320", "--conf", "0.3", "--max-det", "6", "--json"],
                          capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    found = json.loads(made.stdout.splitlines()[-1])["detections"]
    assert len(found) >= 3
    h, w = load_image(BUS).shape[:2]
    annotations = []
    for k, d in enumerate(found):
        x1, y1, x2, y2 = d["box"]
        a = {"id": k + 1, "image_id": 7, "category_id": d["class"] + 1, "iscrowd": 0,
             "bbox": [x1, y1, x2 - x1, y2 - y1]}
        if seg:
            outline = np.column_stack([d["segments"]["x"], d["segments"]["y"]]) + k % 3 - 1  # moved a pixel
            polygon = outline.reshape(-1).tolist()
            if k % 3 == 0:  # run-length, as pycocotools encodes it
                mask = inst.coco_polygon_mask([outline], (h, w))
                a["segmentation"] = inst.coco_rle(mask)
                a["area"] = float(mask.sum())
            else:  # polygons; the second object's in two parts
                half = len(outline) // 2 if k == 1 and len(outline) >= 8 else len(outline)
                a["segmentation"] = [p for p in (outline[:half].reshape(-1).tolist(), outline[half:].reshape(-1).tolist())
                                     if len(p) >= 6] or [polygon]
                a["area"] = float(inst.coco_polygon_mask([np.array(p).reshape(-1, 2) for p in a["segmentation"]],
                                                         (h, w)).sum())
        else:
            kp = d["keypoints"]
            shift = np.random.default_rng(k).normal(0, 2 + k, (len(kp["x"]), 2))
            vis = [0 if (k == 0 or j % 5 == 4) else 2 for j in range(len(kp["x"]))]  # object 0 shows none
            a["keypoints"] = np.column_stack([np.array(kp["x"]) + shift[:, 0], np.array(kp["y"]) + shift[:, 1],
                                              vis]).reshape(-1).tolist()
            a["num_keypoints"] = int(sum(v > 0 for v in vis))
            a["area"] = float((x2 - x1) * (y2 - y1) * 0.6)
        annotations.append(a)
    named = {d["class"]: d["name"] for d in found}  # categories by the model's names; id = class + 1
    spec = {"images": [{"id": 7, "file_name": "bus.jpg", "height": h, "width": w}], "annotations": annotations,
            "categories": [{"id": c + 1, "name": n} for c, n in sorted(named.items())]}
    data = tmp_path / "instances_val.json"
    data.write_text(json.dumps(spec))
    saved = tmp_path / "predictions.json"
    done = subprocess.run(run + ["val", "detect", str(data), "--images", str(images), "-w", str(weights), "--imgsz",
                                 "320", "--json", "--metric", "coco", "--save-json", str(saved)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    task = json.loads(done.stdout.splitlines()[-1])["metrics"]["masks" if seg else "keypoints"]
    truth = COCO(str(data))
    evaluation = COCOeval(truth, truth.loadRes(str(saved)), "segm" if seg else "keypoints")
    evaluation.params.areaRng, evaluation.params.areaRngLbl = [[0, 1e10]], ["all"]
    evaluation.params.maxDets = [300]
    evaluation.evaluate()
    evaluation.accumulate()
    precision = evaluation.eval["precision"][:, :, :, 0, 0]
    theirs = {cid - 1: (precision[:, :, k].mean(), precision[0, :, k].mean())
              for k, cid in enumerate(evaluation.params.catIds) if (precision[:, :, k] > -1).any()}
    ours = {c["class"]: (c["map50_95"], c["map50"]) for c in task["classes"]}
    assert sorted(ours) == sorted(theirs) and len(ours) >= 1
    np.testing.assert_allclose([ours[k] for k in sorted(ours)], [theirs[k] for k in sorted(theirs)], atol=1e-6)
    assert 0.05 < np.mean([v[0] for v in ours.values()]) < 0.99


def test_coco_polygons_and_run_lengths_as_pycocotools_makes_them():
    """Polygons (several per object, points outside the image, repeated points) filled pixel for
    pixel as frPyObjects + merge fill them; run-length masks decoded from both of its forms."""
    pytest.importorskip("pycocotools")
    from pycocotools import mask as rle

    rng = np.random.default_rng(3)
    for case in range(300):
        h, w = (int(v) for v in rng.integers(1, 60, 2))
        parts = []
        for _ in range(int(rng.integers(1, 3))):
            n = int(rng.integers(3, 9))
            points = np.column_stack([rng.uniform(-5, w + 5, n), rng.uniform(-5, h + 5, n)])
            if case % 4 == 0:
                points = np.round(points)
                points[1] = points[0]
            parts.append(points)
        ours = inst.coco_polygon_mask(parts, (h, w))
        theirs = rle.decode(rle.merge(rle.frPyObjects([p.reshape(-1).tolist() for p in parts], h, w))).astype(bool)
        np.testing.assert_array_equal(ours, theirs)
        code = rle.encode(np.asfortranarray(theirs.astype(np.uint8)))
        np.testing.assert_array_equal(inst.coco_rle_decode({"size": [h, w], "counts": code["counts"].decode()}, "x"),
                                      theirs)
        flat = theirs.reshape(-1, order="F").astype(np.int8)
        runs = np.diff(np.concatenate([[0], np.flatnonzero(np.diff(flat)) + 1, [flat.size]])).tolist()
        runs = [0] + runs if flat[0] else runs
        np.testing.assert_array_equal(inst.coco_rle_decode({"size": [h, w], "counts": runs}, "x"), theirs)


@pytest.mark.parametrize("annotation, message", [
    ({"segmentation": [[1, 2, 3, 4]]}, "not 3 or more x, y pairs"),
    ({"segmentation": {"size": [2], "counts": "0"}}, "'size' must be [height, width]"),
    ({"segmentation": "abc"}, "must be polygons"),
    ({"keypoints": [1, 2]}, "x, y, visibility triples"),
    ({"area": -3}, "key 'area' must be a number >= 0"),
])
def test_coco_file_segment_and_keypoint_fields_are_checked(annotation, message, tmp_path):
    from mlxnet.errors import MlxnetError
    from mlxnet.evaluation import coco

    (tmp_path / "bus.jpg").write_bytes(BUS.read_bytes())
    spec = {"images": [{"id": 1, "file_name": "bus.jpg"}], "categories": [{"id": 1, "name": "person"}],
            "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 1, 5, 5], **annotation}]}
    (tmp_path / "a.json").write_text(json.dumps(spec))
    with pytest.raises(MlxnetError, match=r"a\.json: annotations\[0\]: .*" + re.escape(message)):
        coco.load(tmp_path / "a.json")


def test_coco_run_length_masks_must_fit_their_image(tmp_path):
    from mlxnet.errors import MlxnetError
    from mlxnet.evaluation import coco

    (tmp_path / "bus.jpg").write_bytes(BUS.read_bytes())
    spec = {"images": [{"id": 1, "file_name": "bus.jpg"}], "categories": [{"id": 1, "name": "person"}],
            "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 1, 5, 5],
                             "segmentation": {"size": [4, 5], "counts": [3, 2, 15]}},
                            {"id": 2, "image_id": 1, "category_id": 1, "bbox": [1, 1, 5, 5],
                             "segmentation": {"size": [4, 5], "counts": [3, 2, 14]}}]}
    (tmp_path / "a.json").write_text(json.dumps(spec))
    image = coco.load(tmp_path / "a.json").images[0]
    with pytest.raises(MlxnetError, match=r"object 0's segmentation is a 5x4 run-length mask, the image 810x1080"):
        image.masks((1080, 810))
    with pytest.raises(MlxnetError, match=r"object 1's segmentation: run-length counts cover 19 pixels, its size 4x5 is 20"):
        image.masks((4, 5))
    assert inst.coco_rle_decode(spec["annotations"][0]["segmentation"], "x").sum() == 2
