"""`mlxnet detect` with segment and pose checkpoints: masks and keypoints drawn, in --json and in
--save-txt (ultralytics' formats, checked against ultralytics itself in
test_yolo_arch_reference.py), and carried through tracking."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlxnet.image import load_image
from mlxnet.models.yolo_instances import InstanceMasks
from mlxnet.models.yolo_process import Detections
from mlxnet.tracking import ByteTracker
from mlxnet.weights import save_converted
from test_yolo_arch import seeded_net
from testutil import overlapping_masks

BUS = Path(__file__).parent / "fixtures" / "yolo" / "bus.jpg"
MLXNET = [sys.executable, "-m", "mlxnet"]


def saved_checkpoint(name: str, folder: Path) -> Path:
    net = seeded_net(name)
    if name.endswith("-seg"):
        # The seeded mask branch gives logits of about -0.03 everywhere: no pixel of any mask, and
        # a detection without mask is dropped. Equal coefficients of 1 sum the prototypes instead.
        for branch in net.head.cv4:
            branch[2].weight = branch[2].weight * 0
            branch[2].bias = branch[2].bias * 0 + 1
    path = folder / f"{name}.safetensors"
    save_converted(path, dict(tree_flatten(net.parameters())), name, {"nc": net.nc}, None, source="test")
    return path


@pytest.fixture(scope="module", params=["yolo11n-seg", "yolov8n-pose"])
def checkpoint(request, tmp_path_factory) -> tuple[str, Path]:
    return request.param, saved_checkpoint(request.param, tmp_path_factory.mktemp("w"))


def test_detect_draws_writes_and_labels_masks_or_keypoints(checkpoint, tmp_path):
    name, weights = checkpoint
    out = tmp_path / "out"
    done = subprocess.run(MLXNET + ["detect", str(BUS), "-w", str(weights), "-o", str(out), "--imgsz", "320",
                                    "--conf", "0.05", "--max-det", "8", "--save-txt", "--save-conf", "--json"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout.splitlines()[0])
    found = record["detections"]
    assert found, "the seeded weights find something at this threshold"
    lines = (out / "labels" / "bus.txt").read_text().splitlines()
    image = load_image(BUS)
    drawn = load_image(out / "bus.jpg")
    if name.endswith("-seg"):
        for row in found:
            xs, ys = np.array(row["segments"]["x"]), np.array(row["segments"]["y"])
            assert len(xs) == len(ys) > 0 and "keypoints" not in row
            x1, y1, x2, y2 = row["box"]  # the outline lies inside the box the mask was cut to
            assert xs.min() >= x1 - 1 and xs.max() <= x2 and ys.min() >= y1 - 1 and ys.max() <= y2
        # class, then x y pairs normalised to the image, then the score
        assert all(len(v.split()) % 2 == 0 and len(v.split()) >= 8 for v in lines)
        values = np.array([float(v) for line in lines for v in line.split()[1:-1]])
        assert values.min() >= 0 and values.max() <= 1
    else:
        for row in found:
            k = row["keypoints"]
            assert len(k["x"]) == len(k["y"]) == len(k["visible"]) == 17 and "segments" not in row
            assert all(0 <= v <= 1 for v in k["visible"])
            assert all(0 <= x <= image.shape[1] for x in k["x"]) and all(0 <= y <= image.shape[0] for y in k["y"])
        assert len(lines) == len(found) and all(len(v.split()) == 1 + 4 + 17 * 3 + 1 for v in lines)
    # The drawing differs from the photo beyond the boxes' outlines alone.
    assert np.abs(drawn.astype(int) - image.astype(int)).mean() > 1.0


def test_detect_reads_no_mask_pixels_unless_asked(tmp_path, monkeypatch):
    """Without --json or --save-txt a segment model's masks are only drawn: no outline is traced
    (each needs its mask's pixels on the host), and on a GPU no pixels are cut (the masks come
    with pixels=False); with --json each detection's outline is traced."""
    from typer.testing import CliRunner

    import mlxnet.models.yolo_process as process
    from mlxnet.cli import app

    weights = saved_checkpoint("yolo11n-seg", tmp_path)
    traced, asked_pixels = [], []
    outline = process.mask_outline
    monkeypatch.setattr(process, "mask_outline", lambda mask: traced.append(1) or outline(mask))
    import mlxnet.models.yolo as yolo_module
    made = yolo_module.instance_masks
    monkeypatch.setattr(yolo_module, "instance_masks", lambda *a: asked_pixels.append(a[-1]) or made(*a))
    common = ["detect", str(BUS), "-w", str(weights), "--imgsz", "320", "--conf", "0.05", "--max-det", "8"]
    plain = CliRunner().invoke(app, [*common, "-o", str(tmp_path / "plain")])
    assert plain.exit_code == 0, plain.output + str(plain.exception)
    assert (tmp_path / "plain" / "bus.jpg").is_file() and traced == []
    assert asked_pixels and not any(asked_pixels)
    asked_pixels.clear()
    asked = CliRunner().invoke(app, [*common, "-o", str(tmp_path / "json"), "--json"])
    assert asked.exit_code == 0, asked.output + str(asked.exception)
    found = json.loads(asked.stdout.splitlines()[0])["detections"]
    assert found and len(traced) == len(found) and all("segments" in row for row in found)
    assert asked_pixels and all(asked_pixels)


def test_tracking_keeps_each_tracks_mask_and_keypoints():
    boxes = np.array([[10, 10, 50, 50], [60, 60, 90, 90]], np.float32)
    masks = np.zeros((2, 100, 100), bool)
    masks[0, 10:50, 10:50] = True
    masks[1, 60:90, 60:90] = True
    keypoints = np.random.default_rng(0).random((2, 17, 3)).astype(np.float32)
    det = Detections(boxes, np.array([0.9, 0.15], np.float32), np.array([0, 0], np.int32), ("a",), masks, keypoints)
    assert isinstance(det.masks, InstanceMasks)  # whole masks given are kept as their boxes' pixels
    tracker = ByteTracker()
    for _ in range(3):
        kept, ids = tracker.update_detections(det)
    # The low-scoring box starts no track: only the first detection, with its own mask and points.
    assert len(kept) == 1 and len(ids) == 1
    np.testing.assert_array_equal(np.asarray(kept.masks), masks[:1])
    np.testing.assert_array_equal(kept.keypoints, keypoints[:1])


def test_erase_by_class_with_a_segment_checkpoint_needs_no_sam(tmp_path):
    """--class with a -seg --yolo-weights erases the model's own masks: SAM is never loaded (its
    weights here are a file that does not exist)."""
    from mlxnet.models.yolo import YOLO

    weights = saved_checkpoint("yolo11n-seg", tmp_path)
    found = YOLO.from_pretrained(str(weights)).predict(str(BUS), conf=0.25)
    assert len(found) and found.masks.union().any()
    target = found.labels[0]
    out = tmp_path / "erased.png"
    done = subprocess.run(MLXNET + ["erase", str(BUS), "--class", target, "--yolo-weights", str(weights),
                                    "--lama-weights", "random", "--sam-weights", str(tmp_path / "missing.pt"),
                                    "-o", str(out), "--json", "--save-mask", "--max-side", "256"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout.splitlines()[0])
    # The command detects that class alone, as predict does given it (the kept boxes can differ
    # from the same class's among every class's: at most max_det of them are kept), and on CUDA
    # with the command's choice of kernels (other float roundings can flip a seeded detection).
    from mlxnet.commands.quick_start import runtime_compiling_off

    with runtime_compiling_off():
        mine = YOLO.from_pretrained(str(weights)).predict(str(BUS), conf=0.25, classes=[int(found.classes[0])])
    assert [row["name"] for row in record["instances"]] == [target] * len(mine)
    assert "segments" not in record["instances"][0]
    filled = load_image(Path(record["mask"]), mode="L") > 0
    union = mine.masks.union()
    assert filled[union].all()  # every pixel of the objects' masks is filled (dilated beyond)
    assert not np.array_equal(load_image(out), load_image(BUS))


def test_masks_made_whole_on_a_gpu_equal_the_in_box_ones(monkeypatch):
    """The GPU's way (every mask at the image's size, cut to its box there, a few at a time, kept
    there with their layer of colours until read) gives the host's in-box masks and the host's
    layer: run here on the CPU device, in chunks of 3 masks."""
    import mlx.core as mx
    from mlxnet.models import yolo_instances as yi

    rng = np.random.default_rng(0)
    protos = mx.array(rng.normal(size=(40, 32, 32)).astype(np.float32))
    coefficients = mx.array(rng.normal(size=(8, 32)).astype(np.float32))
    h, w = 130, 170
    corner = rng.uniform(-10, [w, h], (8, 2))
    boxes = np.concatenate([corner, corner + rng.uniform(0, 90, (8, 2))], axis=1)
    boxes[5] = [50, 50, 50, 80]  # an empty box: an empty mask
    boxes[6] = [90, 60, 40, 20]  # an inverted box (untrained weights): empty too
    colours = rng.integers(0, 256, (8, 3)).astype(np.uint8)
    monkeypatch.setattr(yi.mx, "default_device", lambda: mx.Device(mx.DeviceType.cpu))
    with mx.stream(mx.cpu):
        in_box = yi.instance_masks(protos, coefficients, boxes, (h, w), colours=colours)
    assert in_box.layer is None  # the host draws from the pixels
    monkeypatch.setattr(yi, "DEVICE_MASK_BYTES", 3 * 4 * h * w)
    monkeypatch.setattr(yi.mx, "default_device", lambda: mx.Device(mx.DeviceType.gpu))
    with mx.stream(mx.cpu):
        whole = yi.instance_masks(protos, coefficients, boxes, (h, w), colours=colours)
    dense = in_box.dense()
    assert dense.any(axis=(1, 2)).sum() >= 5 and not dense[5].any() and not dense[6].any()
    assert (dense.sum(axis=0) >= 2).sum() > 50  # overlapping masks
    np.testing.assert_array_equal(whole.non_empty(), dense.any(axis=(1, 2)))  # known before any pixel crosses
    assert whole._crops is None
    host_layer = yi.mask_layer(in_box, colours, 0.5)
    np.testing.assert_array_equal(whole.layer.count, host_layer.count)
    np.testing.assert_array_equal(whole.layer.top, host_layer.top)
    np.testing.assert_array_equal(whole.spans, in_box.spans)
    np.testing.assert_array_equal(np.asarray(whole), dense)
    np.testing.assert_array_equal(in_box.non_empty(), dense.any(axis=(1, 2)))
    # Every mask lies inside its box's pixels (x1 <= c < x2).
    for m, (x1, y1, x2, y2) in zip(dense, boxes):
        rows, cols = np.nonzero(m)
        assert ((cols >= x1) & (cols < x2) & (rows >= y1) & (rows < y2)).all()
    # Dropping the empty ones (as predict does) keeps them on the device and their layer.
    with mx.stream(mx.cpu):
        whole = yi.instance_masks(protos, coefficients, boxes, (h, w), colours=colours)
    kept = whole[whole.non_empty()]
    assert kept._crops is None and kept.layer is not None
    np.testing.assert_array_equal(np.asarray(kept), dense[dense.any(axis=(1, 2))])
    # Dropping a mask with pixels drops the layer: the host makes the remaining masks' own.
    assert whole[np.array([0, 1])].layer is None
    # Made to be drawn only: the same layer and filled masks, no pixels cut or kept; reading
    # them, or dropping a filled one (which would need them to redraw), is a clear error.
    with mx.stream(mx.cpu):
        drawn_only = yi.instance_masks(protos, coefficients, boxes, (h, w), colours=colours, pixels=False)
    assert drawn_only._source is None and drawn_only._crops is None
    np.testing.assert_array_equal(drawn_only.layer.count, host_layer.count)
    np.testing.assert_array_equal(drawn_only.layer.top, host_layer.top)
    np.testing.assert_array_equal(drawn_only.non_empty(), dense.any(axis=(1, 2)))
    kept = drawn_only[drawn_only.non_empty()]
    assert kept.layer is not None and len(kept) == dense.any(axis=(1, 2)).sum()
    image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    np.testing.assert_array_equal(kept.over(image, colours[dense.any(axis=(1, 2))], 0.5),
                                  in_box[in_box.non_empty()].over(image, colours[dense.any(axis=(1, 2))], 0.5))
    from mlxnet.errors import MlxnetError
    with pytest.raises(MlxnetError, match="without their pixels"):
        np.asarray(kept)
    with pytest.raises(MlxnetError, match="without their pixels"):
        drawn_only[np.array([0, 1])]


def ultralytics_composition(image: np.ndarray, masks: np.ndarray, colours: np.ndarray, alpha: float) -> np.ndarray:
    """How ultralytics 8.4's annotator lays (K, H, W) masks over an image, written out with
    torch on the CPU: per channel the largest alpha-scaled colour among the masks over a pixel,
    plus the pixel times (1 - alpha) for each of them, on the 0-1 scale, truncated to 8 bits.
    (It recomputes every pixel; pixels under no mask may come back one lower by rounding, where
    mlxnet leaves them untouched, so compare covered pixels.)"""
    import torch

    m = torch.from_numpy(masks).float()[..., None]
    c = torch.from_numpy(colours.astype(np.float32))[:, None, None, :] / 255.0 * alpha
    top, keep = torch.amax(m * c, 0), torch.prod(1 - m * alpha, 0)
    return ((torch.from_numpy(image).float() / 255.0 * keep + top) * 255).byte().numpy()


@pytest.mark.parametrize("alpha", [0.5, 0.3, 0.7])
def test_the_mask_layer_composes_as_ultralytics_draws(alpha):
    """Overlapping masks drawn through MaskLayer (made on the host and, in chunks, the GPU's
    way) equal ultralytics 8.4's composition on every covered pixel, and leave the others."""
    import mlx.core as mx
    from mlxnet.models import yolo_instances as yi

    rng = np.random.default_rng(3)
    h, w = 64, 80
    dense = overlapping_masks(rng, 7, h, w, least=8, most=(50, 60), fill=0.9)
    colours = rng.integers(0, 256, (7, 3)).astype(np.uint8)
    image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    masks = yi.InstanceMasks.from_dense(dense)
    drawn = masks.over(image, colours, alpha)
    covered = dense.any(axis=0)
    assert (dense.sum(axis=0) >= 3).any()
    want = ultralytics_composition(image, dense, colours, alpha)
    np.testing.assert_array_equal(drawn[covered], want[covered])
    np.testing.assert_array_equal(drawn[~covered], image[~covered])
    # The same layer from the masks' logits, the GPU's way (run here on the CPU device).
    protos = mx.array(rng.normal(size=(16, 16, 8)).astype(np.float32))
    coefficients = mx.array(rng.normal(size=(5, 8)).astype(np.float32))
    boxes = np.array([[0, 0, 60, 50], [10, 5, 80, 64], [30, 20, 70, 60], [5, 30, 50, 64], [20, 0, 40, 64]], float)
    host = yi.instance_masks(protos, coefficients, boxes, (h, w))
    layer = yi.mask_layer(host, colours[:5], alpha)
    dense5 = host.dense()
    assert (dense5.sum(axis=0) >= 2).any()
    on_image = layer.over(image)
    covered = dense5.any(axis=0)
    np.testing.assert_array_equal(on_image[covered], ultralytics_composition(image, dense5, colours[:5], alpha)[covered])


def test_instance_masks_kept_in_their_boxes_act_as_whole_masks():
    """Masks kept as in-box crops: indexing, cutting, the union, outlines (ultralytics' masks.xy)
    and the drawing equal the same done on whole-image masks."""
    from mlxnet.models.yolo_instances import InstanceMasks, mask_layer, mask_outline

    rng = np.random.default_rng(1)
    h, w = 90, 120
    dense = np.zeros((5, h, w), bool)
    for m in dense[:4]:
        y, x = rng.integers(0, [h - 10, w - 10])
        m[y:y + rng.integers(3, 40), x:x + rng.integers(3, 60)] = rng.random((1, 1)) < 1
        m &= rng.random((h, w)) < 0.8  # holes and several parts
    dense[2, 0:20, 0:30] = True  # touching the image's corner
    dense[2, h - 5:, w - 7:] = True  # and the opposite one: a mask in two distant parts
    masks = InstanceMasks.from_dense(dense)
    assert masks.shape == dense.shape and len(masks) == 5
    np.testing.assert_array_equal(np.asarray(masks), dense)
    np.testing.assert_array_equal(masks[3], dense[3])
    np.testing.assert_array_equal(masks.union(), dense.any(axis=0))
    np.testing.assert_array_equal(np.asarray(masks[np.array([3, 0])]), dense[[3, 0]])
    np.testing.assert_array_equal(np.asarray(masks[np.array([True, False, True, False, False])]), dense[[0, 2]])
    np.testing.assert_array_equal(masks.non_empty(), [True, True, True, True, False])
    det = Detections(np.zeros((5, 4), np.float32), np.full(5, 0.5, np.float32), np.arange(5, dtype=np.int32),
                     tuple("abcde"), masks)
    for got, m in zip(det.outlines(), dense):
        np.testing.assert_array_equal(got, mask_outline(m))
    # Drawn: ultralytics' composition (test_the_mask_layer_composes_as_ultralytics_draws), as
    # its formula says.
    image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    colours = rng.integers(0, 256, (5, 3)).astype(np.uint8)
    drawn = masks.over(image, colours, 0.5)
    layer = mask_layer(masks, colours, 0.5)
    np.testing.assert_array_equal(layer.count, dense.sum(axis=0))
    top = np.max(dense[..., None] * colours[:, None, None, :], axis=0)
    np.testing.assert_array_equal(layer.top, top)
    covered = dense.any(axis=0)
    f = np.float32
    want = ((image / f(255) * f(0.5) ** layer.count[..., None].astype(f) + top / f(255) * f(0.5)) * f(255))
    np.testing.assert_array_equal(drawn[covered], want.astype(np.uint8)[covered])
    untouched = ~dense.any(axis=0)
    np.testing.assert_array_equal(drawn[untouched], image[untouched])
