"""Summary statistics of ultralytics' own detection training samples (8.4: YOLODataset with
augment=True and cfg/default.yaml's hyperparameters, so ``v8_transforms``), for
tests/test_detect_data.py to compare ``mlxnet.training.detect_data.train_sample`` with.

Runs where ultralytics imports:

    YOLO_CONFIG_DIR=/tmp/ultralytics-config YOLO_OFFLINE=1 \\
        python scripts/goldens/golden_augment_stats.py [OUT_JSON]

(default OUT_JSON: tests/fixtures/train/augment_stats.json; it also records default.yaml's
augmentation hyperparameters, HYP_KEYS). The dataset (:func:`build_dataset`,
which the test imports and rebuilds) is drawn from a fixed seed: photos of several sizes, some
above IMGSZ and some below, each a flat muted colour with one to three non-overlapping solid
rectangles, one colour and size per class, placed towards the top left (so that the vertical position
keeps the bias and the horizontal one shows the mirror flips). SAMPLES samples are made with
mosaic open, and SAMPLES again after ultralytics' ``close_mosaic``; sample k is image k mod N.
Each sample gives the per-sample quantities of :func:`sample_stats`; the JSON holds, per mode and
quantity, their mean, standard deviation and count (:func:`summarize`), so the test can state
its tolerance as standard errors.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
IMGSZ = 128
SAMPLES = 384  # 16 per image
SEED = 0
# (H, W): long sides 120 (scaled up to IMGSZ) to 200 (scaled down), multiples of 40 so that every
# object's pixel size below is whole.
SIZES = ((120, 160), (160, 120), (160, 160), (80, 200), (200, 120), (120, 80))
PALETTE = ((230, 30, 30), (30, 200, 30), (30, 60, 230), (230, 220, 30), (220, 30, 220), (30, 210, 220))
# Each class's rectangle (width, height) as a fraction of its photo's long side: once the photo is
# loaded with its long side IMGSZ, an object of class c is SIDES[c] · IMGSZ pixels, so the output
# box's size over that is the affine's scale factor (see sample_stats' "zoom").
SIDES = ((0.2, 0.25), (0.3, 0.15), (0.15, 0.3), (0.25, 0.2), (0.35, 0.175), (0.175, 0.35))
BACKGROUNDS = ((120, 100, 80), (80, 110, 100), (100, 90, 130), (130, 120, 90))  # never grey: R, G, B differ
NAMES = ("red", "green", "blue", "yellow", "magenta", "cyan")
N_IMAGES = 24
GREY = 114
# The hyperparameters mlxnet's AugmentSettings mirrors; their default.yaml values are recorded too.
HYP_KEYS = ("hsv_h", "hsv_s", "hsv_v", "degrees", "translate", "scale", "shear", "perspective", "flipud", "fliplr",
            "mosaic", "mixup")


def _overlaps(a: tuple[int, int, int, int], b: tuple[int, int, int, int], gap: int = 2) -> bool:
    return not (a[2] + gap <= b[0] or b[2] + gap <= a[0] or a[3] + gap <= b[1] or b[3] + gap <= a[1])


def build_dataset(root: Path, n_images: int = N_IMAGES, seed: int = SEED) -> Path:
    """Write root/images/train/*.png, root/labels/train/*.txt and root/data.yaml (train and val
    both that folder); returns the yaml. Label boxes are the rectangles' pixels exactly."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    (root / "images" / "train").mkdir(parents=True, exist_ok=True)
    (root / "labels" / "train").mkdir(parents=True, exist_ok=True)
    for k in range(n_images):
        h, w = SIZES[k % len(SIZES)]
        image = np.empty((h, w, 3), np.uint8)
        image[:] = BACKGROUNDS[k % len(BACKGROUNDS)]
        rects: list[tuple[int, int, int, int]] = []
        lines = []
        for _ in range(int(rng.integers(1, 4))):
            cls = int(rng.integers(len(PALETTE)))
            bw, bh = round(SIDES[cls][0] * max(h, w)), round(SIDES[cls][1] * max(h, w))
            for _attempt in range(20):
                cx, cy = rng.uniform(0.1, 0.65) * w, rng.uniform(0.1, 0.65) * h  # towards the top left
                x1, y1 = int(np.clip(cx - bw / 2, 0, w - bw)), int(np.clip(cy - bh / 2, 0, h - bh))
                rect = (x1, y1, x1 + bw, y1 + bh)
                if not any(_overlaps(rect, other) for other in rects):
                    break
            else:
                continue
            image[rect[1]:rect[3], rect[0]:rect[2]] = PALETTE[cls]
            rects.append(rect)
            x1, y1, x2, y2 = rect
            lines.append(f"{cls} {(x1 + x2) / 2 / w:.6f} {(y1 + y2) / 2 / h:.6f} "
                         f"{(x2 - x1) / w:.6f} {(y2 - y1) / h:.6f}")
        Image.fromarray(image).save(root / "images" / "train" / f"im{k:03d}.png")
        (root / "labels" / "train" / f"im{k:03d}.txt").write_text("\n".join(lines) + "\n")
    names = "".join(f"  {i}: {name}\n" for i, name in enumerate(NAMES))
    (root / "data.yaml").write_text(f"path: .\ntrain: images/train\nval: images/train\nnames:\n{names}")
    return root / "data.yaml"


def _palette_hs() -> np.ndarray:
    """(classes, 2): OpenCV's 8-bit hue (0-179) and saturation of each class's colour."""
    import cv2

    return cv2.cvtColor(np.array([PALETTE], np.uint8), cv2.COLOR_RGB2HSV)[0, :, :2].astype(np.float64)


def _interior_pixels(pixels: np.ndarray, box: np.ndarray) -> np.ndarray:
    """The pixels wholly inside the box less one (blended) pixel on each side: (k, 3)."""
    x1, y1 = int(np.ceil(box[0])) + 1, int(np.ceil(box[1])) + 1
    x2, y2 = int(np.floor(box[2])) - 1, int(np.floor(box[3])) - 1
    return pixels[y1:max(y2, y1), x1:max(x2, x1)].reshape(-1, 3)


def sample_stats(pixels: np.ndarray, boxes: np.ndarray, classes: np.ndarray,
                 imgsz: int = IMGSZ) -> dict[str, float | None]:
    """Per-sample quantities of one sample (pixels (H, W, 3) uint8 RGB, boxes (n, 4) xyxy pixels,
    classes (n,)); None where the sample has none to measure. Each setting shows in some:

    boxes, empty, box_w, box_h, cx, cy and their spreads about the centre, left, top: the
    geometry (mosaic, translate, scale, box filtering, flips: objects start towards the top left);
    distinct: the number of distinct classes (a mosaic of four different photos holds more);
    content_x, content_y: where the photos' pixels (those not neutral) lie, from the centre (the
    translation);
    zoom: the affine's scale factor, the largest (box side / the object's side once loaded) over
    the sample's boxes (a box clipped on both sides reads less, in either implementation);
    grey: the share of neutral pixels (R = G = B: the padding; no photo or object is neutral);
    grey_value: their median value, 114 times the HSV value gain; hue_shift, sat_ratio: inside the
    boxes, the median hue difference from, and saturation ratio to, the object's own colour (the
    hue and saturation gains); mean_r/g/b and pixel_std: the pixels overall. ``*_dev``: the
    absolute deviation from the no-augmentation value, so that the gains' range shows, not only
    their centre."""
    import cv2

    n = len(boxes)
    flat = pixels.astype(np.float64)
    neutral = (pixels[..., 0] == pixels[..., 1]) & (pixels[..., 1] == pixels[..., 2])
    out: dict[str, float | None] = {
        "boxes": float(n),
        "empty": float(n == 0),
        "mean_r": flat[..., 0].mean(), "mean_g": flat[..., 1].mean(), "mean_b": flat[..., 2].mean(),
        "pixel_std": flat.mean(-1).std(),
        "grey": float(neutral.mean()),
        "grey_value": float(np.median(pixels[neutral][:, 0])) if neutral.sum() >= 50 else None,
    }
    out["grey_value_dev"] = None if out["grey_value"] is None else abs(out["grey_value"] - GREY)
    ys, xs = np.nonzero(~neutral)
    out["content_x"] = xs.mean() + 0.5 - imgsz / 2 if len(xs) else None
    out["content_y"] = ys.mean() + 0.5 - imgsz / 2 if len(ys) else None
    out["content_x_dev"] = None if out["content_x"] is None else abs(out["content_x"])
    out["content_y_dev"] = None if out["content_y"] is None else abs(out["content_y"])
    for key in ("distinct", "box_w", "box_h", "cx", "cy", "cx_spread", "cy_spread", "left", "top", "zoom", "zoom_dev",
                "hue_shift", "hue_shift_dev", "sat_ratio", "sat_ratio_dev"):
        out[key] = None
    if n:
        b = np.asarray(boxes, np.float64)
        c = np.asarray(classes, np.int64)
        w, h = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
        cx, cy = (b[:, 0] + b[:, 2]) / 2, (b[:, 1] + b[:, 3]) / 2
        sides = np.array(SIDES)[c] * imgsz
        zoom = np.maximum(w / sides[:, 0], h / sides[:, 1]).max()
        out.update(distinct=len(set(c.tolist())), box_w=w.mean(), box_h=h.mean(), cx=cx.mean(), cy=cy.mean(),
                   cx_spread=np.sqrt(((cx - imgsz / 2) ** 2).mean()), cy_spread=np.sqrt(((cy - imgsz / 2) ** 2).mean()),
                   left=(cx < imgsz / 2).mean(), top=(cy < imgsz / 2).mean(), zoom=zoom, zoom_dev=abs(zoom - 1))
        reference = _palette_hs()
        hue, sat = [], []
        for box, cls in zip(b, c):
            inside = _interior_pixels(pixels, box)
            if len(inside):
                hs = cv2.cvtColor(inside[None], cv2.COLOR_RGB2HSV)[0, :, :2].astype(np.float64)
                hue.append((hs[:, 0] - reference[cls, 0] + 90) % 180 - 90)  # the hue circle is 180 units
                sat.append(hs[:, 1] / reference[cls, 1])
        if hue:
            shift, ratio = float(np.median(np.concatenate(hue))), float(np.median(np.concatenate(sat)))
            out.update(hue_shift=shift, hue_shift_dev=abs(shift), sat_ratio=ratio, sat_ratio_dev=abs(ratio - 1))
    return {k: (None if v is None else float(v)) for k, v in out.items()}


def summarize(rows: list[dict[str, float | None]]) -> dict[str, dict[str, float]]:
    """Per quantity: mean, standard deviation (ddof 1) and count of the samples where it is defined."""
    out = {}
    for key in rows[0]:
        values = np.array([r[key] for r in rows if r[key] is not None], np.float64)
        out[key] = {"mean": float(values.mean()), "sd": float(values.std(ddof=1)), "n": int(len(values))}
    return out


def _ultralytics_rows(dataset, samples: int) -> list[dict[str, float | None]]:
    rows = []
    for k in range(samples):
        item = dataset[k % len(dataset)]
        pixels = item["img"].numpy().transpose(1, 2, 0)  # Format: CHW, RGB (bgr=0.0)
        h, w = pixels.shape[:2]
        xywh = item["bboxes"].numpy().reshape(-1, 4) * np.array([w, h, w, h])  # normalised xywh
        boxes = np.concatenate([xywh[:, :2] - xywh[:, 2:] / 2, xywh[:, :2] + xywh[:, 2:] / 2], axis=1)
        rows.append(sample_stats(pixels, boxes, item["cls"].numpy().reshape(-1)))
    return rows


def main(out: Path) -> None:
    import random
    import tempfile
    from copy import copy

    import torch
    from ultralytics.cfg import get_cfg
    from ultralytics.data.dataset import YOLODataset

    with tempfile.TemporaryDirectory() as tmp:
        yaml = build_dataset(Path(tmp))
        hyp = get_cfg()  # cfg/default.yaml: the hyperparameters under test
        dataset = YOLODataset(img_path=str(yaml.parent / "images" / "train"), imgsz=IMGSZ, batch_size=16,
                              augment=True, hyp=copy(hyp), rect=False, cache=False, stride=32, pad=0.0,
                              prefix="", task="detect", data={"names": dict(enumerate(NAMES)), "channels": 3})
        # The mosaic draws its other three images from the buffer of images loaded so far: load
        # them all first, so that (as in a run past its first batches) every image can be drawn.
        for i in range(len(dataset)):
            dataset.load_image(i)
        result = {"imgsz": IMGSZ, "samples": SAMPLES, "seed": SEED, "n_images": N_IMAGES,
                  "hyp": {key: getattr(hyp, key) for key in HYP_KEYS}}
        for mode in ("mosaic", "closed"):
            if mode == "closed":
                dataset.close_mosaic(copy(hyp))  # what the trainer does for the last close_mosaic epochs
            random.seed(SEED)
            np.random.seed(SEED)
            torch.manual_seed(SEED)
            result[mode] = summarize(_ultralytics_rows(dataset, SAMPLES))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    os.environ.setdefault("YOLO_CONFIG_DIR", "/tmp/ultralytics-config")
    os.environ.setdefault("YOLO_OFFLINE", "1")
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests" / "fixtures" / "train" / "augment_stats.json")
