"""`mlxnet val detect` on COCO-format data: the instances file as people lay it out, its
one-line errors, categories mapped to the model's classes by name, and the metric equal to
pycocotools' COCOeval on the predictions the command saves."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from mlxnet.cli import app
from mlxnet.errors import MlxnetError
from mlxnet.evaluation import coco
from mlxnet.models.yolo_process import coco80_names

FIXTURES = Path(__file__).parent / "fixtures" / "yolo"
runner = CliRunner()
# The COCO file's own ids: not the model's indices (person is 1, bus 6), nor the file stems.
IMAGES = {101: ("000000000101.jpg", "bus"), 205: ("000000000205.jpg", "zidane")}
CATEGORIES = [{"id": 1, "name": "person"}, {"id": 6, "name": "bus"}, {"id": 3, "name": "car"}]


def annotation(image_id: int, category_id: int, bbox: list[float], crowd: int = 0) -> dict:
    return {"id": 0, "image_id": image_id, "category_id": category_id, "bbox": bbox, "iscrowd": crowd,
            "area": bbox[2] * bbox[3]}


KNOWN = [annotation(101, 6, [17, 230, 784, 520]), annotation(101, 1, [48, 398, 197, 504]),
         annotation(205, 1, [745, 41, 396, 675]), annotation(205, 1, [0, 0, 50, 50], crowd=1)]


def write_coco(root: Path, annotations: list[dict] | None = None, categories: list[dict] | None = None,
               layout: str = "coco") -> Path:
    """The fixture photos as a COCO split: annotations/instances_val2017.json and the images in
    val2017/ (COCO's download), images/val2017/ (ultralytics') or beside the JSON ("flat")."""
    folder = {"coco": root / "val2017", "ultralytics": root / "images" / "val2017", "flat": root}[layout]
    folder.mkdir(parents=True, exist_ok=True)
    for name, photo in IMAGES.values():
        shutil.copy(FIXTURES / f"{photo}.jpg", folder / name)
    found = annotations if annotations is not None else KNOWN
    spec = {"images": [{"id": i, "file_name": name, "width": 0, "height": 0} for i, (name, _) in IMAGES.items()],
            "annotations": [{**a, "id": n + 1} for n, a in enumerate(found)],
            "categories": categories if categories is not None else CATEGORIES}
    path = (root if layout == "flat" else root / "annotations") / "instances_val2017.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec))
    return path


@pytest.mark.parametrize("layout", ["coco", "ultralytics", "flat"])
def test_the_file_and_its_images_where_people_put_them(tmp_path, layout) -> None:
    data = coco.load(write_coco(tmp_path, layout=layout))
    assert [image.id for image in data.images] == [101, 205]
    assert all(image.path.is_file() for image in data.images)
    assert data.categories == {1: "person", 6: "bus", 3: "car"} and data.crowd == 1  # the crowd box left out
    bus = data.images[0]
    assert bus.categories.tolist() == [6, 1] and bus.boxes[0].tolist() == [17, 230, 801, 750]  # xywh -> xyxy
    assert data.images[1].categories.tolist() == [1]
    assert coco.class_map(data, coco80_names()) == {1: 0, 6: 5, 3: 2}


def test_an_image_folder_given_or_not_found(tmp_path) -> None:
    path = write_coco(tmp_path)
    moved = tmp_path / "elsewhere"
    (tmp_path / "val2017").rename(moved)
    with pytest.raises(MlxnetError, match="cannot find its first image '000000000101.jpg'") as e:
        coco.load(path)
    assert str(e.value).startswith(f"{path}: ") and "--images DIR" in str(e.value) and "\n" not in str(e.value)
    assert coco.load(path, moved).images[0].path == moved / "000000000101.jpg"


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.pop("annotations"), "missing key 'annotations'"),
    (lambda s: s.update(images={}), "expected a list at key 'images'"),
    (lambda s: s["annotations"][1].pop("bbox"), "annotations[1]: missing key 'bbox'"),
    (lambda s: s["annotations"][0].update(bbox=[1, 2, 3]), "annotations[0]: key 'bbox' must be 4 finite numbers"),
    (lambda s: s["annotations"][0].update(bbox=[1, 2, -3, 4]), "annotations[0]: key 'bbox' has a negative width"),
    (lambda s: s["annotations"][2].update(image_id=7), "annotations[2]: key 'image_id' 7 is no image of the file"),
    (lambda s: s["annotations"][2].update(category_id=99), "annotations[2]: key 'category_id' 99 is no category"),
    (lambda s: s["annotations"][2].update(category_id="1"), "annotations[2]: key 'category_id' must be int"),
    (lambda s: s["images"][1].update(id=101), "images[1]: key 'id' 101 appears twice"),
    (lambda s: s["images"][0].pop("file_name"), "images[0]: missing key 'file_name'"),
    (lambda s: s["categories"].append({"id": 9, "name": "bus"}), "key 'categories' names 'bus' twice"),
    (lambda s: s["categories"][0].update(id=6), "categories[1]: key 'id' 6 is category 'person's already"),
])
def test_bad_files_are_one_line_naming_the_file_and_key(tmp_path, edit, message) -> None:
    path = write_coco(tmp_path)
    spec = json.loads(path.read_text())
    edit(spec)
    path.write_text(json.dumps(spec))
    with pytest.raises(MlxnetError) as e:
        coco.load(path)
    text = str(e.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text, text


def test_not_json_names_the_line(tmp_path) -> None:
    path = write_coco(tmp_path)
    path.write_text('{"images": [\n  {"id": 1,}\n]}')
    with pytest.raises(MlxnetError, match=r"not valid JSON \(line 2: ") as e:
        coco.load(path)
    assert str(e.value).startswith(str(path))


def test_a_category_the_model_lacks_is_one_line_naming_the_file(tmp_path) -> None:
    path = write_coco(tmp_path, categories=[*CATEGORIES, {"id": 90, "name": "unicorn"}])
    result = runner.invoke(app, ["val", "detect", str(path), "--weights", "random", "--imgsz", "320"])
    assert isinstance(result.exception, MlxnetError)
    assert str(result.exception) == (f"{path}: category 'unicorn' not among the model's 80 class names "
                                     "(person, bicycle, car, motorcycle, airplane, ...)")


def coco_eval(truth_file: Path, predictions: list[dict]) -> np.ndarray:
    """pycocotools' per-class AP (mean over IoU 0.50:0.95 and over 0.50 alone) of the categories
    with labels, area range "all", at most 100 detections per image."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    truth = COCO(str(truth_file))
    evaluation = COCOeval(truth, truth.loadRes(predictions), "bbox")
    evaluation.params.areaRng, evaluation.params.areaRngLbl = [[0, 1e10]], ["all"]
    evaluation.params.maxDets = [100]
    evaluation.evaluate()
    evaluation.accumulate()
    precision = evaluation.eval["precision"][:, :, :, 0, 0]  # (T, R, K)
    present = [k for k in range(precision.shape[2]) if (precision[:, :, k] > -1).any()]
    return np.array([[precision[:, :, k].mean(), precision[0, :, k].mean()] for k in present])


def test_the_coco_metric_equals_pycocotools_on_the_saved_predictions(tmp_path) -> None:
    """Labels made from the model's own predictions (some jittered, some far off, plus objects
    it misses), so that AP is neither 0 nor 1; then the command's numbers against COCOeval's on
    the predictions it saved, image ids and category ids the file's own."""
    pytest.importorskip("pycocotools")
    # Every COCO80 name, with gapped ids as COCO's own are (person 1, bicycle 3, ...).
    categories = [{"id": 2 * i + 1, "name": name} for i, name in enumerate(coco80_names())]
    first = tmp_path / "first"
    path = write_coco(first, [], categories)
    args = ["val", "detect", "--weights", "random", "--imgsz", "320", "--max-det", "100", "--metric", "coco"]
    saved = tmp_path / "first.json"
    assert runner.invoke(app, [*args, str(path), "--save-json", str(saved)]).exit_code == 0
    found = json.loads(saved.read_text())
    assert {r["image_id"] for r in found} == {101, 205} and {r["category_id"] % 2 for r in found} == {1}
    rng = np.random.default_rng(3)
    labels = []
    for image_id in (101, 205):
        mine = [r for r in found if r["image_id"] == image_id][:12]
        for n, r in enumerate(mine):
            x, y, w, h = r["bbox"]
            shift = [0, 0] if n % 3 == 0 else rng.normal(0, 0.08 * max(w, h), 2).tolist() if n % 3 == 1 else [w, h]
            labels.append(annotation(image_id, r["category_id"], [x + shift[0], y + shift[1], w, h]))
        labels.append(annotation(image_id, 1, [5, 5, 40, 60]))  # a person nothing finds
    root = tmp_path / "second"
    path = write_coco(root, labels, categories)
    saved = tmp_path / "second.json"
    result = runner.invoke(app, [*args, str(path), "--save-json", str(saved), "--json"])
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.stdout.splitlines()[-1])["metrics"]
    ours = np.array([[c["map50_95"], c["map50"]] for c in metrics["classes"]])
    theirs = coco_eval(path, json.loads(saved.read_text()))
    assert ours.shape == theirs.shape and ours.shape[0] >= 3
    assert 0.05 < metrics["map50_95"] < 0.95  # hits, near misses and misses
    np.testing.assert_allclose(ours, theirs, atol=1e-4)
    assert metrics["map50_95"] == pytest.approx(theirs[:, 0].mean(), abs=1e-4)
