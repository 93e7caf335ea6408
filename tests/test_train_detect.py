"""`mlxnet train detect`: a run from the command line and what it writes (results, plots,
checkpoints the other commands load), the grammar's refusals, a killed run resumed to the same
weights, a loss that is not finite, a bad label, a disk that fills while saving."""
from __future__ import annotations

import csv
import errno
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from typer.testing import CliRunner

from mlxnet.cli import app
from mlxnet.errors import MlxnetError

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("shapes_dataset", ROOT / "scripts/bench/shapes_dataset.py")
shapes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(shapes)

MLXNET = [sys.executable, "-m", "mlxnet"]
TINY = ["-w", "none", "-m", "yolov8n", "--imgsz", "64", "--batch", "4", "--close-mosaic", "1", "--workers", "2"]


class Ran:
    def __init__(self, exit_code: int, output: str) -> None:
        self.exit_code, self.output, self.stdout = exit_code, output, output


def run(*args, code: int = 0) -> Ran:
    """The command in this process; ``output`` holds what it printed and, for a refusal, its
    one-line error (as the console script prints it)."""
    result = CliRunner().invoke(app, [str(a) for a in args])
    exit_code = result.exit_code
    output = result.output
    if isinstance(result.exception, MlxnetError):
        exit_code, output = 1, output + str(result.exception)
    assert exit_code == code, (result.output, result.exception)
    return Ran(exit_code, output)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return shapes.make(tmp_path_factory.mktemp("shapes"), train=8, val=4, seed=3)


@pytest.fixture(scope="module")
def finished(data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "run"
    run("train", "detect", data, *TINY, "--epochs", "2", "-o", out)
    return out


def test_a_run_writes_results_and_checkpoints_the_commands_load(finished, data, tmp_path):
    rows = list(csv.DictReader((finished / "results.csv").read_text().splitlines()))
    assert [int(r["epoch"]) for r in rows] == [1, 2]
    times = [float(r["time"]) for r in rows]  # ultralytics' meaning: seconds since the run began
    assert 0 < times[0] < times[1]
    for r in rows:
        for key in ("train/box_loss", "train/cls_loss", "train/dfl_loss", "metrics/mAP50-95(B)", "lr/pg0"):
            assert np.isfinite(float(r[key])), key
        assert float(r["train/cls_loss"]) > 0
    from PIL import Image

    with Image.open(finished / "results.png") as im:
        assert im.size[0] > 1000 and im.getextrema() != ((255, 255),) * 3
    best = finished / "weights" / "best.safetensors"
    assert best.is_file() and (finished / "weights" / "last.safetensors").is_file()
    found = run("detect", data.parent / "images/val/00000.jpg", "-w", best, "-o", tmp_path / "out", "--json",
                "--conf", "0.0001")
    assert '"name": "' in found.stdout and any(n in found.stdout for n in shapes.NAMES)
    measured = run("val", "detect", data, "-w", best, "--imgsz", "64")
    assert "mAP50-95" in measured.stdout
    from mlxnet.models.yolo import YOLO

    yolo = YOLO.from_pretrained(best)
    assert yolo.names == shapes.NAMES and yolo.net.nc == 3


def test_an_existing_run_is_refused_without_force(finished, data):
    refused = run("train", "detect", data, *TINY, "--epochs", "2", "-o", finished, code=1)
    assert "holds a run" in refused.output and "--resume" in refused.output


def test_a_killed_run_resumes_to_the_uninterrupted_result(data, tmp_path):
    args = ["train", "detect", str(data), *TINY, "--epochs", "4", "--no-val", "--seed", "5"]
    run(*args, "-o", tmp_path / "whole")
    cut = tmp_path / "cut"
    # A session of its own: on CUDA builds `python -m mlxnet` starts itself again with its load-time
    # settings, and the kill must reach the run, not only the parent.
    proc = subprocess.Popen([*MLXNET, *args, "-o", str(cut)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.time() + 300
    while not (cut / "state.safetensors").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)  # into the second epoch (an epoch of these takes about 0.2 s)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    rows = list(csv.DictReader((cut / "results.csv").read_text().splitlines()))
    assert len(rows) < 4, "the run finished before it could be killed"
    resumed = run(*args, "-o", cut, "--resume")
    assert "epoch 1/4" not in resumed.output and "epoch 4/4" in resumed.output
    whole = mx.load(str(tmp_path / "whole" / "weights" / "last.safetensors"))
    again = mx.load(str(cut / "weights" / "last.safetensors"))
    assert whole.keys() == again.keys()
    for key in whole:
        np.testing.assert_allclose(np.array(again[key]), np.array(whole[key]), rtol=1e-5, atol=1e-6, err_msg=key)
    resumed_rows = list(csv.DictReader((cut / "results.csv").read_text().splitlines()))
    assert len(resumed_rows) == 4
    times = [float(r["time"]) for r in resumed_rows]
    assert times == sorted(times), "a resumed run's time goes on from the saved one"


def test_a_loss_that_is_not_finite_stops_the_run_and_keeps_best(data, tmp_path, monkeypatch):
    from mlxnet.training import detect_loop
    from mlxnet.training.detect_loop import DetectTrainConfig, train_detector

    out = tmp_path / "nan"
    config = dict(data=str(data), weights="none", model="yolov8n", imgsz=64, batch=4, close_mosaic=1, output=str(out),
                  log=lambda line: None)
    train_detector(DetectTrainConfig(epochs=1, **config))
    best = (out / "weights" / "best.safetensors").read_bytes()
    real = detect_loop.detection_loss
    calls = []

    def poisoned(*args, **kwargs):
        loss, parts = real(*args, **kwargs)
        calls.append(1)
        return loss * np.nan if len(calls) == 2 else loss, parts * np.nan if len(calls) == 2 else parts

    monkeypatch.setattr(detect_loop, "detection_loss", poisoned)
    with pytest.raises(MlxnetError) as e:
        train_detector(DetectTrainConfig(epochs=3, resume=True, **config))
    message = str(e.value)
    assert "not finite" in message and "epoch 2, batch 2" in message and ".jpg" in message and "\n" not in message
    assert (out / "weights" / "best.safetensors").read_bytes() == best
    assert len(list(csv.DictReader((out / "results.csv").read_text().splitlines()))) == 1


def test_a_bad_label_is_named_before_any_step(data, tmp_path):
    import shutil

    copy = tmp_path / "bad"
    shutil.copytree(data.parent, copy)
    (copy / "data.yaml").write_text((copy / "data.yaml").read_text().replace(str(data.parent), str(copy)))
    label = copy / "labels" / "train" / "00003.txt"
    label.write_text(label.read_text() + "7 0.5 0.5 0.1 0.1\n")
    failed = run("train", "detect", copy / "data.yaml", *TINY, "--epochs", "1", "-o", tmp_path / "out", code=1)
    assert f"{label}:" in failed.output and "out of range" in failed.output
    assert not (tmp_path / "out").exists()


def test_a_full_disk_while_saving_leaves_the_previous_epoch_whole(data, tmp_path, monkeypatch):
    from mlxnet.training.detect_loop import DetectTrainConfig, train_detector

    out = tmp_path / "full"
    config = dict(data=str(data), weights="none", model="yolov8n", imgsz=64, batch=4, close_mosaic=1, output=str(out),
                  val=False, log=lambda line: None)
    train_detector(DetectTrainConfig(epochs=1, **config))
    before = {p: p.read_bytes() for p in (out / "state.safetensors", out / "weights" / "last.safetensors")}
    # The disk fills part-way into every file: through MLX's writer (MLX arrays) or Python's (a
    # snapshot of host arrays, what the training's writer thread gets).
    def full(path, arrays, metadata=None):
        with open(path, "wb") as f:
            f.write(b"\0" * 1000)
        raise RuntimeError("[save_safetensors] No space left on device")

    def full_bytes(self, data):
        with open(self, "wb") as f:
            f.write(b"\0" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(mx, "save_safetensors", full)
        m.setattr(Path, "write_bytes", full_bytes)
        with pytest.raises(Exception) as e:
            train_detector(DetectTrainConfig(epochs=2, resume=True, **config))
    assert "No space left" in str(e.value) or "space" in str(e.value).lower()
    for path, content in before.items():
        assert path.read_bytes() == content, path
    assert not [p for p in out.rglob("*") if p.is_file() and p not in before and p.suffix != ".csv"
                and p.name != "results.png" and "best" not in p.name]
    rows = train_detector(DetectTrainConfig(epochs=2, resume=True, **config))
    assert [r.epoch for r in rows] == [1, 2]


def test_a_checkpoint_with_other_classes_gets_a_new_class_head(data, tmp_path):
    from mlxnet.models.yolo import YOLO, YOLOv8
    from mlxnet.training.detect_loop import DetectTrainConfig, build_network
    from mlxnet.weights import save_converted
    from mlx.utils import tree_flatten

    source = YOLOv8("n", 2)
    path = tmp_path / "two.safetensors"
    save_converted(path, dict(tree_flatten(source.parameters())), "yolov8n", {"nc": 2}, ("square", "dog"),
                   source="test")
    lines = []
    net, variant = build_network(DetectTrainConfig(data=str(data), weights=str(path), log=lines.append),
                                 shapes.NAMES)
    assert variant == "yolov8n" and net.nc == 3
    assert len(lines) == 1 and "2 classes" in lines[0] and "1 kept by name" in lines[0]
    for level in range(3):
        old, new = source.model[22].cv3[level][2], net.model[22].cv3[level][2]
        np.testing.assert_array_equal(np.array(new.weight[1]), np.array(old.weight[0]))  # "square" kept
        np.testing.assert_array_equal(np.array(net.model[22].cv3[level][0].conv.weight),
                                      np.array(source.model[22].cv3[level][0].conv.weight))
        assert np.allclose(np.array(new.bias[0]), np.log(5 / 3 / (640 / (8, 16, 32)[level]) ** 2))
    assert YOLO.from_pretrained(path).names == ("square", "dog")


def as_coco(yaml: Path, out: Path) -> Path:
    """The shapes data set's two splits as COCO instances files (annotations/instances_{train,val}.json,
    category ids 1..3 in another order than the names), its images where they are."""
    import json

    from PIL import Image

    root = yaml.parent
    (out / "annotations").mkdir(parents=True)
    categories = [{"id": 3, "name": "triangle"}, {"id": 1, "name": "circle"}, {"id": 2, "name": "square"}]
    for split in ("train", "val"):
        images, annotations = [], []
        for i, path in enumerate(sorted((root / "images" / split).glob("*.jpg"))):
            w, h = Image.open(path).size
            images.append({"id": i, "file_name": str(path), "width": w, "height": h})
            for line in (root / "labels" / split / f"{path.stem}.txt").read_text().split("\n"):
                if line.strip():
                    c, cx, cy, bw, bh = (float(v) for v in line.split())
                    annotations.append({"id": len(annotations) + 1, "image_id": i, "category_id": int(c) + 1,
                                        "bbox": [(cx - bw / 2) * w, (cy - bh / 2) * h, bw * w, bh * h],
                                        "area": bw * w * bh * h, "iscrowd": 0})
        (out / "annotations" / f"instances_{split}.json").write_text(
            json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return out / "annotations" / "instances_train.json"


def test_a_coco_file_trains_with_its_val_file_beside_it(data, tmp_path):
    from mlxnet.training import detect_data as D

    train_json = as_coco(data, tmp_path / "coco")
    coco_train, yolo_train = D.load_split(train_json, "train"), D.load_split(data, "train")
    assert coco_train.names == shapes.NAMES  # categories by id
    assert D.load_split(train_json, "val").source.endswith("instances_val.json")
    for ours, theirs in zip(D.read_all_labels(coco_train), D.read_all_labels(yolo_train)):
        np.testing.assert_allclose(ours.boxes, theirs.boxes, atol=1e-5)
        np.testing.assert_array_equal(ours.classes, theirs.classes)
    run("train", "detect", train_json, *TINY, "--epochs", "1", "-o", tmp_path / "run")
    rows = list(csv.DictReader((tmp_path / "run" / "results.csv").read_text().splitlines()))
    assert len(rows) == 1 and np.isfinite(float(rows[0]["metrics/mAP50-95(B)"]))
    (tmp_path / "coco" / "annotations" / "instances_val.json").unlink()
    refused = run("train", "detect", train_json, *TINY, "--epochs", "1", "-o", tmp_path / "run2", code=1)
    assert "instances_val.json" in refused.output and "--no-val" in refused.output


def test_the_compiled_step_equals_the_eager_step_over_target_buckets():
    """The step GPUs run compiled: the same loss parts, gradients and BatchNorm statistics as
    the eager step, for batches whose object counts land in different padding buckets."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    from mlxnet.device import use_compile
    from mlxnet.models.yolo import YOLOv8
    from mlxnet.training.detect_loop import _for_training, _step_function
    from mlxnet.training.detection_loss import Targets, detection_loss

    mx.random.seed(0)
    nets = [_for_training(YOLOv8("n", 2)) for _ in range(3)]  # eager, compiled, unpadded targets
    for net in nets[1:]:
        net.update(nets[0].parameters())
    steps = []
    for net, compiled in zip(nets[:2], (False, True)):
        def loss_fn(model: nn.Module, images, targets, whole):
            return detection_loss(model.train_outputs(images), targets, (64, 64), num_classes=2, batch_size=whole)
        steps.append(_step_function(net, loss_fn, compiled=compiled))
    rng = np.random.default_rng(0)
    images = mx.array(rng.random((2, 64, 64, 3), dtype=np.float32))
    for count in (1, 9, 3):  # buckets 8, 16, 8
        boxes = [np.sort(rng.random((count, 4)) * 60, axis=1)[:, [0, 1, 2, 3]].astype(np.float32) + [0, 0, 4, 4]
                 for _ in range(2)]
        classes = [rng.integers(0, 2, count) for _ in range(2)]
        t = Targets.from_lists(boxes, classes, bucket=True)
        assert t.boxes.shape[1] == (8 if count <= 8 else 16)
        with use_compile(True):
            results = [step(images, t.boxes, t.classes, 2) for step in steps]
        (p0, g0), (p1, g1) = results
        np.testing.assert_allclose(np.array(p1), np.array(p0), rtol=1e-4, atol=1e-6)
        for (k, a), (_, b) in zip(tree_flatten(g0), tree_flatten(g1)):
            np.testing.assert_allclose(np.array(b), np.array(a), rtol=2e-3, atol=1e-5, err_msg=k)
        unpadded = Targets.from_lists(boxes, classes)
        eager_unpadded = detection_loss(nets[2].train_outputs(images), unpadded, (64, 64), num_classes=2)[1]
        np.testing.assert_allclose(np.array(eager_unpadded), np.array(p0), rtol=1e-5, atol=1e-7)
    for (k, a), (_, b) in zip(tree_flatten(nets[0].state), tree_flatten(nets[1].state)):
        if "running" in k:
            np.testing.assert_allclose(np.array(b), np.array(a), rtol=1e-4, atol=1e-6, err_msg=k)


def test_a_yolo11_trains_and_yolo26_is_refused_in_one_line(data, tmp_path):
    """YOLO11's loss is YOLOv8's (ultralytics trains both with v8DetectionLoss): it trains through
    the builder's network and its checkpoint detects. YOLO26's end-to-end loss is not here yet."""
    out = tmp_path / "y11"
    run("train", "detect", data, "-w", "none", "-m", "yolo11n", *TINY[4:], "--epochs", "1", "-o", out)
    best = out / "weights" / "best.safetensors"
    assert best.is_file()
    shown = run("detect", data.parent / "images" / "val" if (data.parent / "images").is_dir() else data, "-w", best,
                "--imgsz", "64", "-o", tmp_path / "shown")
    assert shown.exit_code == 0
    refused = run("train", "detect", data, "-w", "none", "-m", "yolo26n", "--epochs", "1", "-o", tmp_path / "r", code=1)
    assert "train detect trains yolov8n" in refused.output and "yolo11x" in refused.output
    assert not (tmp_path / "r").exists()


def test_the_cpu_step_with_fast_faces_equals_the_definitions_step():
    """On the CPU a training step runs the ops' fast faces (their gradients: GEMMs and mlxnet's
    primitives); its loss parts, gradients and BatchNorm statistics are the definitions'."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    from mlxnet import use_device
    from mlxnet.device import use_kernels
    from mlxnet.models.yolo import YOLOv8
    from mlxnet.training.detect_loop import _for_training, _step_function
    from mlxnet.training.detection_loss import Targets, detection_loss

    mx.random.seed(1)
    nets = [_for_training(YOLOv8("n", 3)) for _ in range(2)]
    nets[1].update(nets[0].parameters())

    def loss_fn(model: nn.Module, images, targets, whole):
        return detection_loss(model.train_outputs(images), targets, (96, 64), num_classes=3, batch_size=whole)
    rng = np.random.default_rng(1)
    images = mx.array(rng.random((2, 96, 64, 3), dtype=np.float32))
    boxes = [np.array([[4, 6, 40, 50], [30, 20, 60, 90]], np.float32), np.array([[10, 10, 20, 30]], np.float32)]
    classes = [np.array([0, 2]), np.array([1])]
    t = Targets.from_lists(boxes, classes, bucket=True)
    results = []
    with use_device("cpu"):
        for net, fast in zip(nets, (True, False)):
            with use_kernels(fast):
                parts, grads = _step_function(net, loss_fn)(images, t.boxes, t.classes, 2)
                mx.eval(parts, grads, net.state)
            results.append((parts, dict(tree_flatten(grads))))
    (p0, g0), (p1, g1) = results
    np.testing.assert_allclose(np.array(p0), np.array(p1), rtol=1e-4, atol=1e-6)
    assert g0.keys() == g1.keys()
    for k in g0:
        scale = float(mx.abs(g1[k]).max()) or 1.0
        np.testing.assert_allclose(np.array(g0[k]), np.array(g1[k]), rtol=2e-3, atol=2e-4 * scale, err_msg=k)
    for (k, a), (_, b) in zip(tree_flatten(nets[0].state), tree_flatten(nets[1].state)):
        if "running" in k:
            np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-4, atol=1e-6, err_msg=k)


def test_samples_from_worker_processes_train_the_same_weights_as_threads(data, tmp_path, monkeypatch):
    # With a GPU step the samples come from worker processes (here forced on the CPU): the same
    # draws, so the same run as on threads.
    from mlxnet.training import detect_loop
    from mlxnet.training.detect_loop import DetectTrainConfig, train_detector

    config = dict(data=str(data), weights="none", model="yolov8n", imgsz=64, batch=4, close_mosaic=1, epochs=2,
                  workers=2, val=False, seed=3, log=lambda line: None)
    train_detector(DetectTrainConfig(output=str(tmp_path / "threads"), **config))
    started = []
    real = detect_loop.D.SampleProcesses

    def spy(*args, **kwargs):
        started.append(1)
        return real(*args, **kwargs)
    prefetched = []
    real_prefetch = real.prefetch

    def prefetch(self, indices, seed, epoch, mosaic):
        prefetched.append((len(indices), epoch, mosaic))
        real_prefetch(self, indices, seed, epoch, mosaic)
    monkeypatch.setattr(detect_loop, "backend", lambda: "metal")
    monkeypatch.setattr(detect_loop.D, "SampleProcesses", spy)
    monkeypatch.setattr(real, "prefetch", prefetch)
    train_detector(DetectTrainConfig(output=str(tmp_path / "processes"), **config))
    assert started == [1]  # one pool for the whole run
    assert prefetched == [(8, 1, False)]  # the last epoch's batches (up to 3), made while the first one ended
    a = mx.load(str(tmp_path / "threads" / "weights" / "last.safetensors"))
    b = mx.load(str(tmp_path / "processes" / "weights" / "last.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(np.array(a[key]), np.array(b[key]), err_msg=key)


def test_dtype_auto_is_bfloat16_on_a_gpu_and_float32_on_the_cpu(monkeypatch):
    """`--dtype auto` (the default) follows ultralytics' amp: half precision where the step runs
    on a GPU, float32 on the CPU; a named dtype is kept."""
    from mlxnet.training import detect_loop
    from mlxnet.training.detect_loop import DetectTrainConfig, resolve_precision

    assert DetectTrainConfig(data="d").precision == "auto"
    assert resolve_precision("auto") == "float32"  # the tests' device is the CPU
    monkeypatch.setattr(detect_loop, "current_device", lambda: "gpu")
    assert resolve_precision("auto") == "bfloat16"
    assert resolve_precision("float32") == "float32"


def test_a_resumed_auto_run_keeps_the_precision_it_began_with(data, tmp_path):
    """A run begun in bfloat16 resumes in bfloat16 under the default `--dtype auto` (on the CPU,
    auto alone would choose float32 and the resume would be refused), and an explicit other
    dtype is refused in one line naming it."""
    from safetensors import safe_open

    args = ["train", "detect", str(data), *TINY, "--no-val", "-o", str(tmp_path / "run")]
    run(*args, "--epochs", "1", "--dtype", "bfloat16")
    resumed = run(*args, "--epochs", "2", "--resume")
    assert "epoch 2/2" in resumed.output
    with safe_open(str(tmp_path / "run" / "state.safetensors"), "np") as f:
        assert '"precision": "bfloat16"' in f.metadata()["run"]
    refused = run(*args, "--epochs", "3", "--resume", "--dtype", "float32", code=1)
    assert "precision was 'bfloat16', now 'float32'" in refused.output


def test_a_bfloat16_run_saves_the_float32_weights_and_resumes_to_the_unbroken_result(data, tmp_path):
    """The state keeps the optimizer's float32 weights, not the network's bfloat16 copy, so that
    a bfloat16 run stopped after epoch 2 (between two updates: one every 3 steps of 4 an epoch)
    resumes to where the unbroken run ends, bit for bit."""
    from mlxnet.training.detect_loop import DetectTrainConfig, train_detector

    class Stop(Exception):
        pass

    def stop_at_epoch_3(line: str) -> None:  # logged after epoch 3 trained, before its state is written
        if line.startswith("epoch 3/"):
            raise Stop

    def config(out: Path, **changes) -> DetectTrainConfig:
        return DetectTrainConfig(data=str(data), weights="none", model="yolov8n", imgsz=64, batch=2, epochs=4,
                                 close_mosaic=1, workers=2, optimizer="sgd", lr=0.02, nbs=6, precision="bfloat16", seed=2,
                                 val=False, output=str(out), **{"log": lambda line: None, **changes})

    train_detector(config(tmp_path / "whole"))
    with pytest.raises(Stop):
        train_detector(config(tmp_path / "cut", log=stop_at_epoch_3))
    state = mx.load(str(tmp_path / "cut" / "state.safetensors"))
    trained = {k: v for k, v in state.items() if k.startswith("model.") and "running_" not in k}
    assert trained and all(v.dtype == mx.float32 for v in trained.values())
    assert any((np.array(v) != np.array(v.astype(mx.bfloat16).astype(mx.float32))).any() for v in trained.values())
    assert any(k.startswith("pending.") for k in state), "epoch 2 should end between two updates"
    train_detector(config(tmp_path / "cut", resume=True))
    whole = mx.load(str(tmp_path / "whole" / "weights" / "last.safetensors"))
    again = mx.load(str(tmp_path / "cut" / "weights" / "last.safetensors"))
    first = mx.load(str(tmp_path / "whole" / "state.safetensors"))
    moved = [k for k in trained if not np.array_equal(np.array(first[k]), np.array(trained[k]))]
    assert moved, "the weights should change between epochs 2 and 4"
    for key in whole:
        np.testing.assert_array_equal(np.array(again[key].astype(mx.float32)), np.array(whole[key].astype(mx.float32)),
                                      err_msg=key)


def test_an_epoch_keeps_no_arrays_of_the_epoch_before(data, tmp_path, monkeypatch):
    """What one epoch saved (weights, EMA, optimizer moments, each a view pinning a whole packed
    vector) is let go once written: the arrays alive when validation starts are as many after the
    third epoch as after the second, not a set more per epoch. (The files are written at once
    here: a background writer still writing the epoch before holds its arrays, as it must.)"""
    import gc

    from mlxnet.training import detect_loop
    from mlxnet.training.detect_loop import DetectTrainConfig, train_detector

    class WriteNow(detect_loop.BackgroundWriter):  # a writer that lags an epoch would hold that epoch's arrays
        def submit(self, job, *args, **kwargs):
            job(*args, **kwargs)

    monkeypatch.setattr(detect_loop, "BackgroundWriter", WriteNow)
    counts = []
    validate = detect_loop._validate

    def counting(*args, **kwargs):
        gc.collect()
        counts.append(sum(isinstance(o, mx.array) for o in gc.get_objects()))
        return validate(*args, **kwargs)
    monkeypatch.setattr(detect_loop, "_validate", counting)
    train_detector(DetectTrainConfig(data=str(data), weights="none", model="yolov8n", imgsz=64, batch=4, epochs=3,
                                     close_mosaic=1, workers=2, output=str(tmp_path / "run"), log=lambda line: None))
    assert len(counts) == 3
    assert counts[2] <= counts[1] + 8 and counts[1] <= counts[0] + 8, counts


def test_a_library_process_on_cuda_is_told_about_the_plan_cache(monkeypatch):
    """train_detector in a process MLX loaded with its 128 cuDNN plans (no MLX_CUDA_CONV_CACHE_SIZE
    before Python started) says how to start it; the command's process, or the CPU, hears nothing."""
    from mlxnet.training import detect_loop

    monkeypatch.delenv("MLX_CUDA_CONV_CACHE_SIZE", raising=False)
    monkeypatch.setattr(detect_loop, "backend", lambda: "cuda")
    note = detect_loop.plan_cache_note()
    assert note is not None and "MLX_CUDA_CONV_CACHE_SIZE=16384" in note
    monkeypatch.setenv("MLX_CUDA_CONV_CACHE_SIZE", "16384")
    assert detect_loop.plan_cache_note() is None
    monkeypatch.delenv("MLX_CUDA_CONV_CACHE_SIZE")
    monkeypatch.setattr(detect_loop, "backend", lambda: "cpu")
    assert detect_loop.plan_cache_note() is None


def test_the_training_step_compiles_by_default_on_gpu_back_ends_cuda_included(monkeypatch):
    """A training run wins back MLX's one-time run-time compile on CUDA (unlike an image command):
    the step compiles there by default; MLXNET_COMPILE=off trains eagerly; the CPU stays eager."""
    from mlxnet import device
    from mlxnet.training import detect_loop

    monkeypatch.delenv("MLXNET_COMPILE", raising=False)
    for name, compiled in (("cuda", True), ("metal", True), ("cpu", False)):
        monkeypatch.setattr(device, "backend", lambda name=name: name)
        assert detect_loop.compile_training() is compiled, name
    monkeypatch.setattr(device, "backend", lambda: "cuda")
    monkeypatch.setenv("MLXNET_COMPILE", "off")
    assert detect_loop.compile_training() is False
    assert "MLXNET_COMPILE=off" in detect_loop.COMPILE_NOTE


def test_the_validator_folds_each_epochs_weights_as_fuse_does():
    """Validator.load folds the BatchNorms from the flat arrays, without building a network: the
    same parameters, bit for bit, as loading them into a network and fusing it."""
    from mlx.utils import tree_flatten, tree_unflatten

    from mlxnet.models.yolo import build_variant
    from mlxnet.training.detect_loop import Validator

    key = iter(mx.random.split(mx.random.key(3), 400))
    arrays = {k: v + 0.1 * mx.random.normal(v.shape, key=next(key)) for k, v in tree_flatten(build_variant("yolov8n", 2).parameters())}
    arrays = {k: mx.abs(v) + 0.5 if k.endswith("running_var") else v for k, v in arrays.items()}
    got = dict(tree_flatten(Validator("yolov8n", 2, ("a", "b")).load(arrays).net.parameters()))
    reference = build_variant("yolov8n", 2)
    reference.update(tree_unflatten(list(arrays.items())))
    want = dict(tree_flatten(reference.fuse().parameters()))
    assert set(got) == set(want)
    for k in want:
        assert mx.array_equal(got[k], want[k]), k


def test_validation_reads_its_images_once_a_run_and_gets_the_same_metrics(data, monkeypatch):
    """`evaluate` with a PreparedImages keeps what it decoded and letterboxed: a second epoch's
    validation reads no image again and starts no reader thread, and the network gets the same
    inputs as without it; a budget too small for an image keeps none (each is read every time)."""
    import threading

    import mlxnet.evaluation.detect as detect_module
    import mlxnet.image as image_module
    from mlxnet.evaluation.detect import PreparedImages, evaluate
    from mlxnet.models.yolo import YOLO, build_variant
    from mlxnet.training import detect_data as D

    val_set = D.load_split(data, "val")
    yolo = YOLO(build_variant("yolov8n", 3).fuse(), ("circle", "square", "triangle"))
    reads, seen = [], []
    load, head = image_module.load_image, yolo.head_outputs
    monkeypatch.setattr(image_module, "load_image", lambda path: reads.append(path) or load(path))

    def recorded_head(items):
        seen[-1].append([(item.image_hw, item.pixels.tobytes(), item.ratio_pad) for item in items])
        return head(items)
    monkeypatch.setattr(yolo, "head_outputs", recorded_head)

    pools = []
    pool_class = detect_module.ThreadPoolExecutor
    monkeypatch.setattr(detect_module, "ThreadPoolExecutor", lambda *a, **k: pools.append(1) or pool_class(*a, **k))

    def run(prepared: PreparedImages | None) -> int:
        seen.append([])
        before, pools_before = len(reads), len(pools)
        evaluate(yolo, val_set.images, val_set.labels, imgsz=64, batch=2, prepared=prepared)
        assert (len(pools) > pools_before) == (len(reads) > before)  # threads only where images are read
        assert not [t for t in threading.enumerate() if t.name.startswith("val-read")]
        return len(reads) - before

    n = len(val_set.images)
    kept, small = PreparedImages(), PreparedImages(budget=100)
    assert [run(None), run(kept), run(kept), run(small), run(small)] == [n, n, 0, n, n]
    plain = sorted(map(repr, seen[0]))
    assert all(sorted(map(repr, s)) == plain for s in seen[1:])
    assert kept.used > 0 and small.used == 0
