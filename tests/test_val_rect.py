"""`mlxnet val detect`'s rect batches and numbers against `yolo val` itself: the golden file of
scripts/goldens/golden_yolo_val.py (ultralytics 8.4, batch 4, rect, conf 0.001, IoU 0.7) on a
dataset both sides rebuild from the fixtures, with seeded weights both sides rebuild."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from mlxnet.cli import app
from mlxnet.evaluation.rect import batch_shapes, image_hw

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = json.loads((ROOT / "tests" / "fixtures" / "val_rect" / "golden.json").read_text())
# Measured: at most 1.1e-7 (mAP50-95 3.6e-8, mAP50 and recall equal, precision 3e-11): the two
# libraries' float32 forwards (fused convolutions summed in other orders) differ by ~1e-7 in
# the scores, which moves P read off the curves and, rarely, an IoU at a threshold.
TOLERANCE = 1e-5
runner = CliRunner()


def _golden_script():
    spec = importlib.util.spec_from_file_location("golden_yolo_val", ROOT / "scripts/goldens/golden_yolo_val.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # numpy at import; the rest inside its functions
    return module


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """The golden's dataset, rebuilt; its images checked pixel for pixel against the golden's."""
    root = tmp_path_factory.mktemp("val_rect")
    script = _golden_script()
    yaml = script.write_dataset(root, GOLDEN["labels"])
    digests = {p.stem: script.pixel_digest(p) for p in sorted((root / "images" / "val").glob("*.png"))}
    assert digests == GOLDEN["images"], "the rebuilt images differ from those the golden measured"
    return yaml


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    """The golden's seeded 3-class YOLOv8n as an mlxnet weights file."""
    import mlx.core as mx

    from mlxnet.models import yolo
    from mlxnet.weights import convert_state_dict, load_into

    w = GOLDEN["weights"]
    state = yolo.seeded_torch_state("n", w["seed"], w["bn_gain"], w["head_gain"], nc=w["nc"])
    net = load_into(yolo.YOLOv8("n", w["nc"]),
                    convert_state_dict({k: mx.array(v) for k, v in state.items()}, "yolov8n", config={"nc": w["nc"]}))
    path = tmp_path_factory.mktemp("weights") / "yolov8n-nc3-seeded.safetensors"
    net.save_weights(str(path))
    return path


def test_the_rect_batches_are_yolo_vals(dataset) -> None:
    images = sorted((dataset.parent / "images" / "val").glob("*.png"))
    order, shapes = batch_shapes([image_hw(p) for p in images], GOLDEN["settings"]["batch"],
                                 GOLDEN["settings"]["imgsz"])
    assert [images[i].stem for i in order] == GOLDEN["rect_order"]
    assert {p.stem: s.tolist() for p, s in zip(images, shapes)} == GOLDEN["rect_shapes"]
    assert len({tuple(s) for s in GOLDEN["rect_shapes"].values()}) > 2  # the dataset exercises several shapes


def test_the_letterbox_to_a_shape_is_yolo_vals() -> None:
    """Worked by hand: 300 x 200 (h x w) at imgsz 640 is first scaled to 640 x 427 (ceil), then
    centred in 672 x 480 without scaling: pad 16 top/bottom, 26/27 left/right."""
    from mlxnet.models.yolo_process import letterbox_to, scale_boxes

    image = np.full((300, 200, 3), 7, np.uint8)
    out, ((gain_h, gain_w), (pad_x, pad_y)) = letterbox_to(image, 640, (672, 480))
    assert out.shape == (672, 480, 3) and (pad_x, pad_y) == (26, 16)
    assert gain_h == pytest.approx(640 / 300) and gain_w == pytest.approx(427 / 200)
    assert (out[16:656, 26:453] == 7).all() and (out[:16] == 114).all() and (out[:, 453:] == 114).all()
    corners = np.array([[26.0, 16.0, 453.0, 656.0]])
    mapped = scale_boxes(out.shape[:2], corners, (300, 200), ((gain_h, gain_w), (pad_x, pad_y)))
    np.testing.assert_allclose(mapped, [[0, 0, 200, 300]], atol=1e-4)


def test_the_numbers_equal_yolo_val(dataset, weights) -> None:
    s = GOLDEN["settings"]
    result = runner.invoke(app, ["val", "detect", str(dataset), "--weights", str(weights), "--batch", str(s["batch"]),
                                 "--imgsz", str(s["imgsz"]), "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [Path(line["image"]).stem for line in lines[:-1]] == sorted(GOLDEN["labels"])  # dataset order
    got = lines[-1]["metrics"]
    want = GOLDEN["metrics"]
    diff = {k: abs(got[k] - want[k]) for k in ("map50_95", "map50", "precision", "recall")}
    per_class = {c["name"]: c for c in got["classes"]}
    for name, w in want["classes"].items():
        for k in ("map50_95", "map50", "precision", "recall"):
            diff[f"{name}.{k}"] = abs(per_class[name][k] - w[k]) if name in per_class else w[k]
    assert max(diff.values()) <= TOLERANCE, f"mlxnet {got}, yolo val {want}: differences {diff}"
