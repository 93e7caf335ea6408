"""`mlxnet val detect`: the metrics against cases worked by hand, the dataset rules, and the
command's one-line errors."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from mlxnet.cli import app
from mlxnet.errors import MlxnetError
from mlxnet.evaluation import dataset as ds
from mlxnet.evaluation.metrics import Stats, ap_per_class, average_precision, curve, match

FIXTURES = Path(__file__).parent / "fixtures" / "yolo"
runner = CliRunner()


def evaluate(images: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
             method: str = "ultralytics"):
    """Each image: (pred boxes, pred scores, pred classes, label boxes, label classes)."""
    stats = Stats()
    for pb, ps, pc, lb, lc in images:
        stats.add(match(pb, ps, pc, lb, lc, method), ps, pc, lc)
    return ap_per_class(stats, method)


def boxes(*rows: list[float]) -> np.ndarray:
    return np.array(rows, np.float64).reshape(-1, 4)


LABELS = [(boxes([10, 10, 50, 50], [60, 60, 100, 120]), np.array([0, 1])),
          (boxes([0, 0, 30, 40]), np.array([0]))]


@pytest.mark.parametrize("method, expected", [("coco", 1.0), ("ultralytics", 0.995)])
def test_predictions_equal_to_the_labels(method, expected) -> None:
    """Perfect predictions: COCO's AP is 1; ultralytics' trapezoid ends at precision 0 at recall
    1, so its AP of a perfect class is 0.995 (as `yolo val` prints)."""
    result = evaluate([(lb, np.full(len(lc), 0.9), lc, lb, lc) for lb, lc in LABELS], method)
    assert result.map == pytest.approx(expected) and result.map50 == pytest.approx(expected)
    assert result.precision.tolist() == pytest.approx([1, 1]) and result.recall.tolist() == pytest.approx([1, 1])
    assert result.labels.tolist() == [2, 1] and result.images.tolist() == [2, 1]


@pytest.mark.parametrize("method, perfect", [("coco", 1.0), ("ultralytics", 0.995)])
def test_shifted_boxes_lose_the_strict_thresholds(method, perfect) -> None:
    """A box shifted 10 px along a 100 px side: IoU 90/110 = 0.818, a hit at IoU 0.50...0.80
    (7 of the 10 thresholds), a miss at 0.85, 0.90 and 0.95."""
    label = boxes([0, 0, 100, 100])
    pred = boxes([10, 0, 110, 100])
    result = evaluate([(pred, np.array([0.8]), np.array([0]), label, np.array([0]))], method)
    assert result.map50 == pytest.approx(perfect)
    assert result.map == pytest.approx(perfect * 7 / 10)
    assert result.ap[0].tolist() == pytest.approx([perfect] * 7 + [0.0] * 3)


def test_a_curve_worked_by_hand() -> None:
    """2 images, 3 labels of one class; predictions by score: a hit in image 1 (0.9), a miss
    (0.8), a hit in image 2 (0.7); image 1's second object is never found.

    recall 1/3, 1/3, 2/3; precision 1, 1/2, 2/3. The envelope is 1 up to recall 1/3 and 2/3 up
    to recall 2/3. COCO's 101 points: r = 0.00...0.33 (34 points) -> 1, r = 0.34...0.66 (33)
    -> 2/3, r >= 0.67 (34) -> 0: AP = (34 + 33 * 2/3) / 101 = 56/101. ultralytics' trapezoid
    (8.4) drops to 0 just past recall 2/3: the area is about 1/3 + 2/9 = 5/9 (the 0.01 grid
    blurs the steps: computed below)."""
    a, b, c = [10, 10, 50, 50], [60, 10, 90, 40], [0, 0, 40, 40]
    image1 = (boxes(a, [200, 200, 240, 240]), np.array([0.9, 0.8]), np.array([0, 0]), boxes(a, b), np.array([0, 0]))
    image2 = (boxes(c), np.array([0.7]), np.array([0]), boxes(c), np.array([0]))
    correct = np.concatenate([match(*image1), match(*image2)])
    assert correct[:, 0].tolist() == [True, False, True] and (correct == correct[:, :1]).all()
    recall, precision = curve(correct, np.array([0.9, 0.8, 0.7]), 3)
    assert recall[:, 0].tolist() == pytest.approx([1 / 3, 1 / 3, 2 / 3])
    assert precision[:, 0].tolist() == pytest.approx([1, 1 / 2, 2 / 3])
    assert average_precision(recall[:, 0], precision[:, 0], "coco") == pytest.approx(56 / 101)
    # The trapezoid by hand (ultralytics 8.4): 1 on 0...0.33, the step between 0.33 (1) and 0.34
    # (2/3), 2/3 on 0.34...0.66, then precision 0 past the highest recall reached (2/3): the grid
    # point 0.67 is already 0, so the last trapezoid (0.66 -> 0.67) is half of 2/3 * 0.01.
    grid = np.linspace(0, 1, 101)
    y = np.where(grid <= 1 / 3, 1.0, np.where(grid <= 2 / 3, 2 / 3, 0.0))
    trapezoid = sum((y[i] + y[i + 1]) / 2 * 0.01 for i in range(100))
    assert average_precision(recall[:, 0], precision[:, 0], "ultralytics") == pytest.approx(trapezoid)
    assert trapezoid == pytest.approx(5 / 9, abs=0.01)
    for method, ap in (("coco", 56 / 101), ("ultralytics", trapezoid)):
        result = evaluate([image1, image2], method)
        assert result.map50 == pytest.approx(ap) and result.map == pytest.approx(ap)


def test_ultralytics_matching_takes_the_free_label_as_yolo_val_8_4() -> None:
    """Two labels side by side; prediction 0 is label 0, prediction 1 (lower score) overlaps
    label 0 more (IoU 96/104) than label 1 (94/106). ultralytics 8.4 (and COCO): prediction 1
    takes label 1, the best label still free, up to IoU 0.887 (thresholds 0.50...0.85).
    (ultralytics 8.3 let it pick the taken label 0 and made it a false positive.)"""
    label_boxes = boxes([0, 0, 100, 100], [10, 0, 110, 100])
    preds = boxes([0, 0, 100, 100], [4, 0, 104, 100])
    args = (preds, np.array([0.9, 0.8]), np.array([0, 0]), label_boxes, np.array([0, 0]))
    coco, ultra = match(*args, "coco"), match(*args, "ultralytics")
    assert ultra[1].tolist() == [True] * 8 + [False] * 2 and ultra[0].all()
    assert (ultra == coco).all()


def test_ultralytics_matching_follows_the_given_order() -> None:
    """ultralytics takes the predictions in NMS's order (highest score first) as given; a label
    claimed at one threshold is still free at the thresholds its claimer missed."""
    label_boxes = boxes([0, 0, 100, 100])
    preds = boxes([0, 0, 100, 80], [0, 0, 100, 100])  # IoU 0.8, then 1
    ultra = match(preds, np.array([0.9, 0.8]), np.array([0, 0]), label_boxes, np.array([0]), "ultralytics")
    assert ultra[0].tolist() == [True] * 7 + [False] * 3  # 0.50...0.80
    assert ultra[1].tolist() == [False] * 7 + [True] * 3  # the label is free at 0.85...0.95


def test_other_classes_never_match_and_unlabelled_classes_are_not_averaged() -> None:
    label = boxes([0, 0, 10, 10])
    result = evaluate([(boxes([0, 0, 10, 10], [0, 0, 10, 10]), np.array([0.9, 0.8]), np.array([1, 2]),
                        label, np.array([0]))])
    assert result.classes.tolist() == [0] and result.map == 0.0


def write_dataset(root: Path, labels: dict[str, str] | None = None, yaml: str | None = None) -> Path:
    """The two fixture photos under images/val, with label files (None: the defaults)."""
    (root / "images" / "val").mkdir(parents=True)
    (root / "labels" / "val").mkdir(parents=True)
    for name in ("bus", "zidane"):
        shutil.copy(FIXTURES / f"{name}.jpg", root / "images" / "val" / f"{name}.jpg")
    for name, text in (labels if labels is not None else {"bus": "0 0.5 0.5 0.2 0.4\n",
                                                          "zidane": "1 0.3 0.3 0.1 0.1\n"}).items():
        (root / "labels" / "val" / f"{name}.txt").write_text(text)
    default = "path: .\nval: images/val\nnames:\n  0: person\n  1: bus\n"  # names as {id: name}
    (root / "data.yaml").write_text(yaml if yaml is not None else default)
    return root / "data.yaml"


def test_the_dataset_as_ultralytics_reads_it(tmp_path) -> None:
    data = ds.load(write_dataset(tmp_path))
    assert data.names == ("person", "bus") and [p.name for p in data.images] == ["bus.jpg", "zidane.jpg"]
    assert ds.label_path(tmp_path / "images" / "val" / "bus.jpg") == tmp_path / "labels" / "val" / "bus.txt"
    found, ids = ds.read_labels(data.images[0], 810, 1080, 2)
    assert ids.tolist() == [0] and found[0].tolist() == pytest.approx([324, 324, 486, 756])
    # A list file, relative to its folder; a missing label file is an image without objects.
    (tmp_path / "val.txt").write_text("images/val/zidane.jpg\n")
    (tmp_path / "labels" / "val" / "zidane.txt").unlink()
    (tmp_path / "data.yaml").write_text("val: val.txt\nnames: [person, bus]\n")
    data = ds.load(tmp_path)
    assert [p.name for p in data.images] == ["zidane.jpg"]
    assert ds.read_labels(data.images[0], 10, 10, 2)[1].size == 0


def test_polygons_and_duplicate_lines(tmp_path) -> None:
    path = write_dataset(tmp_path, {"bus": "0 0.1 0.2 0.5 0.2 0.3 0.6\n0 0.1 0.2 0.5 0.2 0.3 0.6\n", "zidane": ""})
    found, ids = ds.read_labels(ds.load(path).images[0], 100, 100, 2)
    assert ids.tolist() == [0] and found[0].tolist() == pytest.approx([10, 20, 50, 60]) and len(found) == 1


@pytest.mark.parametrize("yaml, message", [
    ("names: [a]\n", "missing key val"),
    ("val: images/val\n", "missing key names"),
    ("path: .\n", "missing keys val, names"),
    ("val: nowhere\nnames: [a]\n", "'val' names no folder"),
    ("val: images/val\nnames: {1: a}\n", "'names' ids must be 0..0"),
    ("val: [images/val\n", "not valid YAML"),
])
def test_bad_yaml_is_one_line_naming_the_file(tmp_path, yaml, message) -> None:
    path = write_dataset(tmp_path, yaml=yaml)
    with pytest.raises(MlxnetError, match=message) as e:
        ds.load(path)
    assert str(e.value).startswith(str(path)) or str(e.value).startswith(str(tmp_path))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("line, message", [
    ("0 0.5 0.5 0.2\n", "expected 'class cx cy w h'"),
    ("0 0.5 0.5 0.2 0.2 0.1\n", "got 6 fields"),
    ("7 0.5 0.5 0.2 0.2\n", "class 7 is out of range"),
    ("0 0.5 0.5 1.2 0.2\n", "normalised to 0-1"),
    ("zero 0.5 0.5 0.2 0.2\n", "not numbers"),
])
def test_bad_label_lines_name_the_file_and_line(tmp_path, line, message) -> None:
    path = write_dataset(tmp_path, {"bus": "0 0.5 0.5 0.1 0.1\n" + line, "zidane": ""})
    with pytest.raises(MlxnetError, match=message) as e:
        ds.read_labels(ds.load(path).images[0], 100, 100, 2)
    assert str(e.value).startswith(f"{tmp_path / 'labels' / 'val' / 'bus.txt'}:2: ")


def test_the_command_prints_the_table_and_json(tmp_path) -> None:
    data = write_dataset(tmp_path)
    result = runner.invoke(app, ["val", "detect", str(data), "--weights", "random", "--imgsz", "320"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if "mAP50-95" in line)
    assert lines[header].split() == ["Class", "Images", "Instances", "Box(P", "R", "mAP50", "mAP50-95)"]
    assert lines[header + 1].split()[:3] == ["all", "2", "2"]
    assert [line.split()[0] for line in lines[header + 2:-1]] == ["person", "bus"]
    # Quiet by default: the table and the speed line, no line per image (those come with --verbose).
    assert header == 0 and lines[-1].startswith("Speed: ") and "images/s" in lines[-1]
    assert all(word in lines[-1] for word in ("decode", "forward", "NMS"))
    verbose = runner.invoke(app, ["val", "detect", str(data), "--weights", "random", "--imgsz", "320", "-v"])
    assert [line.split(":")[0].rsplit("/", 1)[-1] for line in verbose.stdout.splitlines()[:2]] == ["bus.jpg",
                                                                                                "zidane.jpg"]
    result = runner.invoke(app, ["val", "detect", str(data), "--weights", "random", "--imgsz", "320", "--json"])
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [r.get("image", "").rsplit("/", 1)[-1] for r in records[:2]] == ["bus.jpg", "zidane.jpg"]
    metrics, speed = records[-1]["metrics"], records[-1]["speed"]
    assert metrics["images"] == 2 and [c["name"] for c in metrics["classes"]] == ["person", "bus"]
    assert speed["images"] == 2 and speed["images_per_s"] > 0 and speed["seconds"] > 0
    assert all(speed[f"{stage}_ms"] > 0 for stage in ("decode", "forward", "nms"))
    saved = tmp_path / "out" / "predictions.json"
    result = runner.invoke(app, ["val", "detect", str(data), "--weights", "random", "--imgsz", "320",
                                 "--save-json", str(saved)])
    assert result.exit_code == 0, result.output
    found = json.loads(saved.read_text())
    assert found and {r["image_id"] for r in found} <= {"bus", "zidane"}
    assert all(len(r["bbox"]) == 4 and r["bbox"][2] >= 0 and 0 <= r["category_id"] < 80 for r in found)


def test_the_command_reports_a_bad_label_file_and_carries_on(tmp_path) -> None:
    data = write_dataset(tmp_path, {"bus": "0 0.5 0.5\n", "zidane": "1 0.3 0.3 0.1 0.1\n"})
    result = runner.invoke(app, ["val", "detect", str(data), "--weights", "random", "--imgsz", "320"])
    assert result.exit_code == 1
    assert f"{tmp_path / 'labels' / 'val' / 'bus.txt'}:1: expected" in result.stderr
    assert any(line.split()[:3] == ["all", "1", "1"] for line in result.stdout.splitlines())


def test_the_command_refuses_a_dataset_without_names(tmp_path) -> None:
    data = write_dataset(tmp_path, yaml="val: images/val\n")
    result = runner.invoke(app, ["val", "detect", str(data), "--weights", "random"])
    assert isinstance(result.exception, MlxnetError) and str(result.exception) == f"{data}: missing key names"


def test_coco_method_equals_pycocotools() -> None:
    """The ``coco`` convention against COCOeval on random detections (area range "all", at most
    100 detections per image, distinct scores so that no tie order differs)."""
    pytest.importorskip("pycocotools")
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    rng = np.random.default_rng(7)
    images = []
    coco_images, coco_gts, coco_dts = [], [], []
    for image_id in range(1, 9):
        n = int(rng.integers(0, 6))
        xy = rng.uniform(0, 400, (n, 2))
        label_boxes = np.concatenate([xy, xy + rng.uniform(10, 120, (n, 2))], axis=1)
        label_classes = rng.integers(0, 3, n)
        # Predictions: the labels jittered (some far off), and a few boxes anywhere.
        jitter = label_boxes + rng.normal(0, 6, label_boxes.shape)
        extra_xy = rng.uniform(0, 400, (3, 2))
        extra = np.concatenate([extra_xy, extra_xy + rng.uniform(10, 120, (3, 2))], axis=1)
        pred_boxes = np.concatenate([jitter, extra])
        pred_classes = np.concatenate([label_classes, rng.integers(0, 3, 3)])
        pred_scores = rng.uniform(0.01, 1, len(pred_boxes))
        images.append((pred_boxes, pred_scores, pred_classes, label_boxes, label_classes))
        coco_images.append({"id": image_id, "width": 640, "height": 640})
        for box, c in zip(label_boxes, label_classes):
            w, h = box[2] - box[0], box[3] - box[1]
            coco_gts.append({"id": len(coco_gts) + 1, "image_id": image_id, "category_id": int(c) + 1,
                             "bbox": [box[0], box[1], w, h], "area": w * h, "iscrowd": 0})
        for box, s, c in zip(pred_boxes, pred_scores, pred_classes):
            coco_dts.append({"image_id": image_id, "category_id": int(c) + 1, "score": float(s),
                             "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]]})
    truth = COCO()
    truth.dataset = {"images": coco_images, "annotations": coco_gts,
                     "categories": [{"id": k + 1, "name": str(k)} for k in range(3)]}
    truth.createIndex()
    evaluation = COCOeval(truth, truth.loadRes(coco_dts), "bbox")
    evaluation.params.areaRng, evaluation.params.areaRngLbl = [[0, 1e10]], ["all"]
    evaluation.params.maxDets = [100]
    evaluation.evaluate()
    evaluation.accumulate()
    precision = evaluation.eval["precision"][:, :, :, 0, 0]  # (T, R, K)
    present = [k for k in range(3) if (precision[:, :, k] > -1).any()]
    per_class = [precision[:, :, k].mean() for k in present]
    result = evaluate(images, "coco")
    assert result.classes.tolist() == present and 0.1 < result.map < 0.95  # a case with misses and near misses
    assert result.ap.mean(axis=1).tolist() == pytest.approx(per_class, abs=1e-6)
    assert result.map == pytest.approx(float(np.mean(per_class)), abs=1e-6)
    assert result.map50 == pytest.approx(float(np.mean([precision[0, :, k].mean() for k in present])), abs=1e-6)


def test_an_image_that_does_not_decode_fails_alone(tmp_path) -> None:
    data = write_dataset(tmp_path)
    (tmp_path / "images" / "val" / "broken.jpg").write_bytes(b"not a jpeg")
    result = runner.invoke(app, ["val", "detect", str(data), "--weights", "random", "--imgsz", "320"])
    assert result.exit_code == 1
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")][0].startswith(
        f"error: {tmp_path / 'images' / 'val' / 'broken.jpg'}: ")
    assert any(line.split()[:3] == ["all", "2", "2"] for line in result.stdout.splitlines())
