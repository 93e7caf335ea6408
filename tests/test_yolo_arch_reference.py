"""The architecture builder against ultralytics in the same process: the committed goldens are
what ultralytics 8.4 gives today, and an ultralytics-saved YOLO11 / YOLO26 checkpoint detects the
same boxes in mlxnet as in ultralytics' own predictor. Needs ultralytics (the reference
environment of .ci/run)."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ultralytics", reason="needs ultralytics (pip install ultralytics)")

from testutil import golden_script, overlapping_masks  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BUS = ROOT / "tests/fixtures/yolo/bus.jpg"


def test_the_architecture_goldens_are_ultralytics_today(tmp_path, monkeypatch):
    from safetensors.numpy import load_file

    monkeypatch.setenv("YOLO_OFFLINE", "1")
    golden_script("golden_yolo_arch").main(tmp_path)
    fresh, kept = load_file(str(tmp_path / "golden.safetensors")), load_file(str(ROOT / "tests/fixtures/yolo_arch/golden.safetensors"))
    assert fresh.keys() == kept.keys()
    for key in kept:
        if key.endswith(".e2e"):  # tied scores come out in either order: the scores, best first
            np.testing.assert_allclose(fresh[key][..., 4], kept[key][..., 4], atol=1e-5, err_msg=key)
            continue
        np.testing.assert_allclose(fresh[key], kept[key], rtol=1e-5, atol=1e-4, err_msg=key)  # torch's threads


@pytest.mark.parametrize("name", ["yolo11n", "yolo26n"])
def test_an_ultralytics_checkpoint_detects_as_ultralytics(name, tmp_path, monkeypatch):
    """A checkpoint saved as ultralytics saves one (the pickled model in float16), loaded by
    its file alone: the same boxes as ultralytics' predictor at imgsz 320, within 0.5 px."""
    import torch
    from ultralytics import YOLO as UltralyticsYOLO
    from ultralytics.nn.tasks import DetectionModel

    from mlxnet.models.yolo import YOLO

    monkeypatch.setenv("YOLO_OFFLINE", "1")
    seeded = golden_script("reference").seeded
    model = DetectionModel(f"{name}.yaml", verbose=False)
    shapes = [(k, tuple(v.shape)) for k, v in model.state_dict().items() if v.dtype.is_floating_point]
    weights = seeded.seeded_yolo_state(shapes, 1234, 2.5, 5.0)
    if name == "yolo26n":
        # Its head predicts distances directly: positive ones, as trained (bias 2, small weights);
        # and class scores short of 1.0, so that NMS meets no ties.
        for key in weights:  # both heads' last convs
            if re.fullmatch(r"model\.23\.(one2one_)?cv2\.\d\.2\.(weight|bias)", key):
                weights[key] = weights[key] * 0.05 + (2.0 if key.endswith("bias") else 0.0)
            elif re.fullmatch(r"model\.23\.(one2one_)?cv3\.\d\.2\.(weight|bias)", key):
                weights[key] = weights[key] * 0.02
    model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=False)
    path = tmp_path / f"{name}.pt"
    torch.save({"model": model.half(), "ema": None, "epoch": -1, "optimizer": None, "train_args": {}}, path)
    for nms in (True, False) if name == "yolo26n" else (True,):  # nms=False: the one-to-one head, no NMS
        theirs = UltralyticsYOLO(str(path)).predict(str(BUS), imgsz=320, conf=0.25, nms=None if nms else False,
                                                    verbose=False)[0].boxes
        ours = YOLO.from_pretrained(str(path)).predict(str(BUS), imgsz=320, conf=0.25, nms=nms)
        _same_detections(ours, theirs)


def _same_detections(ours, theirs) -> None:
    assert len(theirs) > 0
    assert len(ours.boxes) == len(theirs)
    ref = np.concatenate([theirs.xyxy.numpy(), theirs.conf.numpy()[:, None], theirs.cls.numpy()[:, None]], axis=1)
    got = np.concatenate([np.array(ours.boxes), np.array(ours.scores)[:, None], np.array(ours.classes)[:, None]], axis=1)
    for row in got:  # each of ours is one of theirs: same class, score within 1e-3, box within 0.5 px
        match = (ref[:, 5] == row[5]) & (np.abs(ref[:, 4] - row[4]) <= 1e-3) & (np.abs(ref[:, :4] - row[:4]).max(1) <= 0.5)
        assert match.any(), row


def _saved_task_checkpoint(name: str, path):
    """An ultralytics checkpoint of ``name`` (a -seg or -pose model) with seeded weights, saved
    as ultralytics saves one (the task in its training arguments)."""
    import torch

    model = golden_script("reference").seeded_task_model(f"{name}.yaml", 1234, 2.5, 5.0)
    if name.startswith("yolo26"):  # as the detection test: positive distances, scores short of 1
        with torch.no_grad():
            for key, value in model.state_dict().items():
                if re.fullmatch(r"model\.23\.(one2one_)?cv2\.\d\.2\.(weight|bias)", key):
                    value.mul_(0.05).add_(2.0 if key.endswith("bias") else 0.0)
                elif re.fullmatch(r"model\.23\.(one2one_)?cv3\.\d\.2\.(weight|bias)", key):
                    value.mul_(0.02)
    task = "segment" if name.endswith("-seg") else "pose"
    torch.save({"model": model.half(), "ema": None, "epoch": -1, "optimizer": None, "train_args": {"task": task}}, path)


@pytest.mark.parametrize("name", ["yolov8n-seg", "yolo11n-seg", "yolo26n-seg", "yolov8n-pose", "yolo11n-pose",
                                  "yolo26n-pose"])
def test_segment_and_pose_checkpoints_predict_as_ultralytics(name, tmp_path, monkeypatch):
    """Masks as ultralytics' native-resolution path (``retina_masks=True``) makes them, IoU >= 0.99
    each; keypoints within 0.5 px (and their visibility within 1e-3); boxes as detection's. YOLO26
    with and without NMS (its one-to-one head)."""
    from ultralytics import YOLO as UltralyticsYOLO

    from mlxnet.models.yolo import YOLO

    monkeypatch.setenv("YOLO_OFFLINE", "1")
    path = tmp_path / f"{name}.pt"
    _saved_task_checkpoint(name, path)
    ours_model = YOLO.from_pretrained(str(path))
    for nms in (True, False) if name.startswith("yolo26") else (True,):
        theirs = UltralyticsYOLO(str(path)).predict(str(BUS), imgsz=320, conf=0.25, retina_masks=True,
                                                    nms=None if nms else False, verbose=False)[0]
        ours = ours_model.predict(str(BUS), imgsz=320, conf=0.25, nms=nms)
        _same_instances(ours, theirs, name)


def _same_instances(ours, theirs, name: str) -> None:
    assert len(theirs.boxes) > 0 and len(ours) == len(theirs.boxes)
    ref = np.concatenate([theirs.boxes.xyxy.numpy(), theirs.boxes.conf.numpy()[:, None],
                          theirs.boxes.cls.numpy()[:, None]], axis=1)
    got = np.concatenate([ours.boxes, ours.scores[:, None], ours.classes[:, None]], axis=1)
    for i, row in enumerate(got):
        # Theirs of the same class, score and box (random weights can tie several): one of them
        # must have our mask (IoU >= 0.99) or our keypoints (0.5 px; visibility 1e-3).
        same = np.nonzero((ref[:, 5] == row[5]) & (np.abs(ref[:, 4] - row[4]) <= 1e-3)
                          & (np.abs(ref[:, :4] - row[:4]).max(1) <= 0.5))[0]
        assert same.size, row
        if name.endswith("-seg"):
            a = ours.masks[i]
            ious = [(a & b).sum() / max((a | b).sum(), 1) for b in theirs.masks.data[same].numpy().astype(bool)]
            assert max(ious) >= 0.99, (i, ious, a.sum())
        else:
            kp = theirs.keypoints.data[same].numpy()
            err = np.maximum(np.abs(kp[..., :2] - ours.keypoints[i][None, :, :2]).max(axis=(1, 2)),
                             500 * np.abs(kp[..., 2] - ours.keypoints[i][None, :, 2]).max(axis=1))
            assert err.min() <= 0.5, (i, err)


def test_mask_outlines_are_ultralytics_masks2segments():
    """Several blobs (joined into one path where they come closest), holes, a lone pixel."""
    from ultralytics.utils.ops import masks2segments

    from mlxnet.models.yolo_instances import mask_outline

    rng = np.random.default_rng(3)
    masks = np.zeros((6, 90, 120), bool)
    for m in masks:
        for _ in range(rng.integers(1, 6)):
            y, x, h, w = rng.integers(0, 80), rng.integers(0, 110), rng.integers(1, 30), rng.integers(1, 30)
            m[y:y + h, x:x + w] = True
        m[40:45, 50:55] = False
    masks[5] = False
    masks[5, 10, 10] = True
    for m, theirs in zip(masks, masks2segments(masks)):
        np.testing.assert_array_equal(mask_outline(m), theirs)


@pytest.mark.parametrize("alpha", [0.5, 0.3])
def test_masks_are_drawn_as_ultralytics_annotator_draws_them(alpha):
    """Overlapping masks laid over a photo: every pixel under a mask equals ultralytics'
    Annotator.masks; the others are the photo's own (ultralytics recomputes them too, which
    may round one down)."""
    import torch
    from ultralytics.utils.plotting import Annotator

    from mlxnet.image import load_image
    from mlxnet.models.yolo_instances import InstanceMasks

    image = np.ascontiguousarray(load_image(BUS)[200:440, 100:420])
    h, w = image.shape[:2]
    rng = np.random.default_rng(5)
    dense = overlapping_masks(rng, 9, h, w, least=20, most=(150, 200), fill=0.85)
    colours = rng.integers(0, 256, (9, 3)).astype(np.uint8)
    drawn = InstanceMasks.from_dense(dense).over(image, colours, alpha)
    annotator = Annotator(image.copy())
    annotator.masks(torch.from_numpy(dense), colors=[tuple(int(v) for v in c) for c in colours], alpha=alpha)
    theirs = np.asarray(annotator.result())
    covered = dense.any(axis=0)
    assert (dense.sum(axis=0) >= 3).any()
    np.testing.assert_array_equal(drawn[covered], theirs[covered])
    np.testing.assert_array_equal(drawn[~covered], image[~covered])


@pytest.mark.parametrize("name", ["yolo11n-seg", "yolov8n-pose"])
def test_label_lines_are_ultralytics_save_txt(name, tmp_path, monkeypatch):
    """The same detections written as --save-txt writes them and as ultralytics' save_txt does."""
    from ultralytics import YOLO as UltralyticsYOLO

    from mlxnet.commands.detect_outputs import label_lines
    from mlxnet.models.yolo_process import Detections

    monkeypatch.setenv("YOLO_OFFLINE", "1")
    path = tmp_path / f"{name}.pt"
    _saved_task_checkpoint(name, path)
    r = UltralyticsYOLO(str(path)).predict(str(BUS), imgsz=320, conf=0.25, retina_masks=True, verbose=False)[0]
    r.save_txt(tmp_path / "theirs.txt", save_conf=True)
    h, w = r.orig_shape
    det = Detections(r.boxes.xyxy.numpy(), r.boxes.conf.numpy(), r.boxes.cls.numpy().astype(np.int32),
                     tuple(r.names.values()),
                     masks=r.masks.data.numpy().astype(bool) if r.masks is not None else None,
                     keypoints=r.keypoints.data.numpy() if r.keypoints is not None else None)
    ours = label_lines(det, w, h, save_conf=True).splitlines()
    theirs = (tmp_path / "theirs.txt").read_text().splitlines()
    assert len(ours) == len(theirs) > 0
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(np.array(a.split(), float), np.array(b.split(), float), rtol=1e-5, atol=1e-6)
