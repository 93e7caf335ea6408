"""A small YOLO-format detection data set drawn from a seed: circles, squares and triangles of
random colours and sizes on textured backgrounds, in photos of a few aspect ratios. Used by
``bench_train_detect.py`` (the same data for mlxnet and ultralytics) and by the tests, so that
no data set is downloaded.

    python scripts/bench/shapes_dataset.py OUTDIR [--train 128] [--val 32] [--seed 0]

writes OUTDIR/data.yaml, OUTDIR/images/{train,val}/*.jpg and OUTDIR/labels/{train,val}/*.txt.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import cv2
import numpy as np

NAMES = ("circle", "square", "triangle")
SIZES = ((240, 320), (320, 240), (256, 256), (288, 384))  # (H, W) of the photos


def _background(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A smooth two-colour gradient with noise, so no object is found by colour alone."""
    a, b = rng.uniform(40, 215, 3), rng.uniform(40, 215, 3)
    t = np.linspace(0, 1, w if rng.random() < 0.5 else h)
    ramp = a[None] * (1 - t[:, None]) + b[None] * t[:, None]
    image = np.broadcast_to(ramp[None] if len(t) == w else ramp[:, None], (h, w, 3)).copy()
    image += rng.normal(0, 12, (h, w, 3))
    return np.clip(image, 0, 255).astype(np.uint8)


def _draw(image: np.ndarray, cls: int, box: np.ndarray, colour: tuple[int, ...]) -> None:
    x1, y1, x2, y2 = (int(round(v)) for v in box)
    if cls == 0:
        cv2.ellipse(image, ((x1 + x2) // 2, (y1 + y2) // 2), ((x2 - x1) // 2, (y2 - y1) // 2), 0, 0, 360, colour, -1)
    elif cls == 1:
        cv2.rectangle(image, (x1, y1), (x2 - 1, y2 - 1), colour, -1)
    else:
        cv2.fillPoly(image, [np.array([[(x1 + x2) // 2, y1], [x2 - 1, y2 - 1], [x1, y2 - 1]], np.int32)], colour)


def sample(rng: np.random.Generator) -> tuple[np.ndarray, list[tuple[int, np.ndarray]]]:
    """One photo (H, W, 3) RGB uint8 and its objects: (class, xyxy pixel box)."""
    h, w = SIZES[rng.integers(len(SIZES))]
    image = _background(rng, h, w)
    objects: list[tuple[int, np.ndarray]] = []
    for _ in range(int(rng.integers(1, 5))):
        side = rng.uniform(0.12, 0.45) * min(h, w)
        aspect = rng.uniform(0.7, 1.4)
        bw, bh = side * aspect, side / aspect
        x1, y1 = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
        box = np.array([x1, y1, x1 + bw, y1 + bh])
        if any(_iou(box, other) > 0.2 for _, other in objects):
            continue
        cls = int(rng.integers(len(NAMES)))
        _draw(image, cls, box, tuple(int(c) for c in rng.integers(0, 256, 3)))
        objects.append((cls, box))
    return image, objects


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def make(root: str | Path, train: int = 128, val: int = 32, seed: int = 0) -> Path:
    """Write the data set under ``root``; returns its data.yaml."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    for split, count in (("train", train), ("val", val)):
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            image, objects = sample(rng)
            h, w = image.shape[:2]
            cv2.imwrite(str(root / "images" / split / f"{i:05d}.jpg"), image[..., ::-1],
                        [cv2.IMWRITE_JPEG_QUALITY, 92])
            lines = [f"{c} {(b[0] + b[2]) / 2 / w:.6f} {(b[1] + b[3]) / 2 / h:.6f} {(b[2] - b[0]) / w:.6f} "
                     f"{(b[3] - b[1]) / h:.6f}" for c, b in objects]
            (root / "labels" / split / f"{i:05d}.txt").write_text("\n".join(lines) + "\n")
    yaml = root / "data.yaml"
    yaml.write_text(f"path: {root.resolve()}\ntrain: images/train\nval: images/val\nnames:\n"
                    + "".join(f"  {i}: {n}\n" for i, n in enumerate(NAMES)))
    return yaml


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--train", type=int, default=128)
    parser.add_argument("--val", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(make(args.outdir, args.train, args.val, args.seed))
