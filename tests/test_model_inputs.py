"""Every model's Python entry point takes what the CLI takes, through mlxnet.image.as_rgb / as_mask.

One table of input kinds (a path as str or PathLike, PIL images, NumPy and MLX arrays of several
dtypes) crossed with one table of entry points (classification, detection, SAM's predictor and
segment-everything, LaMa's inpaint): every kind of the same picture gives exactly the result the
plain uint8 array gives. A second table of bad inputs: each is a one-line MlxnetError naming the
entry point (or the file) and saying what was expected and what came.

Weights are random: the families' own ``build`` (seeded) for ResNet and SAM, YOLO's seeded
weights (they find boxes on a photo, so equal results mean something), a one-block LaMa (the
smallest that runs the whole inpaint path: 30 calls). SAM's image encoder is
replaced by a recorder, so the test sees the pixels SAM would embed without a 1024² encoder
pass per case (tests/test_sam.py runs the real encoder).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from PIL import Image

from mlxnet import families
from mlxnet.errors import MlxnetError
from mlxnet.image import load_image
from mlxnet.models import lama, resnet, yolo
from mlxnet.models.sam import SamPredictor
from mlxnet.models.sam_amg import SamAutomaticMaskGenerator

ROOT = Path(__file__).resolve().parents[1]
# A small real photo (a 64×48 crop of the bus), so every entry point runs in milliseconds.
PIXELS = load_image(ROOT / "tests/fixtures/yolo/bus.jpg")[600:648, 300:364]
H, W = PIXELS.shape[:2]
MASK = np.zeros((H, W), bool)
MASK[10:30, 20:44] = True


# --- the input kinds: each builds the same picture (or mask) in another form -----------------------

def _png(folder: Path, name: str, image: Image.Image) -> Path:
    path = folder / name
    image.save(path)
    return path


IMAGE_KINDS: dict[str, Callable[[Path], Any]] = {
    "str path (PNG)": lambda d: str(_png(d, "photo.png", Image.fromarray(PIXELS))),
    "PathLike (PNG)": lambda d: _png(d, "photo.png", Image.fromarray(PIXELS)),
    "PathLike (RGBA PNG)": lambda d: _png(d, "photo_rgba.png", Image.fromarray(PIXELS).convert("RGBA")),
    "PIL RGB": lambda d: Image.fromarray(PIXELS),
    "PIL RGBA": lambda d: Image.fromarray(PIXELS).convert("RGBA"),
    "NumPy uint8": lambda d: PIXELS.copy(),
    "NumPy uint8, not contiguous": lambda d: np.asfortranarray(PIXELS),
    "NumPy uint8 (H, W, 4)": lambda d: np.dstack([PIXELS, np.full((H, W), 7, np.uint8)]),
    "NumPy uint16": lambda d: PIXELS.astype(np.uint16) * 257,
    "NumPy int64": lambda d: PIXELS.astype(np.int64),
    "NumPy float32 in [0, 1]": lambda d: PIXELS.astype(np.float32) / 255,
    "NumPy float64 in [0, 1]": lambda d: PIXELS / 255.0,
    "MLX uint8": lambda d: mx.array(PIXELS),
    "MLX float32 in [0, 1]": lambda d: mx.array(PIXELS.astype(np.float32) / 255),
}

MASK_KINDS: dict[str, Callable[[Path], Any]] = {
    "str path (L PNG, white = fill)": lambda d: str(_png(d, "mask.png", Image.fromarray(MASK.astype(np.uint8) * 255))),
    "PathLike (1-bit PNG)": lambda d: _png(d, "mask1.png", Image.fromarray(MASK)),
    "PathLike (RGB PNG, dark blue = fill)": lambda d: _png(d, "mask_rgb.png", Image.fromarray(
        np.where(MASK[..., None], np.array([0, 0, 2], np.uint8), np.uint8(0)))),
    "PIL L": lambda d: Image.fromarray(MASK.astype(np.uint8) * 255),
    "PIL 1": lambda d: Image.fromarray(MASK),
    "PIL RGB": lambda d: Image.fromarray(np.repeat(MASK[..., None], 3, axis=2).astype(np.uint8) * 255),
    "PIL RGBA, transparent (alpha ignored)": lambda d: Image.fromarray(np.dstack(
        [np.repeat(MASK[..., None], 3, axis=2).astype(np.uint8) * 255, np.zeros((H, W), np.uint8)])),
    "NumPy bool": lambda d: MASK.copy(),
    "NumPy uint8 0/255": lambda d: MASK.astype(np.uint8) * 255,
    "NumPy uint8 0/1": lambda d: MASK.astype(np.uint8),
    "NumPy float32 0/1": lambda d: MASK.astype(np.float32),
    "NumPy float64 soft (0.3 fills)": lambda d: MASK * 0.3,
    "NumPy (H, W, 1)": lambda d: MASK[..., None].astype(np.uint8),
    "NumPy (H, W, 3)": lambda d: np.repeat(MASK[..., None], 3, axis=2).astype(np.uint8),
    "MLX bool": lambda d: mx.array(MASK),
    "MLX float32": lambda d: mx.array(MASK.astype(np.float32)),
}


# --- the entry points, each on random weights --------------------------------------------------------

class EncoderRecorder(nn.Module):
    """Stands in for SAM's image encoder: keeps what it was given, returns a fixed embedding."""

    img_size = 1024

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[np.ndarray] = []

    def __call__(self, x: mx.array) -> mx.array:
        self.seen.append(np.array(x))
        return mx.full((1, 64, 64, 256), 0.1)


def _built(variant: str) -> nn.Module:
    mx.random.seed(0)
    model = families.variants()[variant].build(variant)
    mx.eval(model.parameters())  # once: unevaluated random weights are drawn again by every call
    return model


@pytest.fixture(scope="module")
def entry_points() -> dict[str, Callable[[Any], Any]]:
    """Entry point name -> call on one image, returning something comparable with ==."""
    classifier = resnet.Classifier(_built("resnet18"))
    detector = yolo.YOLO(yolo.seeded("n", 1234, 2.5, 5.0))  # seeded to find boxes on a photo
    inpainter = lama.LaMa(n_blocks=1)  # as test_lama's: the inpaint path, at a fraction of a released variant's cost
    mx.eval(inpainter.parameters())
    sam = _built("sam-tiny")
    recorder = EncoderRecorder()
    sam.image_encoder = recorder
    predictor = SamPredictor(sam)

    def embedded(call: Callable[[], Any]) -> tuple:
        recorder.seen.clear()
        out = call()
        (pixels,) = recorder.seen
        return pixels.tobytes(), out

    def records(anns: list[dict]) -> list:
        return [(r["segmentation"].tobytes(), r["bbox"], r["predicted_iou"]) for r in anns]

    return {
        "Classifier.predict": lambda im: classifier.predict(im, k=3).top,
        "resnet.classify": lambda im: resnet.classify(classifier.net, [im], k=3)[0],
        "YOLO.predict": lambda im: (lambda d: (d.boxes.tobytes(), d.scores.tobytes(), d.classes.tolist()))(
            detector.predict(im, conf=0.05)),
        "SamPredictor.set_image": lambda im: embedded(lambda: predictor.set_image(im))[0],
        "SamAutomaticMaskGenerator.generate": lambda im: (lambda e: (e[0], records(e[1])))(embedded(
            lambda: SamAutomaticMaskGenerator(predictor, points_per_side=1, pred_iou_thresh=0,
                                              stability_score_thresh=0).generate(im))),
        "LaMa.inpaint (image)": lambda im: inpainter.inpaint(im, MASK).tobytes(),
        "LaMa.inpaint (mask)": lambda m: inpainter.inpaint(PIXELS, m).tobytes(),
    }


IMAGE_ENTRY_POINTS = ["Classifier.predict", "resnet.classify", "YOLO.predict", "SamPredictor.set_image",
                      "SamAutomaticMaskGenerator.generate", "LaMa.inpaint (image)"]


@pytest.fixture(scope="module")
def baselines(entry_points) -> dict[str, Any]:
    """Each entry point's result for the plain inputs: the uint8 array, the bool mask."""
    out = {name: entry_points[name](PIXELS.copy()) for name in IMAGE_ENTRY_POINTS}
    out["LaMa.inpaint (mask)"] = entry_points["LaMa.inpaint (mask)"](MASK.copy())
    return out


def test_the_baselines_are_not_trivial(baselines):
    """Equal results must mean equal inputs: the seeded detector finds boxes, SAM keeps masks."""
    assert baselines["YOLO.predict"][2], "no detections to compare"
    assert baselines["SamAutomaticMaskGenerator.generate"][1], "no masks to compare"
    assert baselines["LaMa.inpaint (image)"] != PIXELS.tobytes()


@pytest.mark.parametrize("entry", IMAGE_ENTRY_POINTS)
@pytest.mark.parametrize("kind", list(IMAGE_KINDS))
def test_every_image_kind_gives_the_arrays_result(entry, kind, entry_points, baselines, tmp_path):
    assert entry_points[entry](IMAGE_KINDS[kind](tmp_path)) == baselines[entry]


@pytest.mark.parametrize("kind", list(MASK_KINDS))
def test_every_mask_kind_gives_the_bool_masks_result(kind, entry_points, baselines, tmp_path):
    assert entry_points["LaMa.inpaint (mask)"](MASK_KINDS[kind](tmp_path)) == baselines["LaMa.inpaint (mask)"]


def test_a_list_may_mix_kinds(tmp_path):
    """One batch of the same picture in four forms: four results, each the picture's result alone
    up to the last bits (a batch's sums run in another order)."""
    kinds = [IMAGE_KINDS[k](tmp_path) for k in ("str path (PNG)", "PIL RGB", "MLX uint8", "NumPy float32 in [0, 1]")]
    classifier = resnet.Classifier(_built("resnet18"))
    alone = classifier.predict(PIXELS, k=3).top
    results = classifier.predict(kinds, k=3)
    assert len(results) == len(kinds)
    for result in results:
        assert [label for label, _ in result.top] == [label for label, _ in alone]
        np.testing.assert_allclose([p for _, p in result.top], [p for _, p in alone], rtol=1e-4, atol=1e-6)
    detector = yolo.YOLO(yolo.seeded("n", 1234, 2.5, 5.0))
    one = detector.predict(PIXELS, conf=0.05)
    detections = detector.predict(kinds, conf=0.05)
    assert len(detections) == len(kinds)
    for d in detections:  # near-equal scores may trade places: compare them sorted
        np.testing.assert_allclose(np.sort(d.scores), np.sort(one.scores), rtol=1e-4, atol=1e-5)


# --- bad inputs: one line, naming the entry point or the file, expected vs got ------------------------

BAD_IMAGES: dict[str, tuple[Callable[[Path], Any], str]] = {
    "missing file": (lambda d: d / "nope.jpg", r"nope\.jpg: no such image file$"),
    "not an image file": (lambda d: (d / "notes.png").write_text("hello") and d / "notes.png",
                          r"notes\.png: not a readable image"),
    "grey (H, W) array": (lambda d: PIXELS[..., 0],
                          r"^{what}: expected an \(H, W, 3\) RGB image \(uint8, or float in \[0, 1\]\), got a NumPy "
                          r"uint8 array of shape \(48, 64\); a grey image\?"),
    "channels first": (lambda d: mx.array(PIXELS.transpose(2, 0, 1)),
                       r"^{what}: expected an \(H, W, 3\) RGB image .*got an MLX uint8 array of shape \(3, 48, 64\); "
                       r"channels first\?"),
    "a batch array": (lambda d: PIXELS[None], r"^{what}: expected .* shape \(1, 48, 64, 3\); one image at a time"),
    "float 0..255": (lambda d: PIXELS.astype(np.float32),
                     r"^{what}: float pixels must be in \[0, 1\], got \d+\.\.\d+ \(a NumPy float32 array .*\); "
                     r"for 0\.\.255 values pass uint8$"),
    "float NaN": (lambda d: np.full((H, W, 3), np.nan, np.float32), r"^{what}: float pixels must be finite"),
    "int past 255": (lambda d: PIXELS.astype(np.int32) * 4,
                     r"^{what}: integer pixels must be in 0\.\.255, got 0\.\.\d+"),
    "empty array": (lambda d: np.zeros((0, 64, 3), np.uint8), r"^{what}: empty image \(a NumPy uint8 array of shape"),
    "complex array": (lambda d: np.zeros((H, W, 3), np.complex64), r"^{what}: expected .* got a NumPy complex64 array"),
    "a number": (lambda d: 7, r"^{what}: expected a path, a PIL image, or a NumPy or MLX array holding an \(H, W, 3\) "
                              r"RGB image .*; got int$"),
    "bytes": (lambda d: b"\x89PNG", r"^{what}: expected a path, .*; got bytes$"),
}
# The name each entry point gives its image in errors (segment-everything embeds through set_image).
WHAT = {"Classifier.predict": "Classifier.predict", "resnet.classify": "resnet.classify, image 0",
        "YOLO.predict": "YOLO.predict", "SamPredictor.set_image": "set_image",
        "SamAutomaticMaskGenerator.generate": "set_image", "LaMa.inpaint (image)": "LaMa.inpaint image"}

BAD_MASKS: dict[str, tuple[Callable[[Path], Any], str]] = {
    "missing file": (lambda d: str(d / "nope.png"), r"nope\.png: no such image file$"),
    "two channels": (lambda d: np.zeros((H, W, 2), np.uint8),
                     r"^LaMa\.inpaint mask: expected an \(H, W\) mask \(bool, or numbers: non-zero fills\), "
                     r"got a NumPy uint8 array of shape \(48, 64, 2\)$"),
    "logits (negative)": (lambda d: mx.array(np.where(MASK, 3.0, -3.0).astype(np.float32)),
                          r"^LaMa\.inpaint mask: mask values must be >= 0 .*got a minimum of -3 \(an MLX float32 array"
                          r".*\); threshold logits first"),
    "NaN": (lambda d: np.full((H, W), np.nan), r"^LaMa\.inpaint mask: mask values must not be NaN"),
    "a list": (lambda d: MASK.tolist(), r"^LaMa\.inpaint mask: expected a path, .*; got list$"),
    "another size": (lambda d: MASK[:, :40], r"^LaMa: mask is 40×48 but the image is 64×48"),
}


def _one_line_error(call: Callable[[], Any]) -> str:
    with pytest.raises(MlxnetError) as e:
        call()
    message = str(e.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize("entry", IMAGE_ENTRY_POINTS)
@pytest.mark.parametrize("bad", list(BAD_IMAGES))
def test_bad_images_are_one_line_errors(entry, bad, entry_points, tmp_path):
    make, pattern = BAD_IMAGES[bad]
    message = _one_line_error(lambda: entry_points[entry](make(tmp_path)))
    assert re.search(pattern.replace("{what}", re.escape(WHAT[entry])), message), message


@pytest.mark.parametrize("bad", list(BAD_MASKS))
def test_bad_masks_are_one_line_errors(bad, entry_points, tmp_path):
    make, pattern = BAD_MASKS[bad]
    message = _one_line_error(lambda: entry_points["LaMa.inpaint (mask)"](make(tmp_path)))
    assert re.search(pattern, message), message


def test_lama_keeps_a_float_images_precision():
    """A float image is not rounded to 8 bits on its way in: inpaint_float sees its exact values."""
    net = lama.LaMa(n_blocks=1)
    image = np.random.default_rng(0).random((H, W, 3)).astype(np.float32)
    out = np.array(net.inpaint_float(image, MASK))
    np.testing.assert_array_equal(out[~MASK], image[~MASK])  # unmasked pixels pass through as given
