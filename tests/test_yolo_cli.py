"""`mlxnet detect` and YOLO.from_pretrained with ultralytics-style checkpoints (no hub)."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import mlxnet
from mlxnet.image import load_image
from mlxnet.models import yolo
from testutil import save_ultralytics_pt

FIXTURES = Path(__file__).parent / "fixtures" / "yolo"
MLXNET = [sys.executable, "-m", "mlxnet"]


def meta() -> dict:
    return json.loads((FIXTURES / "yolo_golden.json").read_text())


def save_seeded_pt(path: Path, scale: str, gains: tuple[float, float]) -> Path:
    """Like ultralytics' yolov8n.pt (the seeded weights of the goldens, float16)."""
    return save_ultralytics_pt(path, yolo.seeded_torch_state(scale, meta()["seed"], *gains))


@pytest.fixture(scope="module")
def weights_pt(tmp_path_factory) -> Path:
    return save_seeded_pt(tmp_path_factory.mktemp("w") / "yolov8n.pt", "n", tuple(meta()["image_gains"]))


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(MLXNET + list(args), capture_output=True, text=True)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_from_pretrained_reads_the_pickled_fp16_model(weights_pt):
    det = yolo.YOLO.from_pretrained(str(weights_pt), model="yolov8n")
    assert det.net.model[0].conv.weight.dtype == mx.float32
    assert "bn" not in det.net.model[0]  # fused for inference, as ultralytics' predictor does
    m = meta()
    out = det.predict(str(FIXTURES / "bus.jpg"), conf=m["conf"], iou=m["iou"], imgsz=m["imgsz"])
    # fp16 weights: the same boxes as the fp32 golden, to fp16 precision.
    assert abs(len(out) - 37) <= 4 and out.scores.min() > m["conf"]
    # the scale and classes are read from the checkpoint: no model name needed, a wrong one refused
    again = yolo.YOLO.from_pretrained(str(weights_pt))
    assert again.net.scale == "n" and again.names == yolo.coco80_names()
    with pytest.raises(mlxnet.MlxnetError, match=r"holds a yolov8n model, not yolov8s"):
        yolo.YOLO.from_pretrained(str(weights_pt), model="yolov8s")


def test_detect_writes_labelled_copies_and_json(weights_pt, tmp_path):
    images = [tmp_path / "bus.jpg", tmp_path / "zidane.jpg"]
    for im in images:
        shutil.copy(FIXTURES / im.name, im)
    before = [digest(im) for im in images]
    m = meta()
    out = run("detect", *map(str, images), "-m", "yolov8n", "-w", str(weights_pt), "-o", str(tmp_path / "out"),
              "--conf", str(m["conf"]), "--imgsz", str(m["imgsz"]), "--json")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]  # JSON Lines: one object per image
    assert [row["image"] for row in rows] == list(map(str, images))
    assert [digest(im) for im in images] == before  # inputs untouched
    api = yolo.YOLO.from_pretrained(str(weights_pt), model="yolov8n")
    for row, im in zip(rows, images):
        drawn, original = load_image(row["output"]), load_image(im)
        assert drawn.shape == original.shape and (drawn != original).mean() > 0.01
        expected = api.predict(str(im), conf=m["conf"], imgsz=m["imgsz"])
        assert len(row["detections"]) == len(expected) > 5
        first = row["detections"][0]
        assert first["name"] == expected.labels[0] and first["class"] == int(expected.classes[0])
        np.testing.assert_allclose(first["box"], expected.boxes[0], atol=0.01)


def test_detect_summary_without_json(weights_pt, tmp_path):
    out = run("detect", str(FIXTURES / "zidane.jpg"), "-w", str(weights_pt), "-o", str(tmp_path),
              "--conf", "0.95", "--imgsz", "256")
    assert out.returncode == 0, out.stderr
    line, = out.stdout.strip().splitlines()
    assert line.startswith(str(FIXTURES / "zidane.jpg") + ": ") and line.endswith(str(tmp_path / "zidane.jpg"))


@pytest.mark.parametrize("case", ["unreadable", "overwrite", "other_model", "imgsz"])
def test_detect_bad_input_is_one_line_error(case, weights_pt, tmp_path):
    image, weights, extra = str(FIXTURES / "bus.jpg"), str(weights_pt), []
    outdir = tmp_path / "out"
    if case == "unreadable":
        image = str(tmp_path / "notes.jpg")
        Path(image).write_text("not an image")
        expect = "not a readable image"
    elif case == "overwrite":
        shutil.copy(FIXTURES / "bus.jpg", tmp_path / "bus.jpg")
        image, outdir = str(tmp_path / "bus.jpg"), tmp_path
        expect = "output would overwrite the input"
    elif case == "other_model":
        weights = str(save_seeded_pt(tmp_path / "yolov8s.pt", "s", (1.0, 20.0)))
        expect = "yolov8s.pt holds a yolov8s model, not yolov8n"
    else:
        extra = ["--imgsz", "100"]
        expect = "--imgsz must be a positive multiple of 32, got 100"
    before = digest(Path(image))
    out = run("detect", image, "-m", "yolov8n", "-w", weights, "-o", str(outdir), *extra)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expect in lines[0], out.stderr
    assert digest(Path(image)) == before


def test_detect_help():
    out = run("detect", "--help")
    assert out.returncode == 0 and "--imgsz" in out.stdout and "--json" in out.stdout


@pytest.mark.gpu
def test_gpu_detect_matches_cpu(gpu, weights_pt, tmp_path):
    m = meta()
    args = [str(FIXTURES / "bus.jpg"), "-w", str(weights_pt), "--conf", str(m["conf"]), "--imgsz", str(m["imgsz"]),
            "--json"]
    on_gpu = run("--device", "gpu", "detect", *args, "-o", str(tmp_path / "gpu"))
    on_cpu = run("--device", "cpu", "detect", *args, "-o", str(tmp_path / "cpu"))
    assert on_gpu.returncode == 0 and on_cpu.returncode == 0, on_gpu.stderr + on_cpu.stderr
    rows = [json.loads(o.stdout)["detections"] for o in (on_gpu, on_cpu)]  # one image: one JSON line
    gpu_det, cpu_det = ([d["box"] + [d["score"], d["class"]] for d in r] for r in rows)
    from test_yolo import match

    assert abs(len(rows[0]) - len(rows[1])) <= 2
    assert match(np.array(gpu_det), np.array(cpu_det), score_tol=2e-3, iou_min=0.98) >= 0.9
