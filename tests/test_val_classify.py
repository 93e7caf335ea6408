"""`mlxnet val classify DIR`: top-1 / top-5 accuracy on an ImageFolder tree, checked against the
classifier's own predict run image by image, and the folder-to-class mapping and its errors."""
from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from PIL import Image
from typer.testing import CliRunner

from mlxnet.cli import app
from mlxnet.errors import MlxnetError

FIXTURES = Path(__file__).parent / "fixtures" / "yolo"
runner = CliRunner()
NAMES = ["apple", "bus", "sky", "cat", "dog", "tree", "car"]  # the checkpoint's classes; the tree has 3


def checkpoint(path: Path, names: list[str] | None, classes: int = 7, images: Path | None = None) -> Path:
    """A seeded resnet18 with ``classes`` outputs. A random network's features are nearly alike
    for every image, so every image would get one class: the head is centred on the mean
    feature of ``images`` and scaled, so that their classes differ."""
    from mlxnet.models.resnet import Classifier, resnet
    from mlxnet.weights import random_init, save_converted

    net = random_init(resnet("resnet18", classes), seed=1)
    net.eval()  # the running statistics, as the loaded model uses them
    if images is not None:
        pixels = mx.array(np.stack([Classifier.prepare(str(p)) for p in sorted(images.rglob("*.jpg"))]))
        features = net.features(pixels)
        centred = net.fc.weight @ (features - features.mean(axis=0)).T
        # Logits of a few units: apart, but not so far that softmax underflows to tied zeros.
        net.fc.weight = net.fc.weight * (3 / centred.std())
        net.fc.bias = -(net.fc.weight @ features.mean(axis=0))
    weights = dict(tree_flatten(net.parameters()))
    if names is None:
        mx.save_safetensors(str(path), weights)  # a bare file: no class names of its own
    else:
        save_converted(path, weights, "resnet18", {"num_classes": classes}, names, source="test")
    return path


def tree(root: Path, folders: tuple[str, ...] = ("apple", "bus", "sky")) -> Path:
    """Crops and tints of the fixture photos, three or four an image folder (one in a sub-folder)."""
    rng = np.random.default_rng(0)
    photos = [np.asarray(Image.open(FIXTURES / f"{n}.jpg").convert("RGB")) for n in ("bus", "zidane")]
    for c, name in enumerate(folders):
        (root / name / "more").mkdir(parents=True)
        for i in range(3 + c % 2):
            photo = photos[(c + i) % 2]
            y, x = rng.integers(0, 200, 2)
            crop = photo[y:y + 300, x:x + 280].astype(np.float32) * rng.uniform(0.5, 1.2, 3)
            where = root / name / ("more" if i == 0 else "") / f"{i}.jpg"
            Image.fromarray(crop.clip(0, 255).astype(np.uint8)).save(where)
    return root


def expected(weights: Path, root: Path) -> tuple[float, float, int]:
    """Top-1 and top-5 accuracy from the Classifier's own predict, one image at a time."""
    from mlxnet.models import resnet

    net, names = resnet.load(str(weights))
    classifier = resnet.Classifier(net, names)
    one = five = total = 0
    for path in sorted(root.rglob("*.jpg")):
        top = [label for label, _ in classifier.predict(str(path), k=5).top]
        folder = path.relative_to(root).parts[0]
        one, five, total = one + (top[0] == folder), five + (folder in top), total + 1
    return one / total, five / total, total


def test_accuracy_equals_the_classifier_image_by_image(tmp_path) -> None:
    root = tree(tmp_path / "val")
    weights = checkpoint(tmp_path / "net.safetensors", NAMES, images=root)
    top1, top5, total = expected(weights, root)
    assert 0 < top1 < 1 and top5 > top1  # a case with right and wrong answers
    result = runner.invoke(app, ["val", "classify", str(root), "--weights", str(weights), "--json", "--batch", "4"])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    metrics, speed = records[-1]["metrics"], records[-1]["speed"]
    assert metrics["images"] == total == len(records) - 1 and metrics["k"] == 5
    assert metrics["top1"] == pytest.approx(top1) and metrics["top5"] == pytest.approx(top5)
    assert [c["name"] for c in metrics["classes"]] == ["apple", "bus", "sky"]
    assert sum(r["top1"] for r in records[:-1]) == round(top1 * total)
    assert speed["images"] == total and all(speed[f"{s}_ms"] > 0 for s in ("decode", "forward", "topk"))
    # Text: the table and the speed line only.
    text = runner.invoke(app, ["val", "classify", str(root), "--weights", str(weights)])
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["Class", "Images", "top-1", "top-5"]
    assert lines[1].split()[:2] == ["all", str(total)] and float(lines[1].split()[2]) == pytest.approx(top1, abs=1e-3)
    assert [line.split()[0] for line in lines[2:-1]] == ["apple", "bus", "sky"] and lines[-1].startswith("Speed: ")


def test_folders_not_among_the_class_names_are_one_line(tmp_path) -> None:
    weights = checkpoint(tmp_path / "net.safetensors", NAMES)
    root = tree(tmp_path / "val", ("apple", "zebra", "sky"))
    result = runner.invoke(app, ["val", "classify", str(root), "--weights", str(weights)])
    assert isinstance(result.exception, MlxnetError)
    assert str(result.exception) == (f"{root}: class folder 'zebra' not among the model's 7 class names "
                                     "(apple, bus, sky, cat, dog, ...)")


def test_a_checkpoint_without_names_takes_the_folders_in_order(tmp_path) -> None:
    """As torchvision's ImageFolder and timm: sorted folders are classes 0, 1, 2 (when as many)."""
    root = tree(tmp_path / "val", ("n01", "n02", "n03"))
    weights = checkpoint(tmp_path / "bare.safetensors", None, classes=3, images=root)
    result = runner.invoke(app, ["val", "classify", str(root), "--weights", str(weights), "--json"])
    assert result.exit_code == 0, result.output
    assert "taking them in sorted order as classes 0..2" in result.stderr
    from mlxnet.models import resnet

    classifier = resnet.Classifier(resnet.load(str(weights))[0])
    paths = sorted(root.rglob("*.jpg"))
    right = sum(classifier.predict(str(p), k=1).top[0][0] == str(int(p.relative_to(root).parts[0][1:]) - 1)
                for p in paths)
    assert json.loads(result.stdout.splitlines()[-1])["metrics"]["top1"] == pytest.approx(right / len(paths))
    other = tree(tmp_path / "four", ("a", "b", "c", "d"))
    result = runner.invoke(app, ["val", "classify", str(other), "--weights", str(weights)])
    assert str(result.exception).startswith(f"{other}: class folders 'a', 'b', 'c', 'd' not among the model's 3")
