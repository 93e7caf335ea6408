"""Training data of ``mlxnet train detect``: a YOLO-format split, its labels, and ultralytics'
training augmentation (8.4's ``v8_transforms`` for detection at its default hyperparameters).

One training sample, as ultralytics makes it:

1. Mosaic (probability ``mosaic``, 1.0): the image and three others drawn at random, each loaded
   with its long side scaled to ``imgsz``, around a random centre of a 2·imgsz canvas of grey
   114; boxes clipped to the canvas, empty ones dropped.
2. RandomPerspective: one affine (projective where ``perspective`` > 0) map of the mosaic (or
   of the loaded image alone) onto the imgsz × imgsz output: the input's centre goes to the
   output's centre ± ``translate``, scaled by 1 ± ``scale``, rotated by ± ``degrees``, sheared
   by ± ``shear``; uncovered pixels grey 114. Boxes are mapped by their corners, clipped, and
   kept only where ultralytics' ``box_candidates`` keeps them.
3. MixUp (probability ``mixup``, 0.0): blended with another sample made by steps 1-2.
4. RandomHSV: one random gain each on hue, saturation and value, applied through lookup tables.
5. RandomFlip: upside down with probability ``flipud`` (0.0), then mirrored with ``fliplr`` (0.5).

With mosaic closed (the last ``close_mosaic`` epochs; ultralytics' ``close_mosaic`` sets mosaic,
mixup, cutmix and copy-paste to 0 and rebuilds the same pipeline) step 1 is skipped: the loaded
image itself is the input of step 2, which scales and places it on the imgsz × imgsz output.
Cutmix and copy-paste are 0 in ultralytics' defaults and not implemented; ultralytics' optional
Albumentations step runs only where that package is installed and is not part of this pipeline.

Every random draw comes from the ``np.random.Generator`` passed in (``sample_rng(seed, epoch,
index)`` in :func:`batches`), so a sample is a function of (seed, epoch, index) whichever thread
makes it and whether or not the run was resumed. One deliberate difference from ultralytics:
its mosaic draws the three other images from a buffer of the images its loader worker decoded
last (up to 8 batches' worth), ours from the whole dataset; over a shuffled epoch the two draw
alike. Polygon labels count as their bounding boxes: ultralytics maps the polygon itself (the
same box unless the polygon is rotated or cut by the output's edge) and keeps a polygon's box
down to 1% of its area rather than 10%.

Arrays are RGB uint8 HWC; boxes float32 xyxy.
"""
from __future__ import annotations

import math
import multiprocessing
import os
import signal
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import cv2
import numpy as np

from ..errors import MlxnetError
from ..evaluation import coco
from ..evaluation import dataset as yolo_dataset
from ..evaluation.rect import image_hw
from ..image import load_image, resize_bilinear
from .data import sample_rng

PAD_VALUE = 114  # ultralytics' grey for every pixel no image covers
SPLITS = ("train", "val")
# ultralytics' box_candidates thresholds (RandomPerspective): a box survives the affine when both
# sides exceed 2 pixels, its aspect ratio stays under 100 and it keeps over 10% of its area (the
# area before the affine scaled by the affine's scale factor, so shrinking alone loses nothing).
WH_THR = 2.0
AR_THR = 100.0
AREA_THR = 0.1
MIXUP_BETA = 32.0  # ultralytics' MixUp ratio ~ Beta(32, 32): close to an even blend


@dataclass(frozen=True)
class DetectionSet:
    """One split of a dataset: its images (sorted per source) and the class names; a COCO
    file's split also carries its labels (``labels_of``: image, width, height -> xyxy pixel
    boxes, class indices), a YOLO-format one reads them from its label files."""

    source: str  # the data.yaml or COCO file, as messages name it
    images: list[Path]
    names: tuple[str, ...]
    labels_of: Callable[[Path, int, int], tuple[np.ndarray, np.ndarray]] | None = None

    def labels(self, image: Path, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
        """One image's (N, 4) xyxy pixel boxes and (N,) classes."""
        if self.labels_of is not None:
            return self.labels_of(image, width, height)
        return yolo_dataset.read_labels(image, width, height, len(self.names))


@dataclass(frozen=True)
class Labels:
    """One image's objects: boxes (n, 4) float32 xyxy normalised to the image (0..1 for a label
    inside it) and class ids (n,) int32."""

    boxes: np.ndarray
    classes: np.ndarray


@dataclass(frozen=True)
class AugmentSettings:
    """ultralytics' augmentation hyperparameters (cfg/default.yaml), named as it names them."""

    hsv_h: float = 0.015  # hue gain: ± this fraction of the hue circle
    hsv_s: float = 0.7  # saturation gain: × 1 ± this
    hsv_v: float = 0.4  # value gain: × 1 ± this
    degrees: float = 0.0  # rotation: ± degrees
    translate: float = 0.1  # the centre moves by ± this fraction of imgsz
    scale: float = 0.5  # zoom: × 1 ± this
    shear: float = 0.0  # ± degrees
    perspective: float = 0.0  # projective terms: ± this
    flipud: float = 0.0  # probability of an upside-down flip
    fliplr: float = 0.5  # probability of a mirror flip
    mosaic: float = 1.0  # probability of a mosaic of four (while mosaic is open)
    mixup: float = 0.0  # probability of a MixUp (while mosaic is open)

    def __post_init__(self) -> None:
        for name in ("flipud", "fliplr", "mosaic", "mixup"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise MlxnetError(f"augmentation {name} is a probability (0 to 1), got {getattr(self, name)}")
        for name in ("hsv_h", "hsv_s", "hsv_v", "degrees", "translate", "scale", "shear", "perspective"):
            if not getattr(self, name) >= 0.0:
                raise MlxnetError(f"augmentation {name} must be 0 or more, got {getattr(self, name)}")
        if self.scale >= 1.0:  # the zoom 1 ± scale must stay positive
            raise MlxnetError(f"augmentation scale must be under 1, got {self.scale}")


# -- the dataset -----------------------------------------------------------------------------------

def load_split(data: str | Path, split: str) -> DetectionSet:
    """The ``split`` ('train' or 'val') of the YOLO-format dataset ``data`` (a data.yaml, or a
    folder holding one), read as ``mlxnet val detect`` reads it; a missing key is an error
    naming the yaml and the key."""
    if split not in SPLITS:
        raise MlxnetError(f"unknown split {split!r}: expected one of {', '.join(SPLITS)}")
    if coco.is_coco(data):
        return _coco_split(Path(data), split)
    found = yolo_dataset.load(data, split)
    return DetectionSet(str(found.yaml), found.images, found.names)


def _coco_split(json_file: Path, split: str) -> DetectionSet:
    """A COCO instances file as the train split; its val split is the file of the same name
    with its last 'train' replaced by 'val' (instances_train2017.json -> instances_val2017.json).
    Classes are the categories in the order of their ids (names as the file gives them)."""
    if split == "val":
        name = json_file.name
        at = name.rfind("train")
        if at < 0:
            raise MlxnetError(f"{json_file}: no validation file to go with it (a COCO training file is named "
                              "…train….json, its val file …val….json beside it); pass --no-val to train without")
        json_file = json_file.with_name(name[:at] + "val" + name[at + len("train"):])
        if not json_file.is_file():
            raise MlxnetError(f"{json_file}: no such COCO validation file (beside the training file); pass --no-val "
                              "to train without")
    found = coco.load(json_file)
    ids = sorted(found.categories)
    index = {cid: k for k, cid in enumerate(ids)}

    def labels(image: Path, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
        record = found.by_path[str(image)]
        return record.boxes, np.array([index[c] for c in record.categories.tolist()], np.int64)
    return DetectionSet(str(json_file), [im.path for im in found.images],
                        tuple(found.categories[i] for i in ids), labels)


def read_all_labels(ds: DetectionSet) -> list[Labels]:
    """Every image's labels, read up front so that a missing image or a bad label line (its
    file:line named) fails before any training step."""
    out = []
    for image in ds.images:
        if not image.is_file():
            raise MlxnetError(f"{image}: no such image file (listed by {ds.source})")
        if ds.labels_of is not None:  # COCO: pixel boxes, normalised by the image's size
            hw = image_hw(image)
            if hw is None:
                raise MlxnetError(f"{image}: not an image this toolkit reads (listed by {ds.source})")
            boxes, classes = ds.labels_of(image, hw[1], hw[0])
            boxes = np.clip(np.asarray(boxes, np.float64).reshape(-1, 4) / [hw[1], hw[0], hw[1], hw[0]], 0, 1)
        else:  # width and height 1: read_labels scales normalised boxes to pixels, and 1 keeps them normalised
            boxes, classes = yolo_dataset.read_labels(image, 1, 1, len(ds.names))
        out.append(Labels(np.asarray(boxes, np.float32).reshape(-1, 4), np.asarray(classes, np.int32)))
    return out


# -- loading ---------------------------------------------------------------------------------------

def load_resized(path: Path, imgsz: int) -> np.ndarray:
    """An image with its long side scaled to ``imgsz`` (up or down), as ultralytics' dataset loads
    a training image: each side ``min(ceil(side · r), imgsz)``, OpenCV's INTER_LINEAR."""
    image = load_image(path)
    h0, w0 = image.shape[:2]
    r = imgsz / max(h0, w0)
    if r != 1:
        image = resize_bilinear(image, (min(math.ceil(w0 * r), imgsz), min(math.ceil(h0 * r), imgsz)))
    return image


class ImageCache:
    """Resized images by file and size, the least recently used dropped past ``max_bytes``: a
    mosaic reads four images, so a dataset that fits is decoded about once an epoch instead of
    four times (ultralytics keeps recent images in RAM for the same reason). Thread-safe; the
    arrays it returns are read-only."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._images: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, ds: DetectionSet, index: int, imgsz: int) -> np.ndarray:
        key = (str(ds.images[index]), imgsz)
        with self._lock:
            image = self._images.get(key)
            if image is not None:
                self._images.move_to_end(key)
                return image
        image = load_resized(ds.images[index], imgsz)  # outside the lock: threads decode in parallel
        image.flags.writeable = False
        with self._lock:
            if key not in self._images and image.nbytes <= self.max_bytes:
                self._images[key] = image
                self._bytes += image.nbytes
                while self._bytes > self.max_bytes:
                    _, dropped = self._images.popitem(last=False)
                    self._bytes -= dropped.nbytes
        return image


def _load(ds: DetectionSet, index: int, imgsz: int, cache: ImageCache | None) -> np.ndarray:
    """The resized image ``index``; any failure is one line naming its file."""
    try:
        return cache.get(ds, index, imgsz) if cache is not None else load_resized(ds.images[index], imgsz)
    except MlxnetError as e:
        if str(ds.images[index]) in str(e):
            raise
        raise MlxnetError(f"{ds.images[index]}: {e}") from None
    except Exception as e:  # noqa: BLE001 - whatever a decoder raises, the user needs the file
        raise MlxnetError(f"{ds.images[index]}: cannot load the image ({type(e).__name__}: {e})") from e


def _in_pixels(labels: Labels, width: int, height: int) -> np.ndarray:
    return labels.boxes * np.array([width, height, width, height], np.float32)


# -- the transforms --------------------------------------------------------------------------------

def mosaic4(images: Sequence[np.ndarray], boxes: Sequence[np.ndarray], classes: Sequence[np.ndarray],
            imgsz: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ultralytics' 4-image Mosaic: a (2·imgsz)² canvas of grey 114; a centre (xc, yc) drawn in
    [imgsz/2, 3·imgsz/2) (truncated to whole pixels); images 0-3 meet there with, in turn, their
    bottom-right, bottom-left, top-right and top-left corner, cut by the canvas. Boxes (pixels of
    their image) move with their image, are clipped to the canvas, and those left without area go."""
    s = imgsz
    low, high = -(-s // 2), 2 * s + (-s // 2)  # ultralytics' border is -imgsz // 2 on each side
    yc, xc = int(rng.uniform(low, high)), int(rng.uniform(low, high))
    canvas = np.full((2 * s, 2 * s, 3), PAD_VALUE, np.uint8)
    placed_boxes, placed_classes = [], []
    for quadrant, (image, b, c) in enumerate(zip(images, boxes, classes)):
        h, w = image.shape[:2]
        left = xc - w if quadrant in (0, 2) else xc  # images 0 and 2 lie left of the centre
        top = yc - h if quadrant in (0, 1) else yc  # images 0 and 1 above it
        x1, y1, x2, y2 = max(left, 0), max(top, 0), min(left + w, 2 * s), min(top + h, 2 * s)
        canvas[y1:y2, x1:x2] = image[y1 - top:y2 - top, x1 - left:x2 - left]
        placed_boxes.append(b + np.array([left, top, left, top], np.float32))
        placed_classes.append(c)
    out_boxes = np.clip(np.concatenate(placed_boxes).reshape(-1, 4), 0, 2 * s)
    out_classes = np.concatenate(placed_classes)
    # ultralytics' remove_zero_area_boxes: after clipping, a box outside the canvas is a line or a point.
    keep = (out_boxes[:, 2] - out_boxes[:, 0]) * (out_boxes[:, 3] - out_boxes[:, 1]) > 0
    return canvas, out_boxes[keep], out_classes[keep]


def affine_matrix(height: int, width: int, out_size: int, rng: np.random.Generator,
                  settings: AugmentSettings) -> tuple[np.ndarray, float]:
    """RandomPerspective's 3×3 float32 map (input pixels -> output pixels) and its scale factor:
    centre the input at the origin, then perspective, rotation and scale, shear, and a move to the
    output's centre ± translate (applied right to left, in ultralytics' order)."""
    centre = np.eye(3, dtype=np.float32)
    centre[0, 2], centre[1, 2] = -width / 2, -height / 2
    perspective = np.eye(3, dtype=np.float32)
    perspective[2, 0] = rng.uniform(-settings.perspective, settings.perspective)
    perspective[2, 1] = rng.uniform(-settings.perspective, settings.perspective)
    rotate_scale = np.eye(3, dtype=np.float32)
    angle = rng.uniform(-settings.degrees, settings.degrees)
    scale = rng.uniform(1 - settings.scale, 1 + settings.scale)
    rotate_scale[:2] = cv2.getRotationMatrix2D(center=(0, 0), angle=angle, scale=scale)
    shear = np.eye(3, dtype=np.float32)
    shear[0, 1] = math.tan(rng.uniform(-settings.shear, settings.shear) * math.pi / 180)
    shear[1, 0] = math.tan(rng.uniform(-settings.shear, settings.shear) * math.pi / 180)
    move = np.eye(3, dtype=np.float32)
    move[0, 2] = rng.uniform(0.5 - settings.translate, 0.5 + settings.translate) * out_size
    move[1, 2] = rng.uniform(0.5 - settings.translate, 0.5 + settings.translate) * out_size
    return move @ shear @ rotate_scale @ perspective @ centre, float(scale)


def map_boxes(boxes: np.ndarray, matrix: np.ndarray, projective: bool) -> np.ndarray:
    """The xyxy boxes that enclose each box's four corners after ``matrix``."""
    n = len(boxes)
    if n == 0:
        return boxes.reshape(0, 4)
    corners = np.ones((n * 4, 3), np.float32)
    corners[:, :2] = boxes[:, [0, 1, 2, 3, 0, 3, 2, 1]].reshape(n * 4, 2)  # x1y1, x2y2, x1y2, x2y1
    mapped = corners @ matrix.T
    xy = (mapped[:, :2] / mapped[:, 2:3] if projective else mapped[:, :2]).reshape(n, 4, 2)
    return np.concatenate([xy.min(1), xy.max(1)], axis=1).astype(np.float32)


def box_candidates(before: np.ndarray, after: np.ndarray, wh_thr: float = WH_THR, ar_thr: float = AR_THR,
                   area_thr: float = AREA_THR, eps: float = 1e-16) -> np.ndarray:
    """ultralytics' box_candidates: which boxes (n, 4) ``after`` the affine are still objects
    compared with ``before`` (already multiplied by the affine's scale): sides over ``wh_thr``
    pixels, aspect ratio under ``ar_thr``, area over ``area_thr`` of before's."""
    w1, h1 = before[:, 2] - before[:, 0], before[:, 3] - before[:, 1]
    w2, h2 = after[:, 2] - after[:, 0], after[:, 3] - after[:, 1]
    aspect = np.maximum(w2 / (h2 + eps), h2 / (w2 + eps))
    return (w2 > wh_thr) & (h2 > wh_thr) & (w2 * h2 / (w1 * h1 + eps) > area_thr) & (aspect < ar_thr)


def random_perspective(image: np.ndarray, boxes: np.ndarray, classes: np.ndarray, imgsz: int,
                       rng: np.random.Generator, settings: AugmentSettings
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ultralytics' RandomPerspective onto an imgsz × imgsz output (see :func:`affine_matrix`),
    with OpenCV's warp (bilinear, border grey 114) so the pixels are its pixels."""
    h, w = image.shape[:2]
    matrix, scale = affine_matrix(h, w, imgsz, rng, settings)
    projective = bool(settings.perspective)
    border = (PAD_VALUE,) * 4  # OpenCV reads a 4-value border; 3 values would leave the 4th at 0
    if projective:
        out = cv2.warpPerspective(image, matrix, dsize=(imgsz, imgsz), borderValue=border)
    else:
        out = cv2.warpAffine(image, matrix[:2], dsize=(imgsz, imgsz), borderValue=border)
    mapped = np.clip(map_boxes(boxes, matrix, projective), 0, imgsz)
    keep = box_candidates(boxes * np.float32(scale), mapped)
    return out, mapped[keep], classes[keep]


def random_hsv(image: np.ndarray, rng: np.random.Generator, hgain: float, sgain: float, vgain: float) -> np.ndarray:
    """ultralytics' RandomHSV: OpenCV's 8-bit HSV (hue 0-179), hue shifted by up to ± hgain of the
    circle, saturation and value multiplied by 1 ± their gain (clipped to 255), each through a
    lookup table (values truncated to integers), back to RGB. A grey pixel stays grey (its
    saturation 0 maps to 0) and only its value changes."""
    if not (hgain or sgain or vgain):
        return image
    r = rng.uniform(-1, 1, 3) * [hgain, sgain, vgain]
    x = np.arange(256, dtype=np.float64)
    hue = ((x + r[0] * 180) % 180).astype(np.uint8)
    saturation = np.clip(x * (r[1] + 1), 0, 255).astype(np.uint8)
    value = np.clip(x * (r[2] + 1), 0, 255).astype(np.uint8)
    saturation[0] = 0  # ultralytics (8.3.79 on): pure grey keeps no colour
    table = np.stack([hue, saturation, value], -1).reshape(1, 256, 3)
    # OpenCV's RGB<->HSV on RGB pixels equals ultralytics' BGR<->HSV on the same pixels in BGR order.
    hsv = cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_RGB2HSV)
    return cv2.cvtColor(cv2.LUT(hsv, table), cv2.COLOR_HSV2RGB)


def random_flips(image: np.ndarray, boxes: np.ndarray, rng: np.random.Generator, flipud: float,
                 fliplr: float) -> tuple[np.ndarray, np.ndarray]:
    """ultralytics' two RandomFlips: upside down with probability ``flipud``, then mirrored with
    probability ``fliplr``; a box's edges move with the pixels (x -> width - x)."""
    h, w = image.shape[:2]
    boxes = boxes.copy()
    if rng.random() < flipud:
        image = image[::-1]
        boxes[:, [1, 3]] = h - boxes[:, [3, 1]]
    if rng.random() < fliplr:
        image = image[:, ::-1]
        boxes[:, [0, 2]] = w - boxes[:, [2, 0]]
    return image, boxes


def _placed(ds: DetectionSet, labels: Sequence[Labels], index: int, imgsz: int, rng: np.random.Generator,
            use_mosaic: bool, settings: AugmentSettings, cache: ImageCache | None
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mosaic (when ``use_mosaic``) then RandomPerspective: ultralytics' pre_transform, the part
    MixUp repeats for its second image."""
    if use_mosaic:
        indices = [index, *(int(i) for i in rng.integers(0, len(ds.images), 3))]
        images = [_load(ds, i, imgsz, cache) for i in indices]
        boxes = [_in_pixels(labels[i], im.shape[1], im.shape[0]) for i, im in zip(indices, images)]
        image, b, c = mosaic4(images, boxes, [labels[i].classes for i in indices], imgsz, rng)
    else:
        image = _load(ds, index, imgsz, cache)
        b, c = _in_pixels(labels[index], image.shape[1], image.shape[0]), labels[index].classes
    return random_perspective(image, b, c, imgsz, rng, settings)


def train_sample(ds: DetectionSet, labels: Sequence[Labels], index: int, *, imgsz: int, rng: np.random.Generator,
                 mosaic: bool, settings: AugmentSettings = AugmentSettings(), cache: ImageCache | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Training sample ``index``: pixels (imgsz, imgsz, 3) uint8 RGB, boxes (n, 4) float32 xyxy in
    its pixels, classes (n,) int32; ``mosaic=False`` once mosaic is closed (see the module's doc).
    ``cache``: where resized images are kept between samples (none: every image is decoded)."""
    # Each draw is made whether or not its transform applies, so that a probability changes only
    # the transforms it decides.
    use_mosaic = rng.random() < settings.mosaic and mosaic
    image, boxes, classes = _placed(ds, labels, index, imgsz, rng, use_mosaic, settings, cache)
    if rng.random() < settings.mixup and mosaic:  # ultralytics' close_mosaic turns MixUp off too
        other = int(rng.integers(0, len(ds.images)))
        other_mosaic = rng.random() < settings.mosaic
        image2, boxes2, classes2 = _placed(ds, labels, other, imgsz, rng, other_mosaic, settings, cache)
        r = rng.beta(MIXUP_BETA, MIXUP_BETA)
        image = (image * r + image2 * (1 - r)).astype(np.uint8)
        boxes, classes = np.concatenate([boxes, boxes2]), np.concatenate([classes, classes2])
    image = random_hsv(image, rng, settings.hsv_h, settings.hsv_s, settings.hsv_v)
    image, boxes = random_flips(image, boxes, rng, settings.flipud, settings.fliplr)
    return np.ascontiguousarray(image), boxes.astype(np.float32), classes.astype(np.int32)


# -- batches on worker threads ---------------------------------------------------------------------

@dataclass
class Batch:
    """One training batch: images (B, imgsz, imgsz, 3) uint8 RGB, each image's boxes (n_i, 4)
    float32 xyxy pixels and classes (n_i,) int32, its files, and how long the consumer waited
    for it (seconds the batch was not ready when asked for)."""

    images: np.ndarray
    boxes: list[np.ndarray]
    classes: list[np.ndarray]
    paths: list[Path]
    wait_seconds: float = 0.0


def default_workers() -> int:
    """Data threads when the caller names none: a thread per core, at most 8 (decoding and
    OpenCV release the GIL; beyond 8 the warps of imgsz 640 come faster than a step needs)."""
    return max(1, min(8, os.cpu_count() or 1))


# Resized images kept for mosaics by default: about what ultralytics' loader keeps (8 workers, each
# up to 8 batches of 16 images: ~1,000 images of 640 × 480).
DEFAULT_CACHE_BYTES = 1 << 30


def _sample_into(ds: DetectionSet, labels: Sequence[Labels], index: int, out: np.ndarray, *, imgsz: int, seed: int,
                 epoch: int, mosaic: bool, settings: AugmentSettings,
                 cache: ImageCache) -> tuple[np.ndarray, np.ndarray]:
    """:func:`train_sample` of ``index`` written into ``out``; any failure one line naming the image."""
    try:
        pixels, boxes, classes = train_sample(ds, labels, index, imgsz=imgsz, rng=sample_rng(seed, epoch, index),
                                              mosaic=mosaic, settings=settings, cache=cache)
    except MlxnetError:
        raise
    except Exception as e:  # noqa: BLE001 - named for the user, the original chained
        raise MlxnetError(f"{ds.images[index]}: augmenting the image failed ({type(e).__name__}: {e})") from e
    out[...] = pixels  # straight into the batch: no stacking in the consumer's thread
    return boxes, classes


# -- samples in worker processes -------------------------------------------------------------------

_WORKER: dict = {}  # a worker process's run: its data set, labels, settings and image cache
_MAIN_GUARD = 'an `if __name__ == "__main__":` guard (worker processes import the script again)'


def _start_worker(ds: DetectionSet, labels: Sequence[Labels], imgsz: int, settings: AugmentSettings,
                  cache_bytes: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C is the trainer's: it stops the workers
    _WORKER.update(ds=ds, labels=labels, imgsz=imgsz, settings=settings, cache=ImageCache(cache_bytes))


def _worker_sample(index: int, seed: int, epoch: int, mosaic: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    w = _WORKER
    pixels = np.empty((w["imgsz"], w["imgsz"], 3), np.uint8)
    boxes, classes = _sample_into(w["ds"], w["labels"], index, pixels, imgsz=w["imgsz"], seed=seed, epoch=epoch,
                                  mosaic=mosaic, settings=w["settings"], cache=w["cache"])
    return pixels, boxes, classes


AHEAD = 3  # batches being made beyond the one the step consumes


class SampleProcesses:
    """Worker processes that make a run's training samples, started once for all its epochs.
    The samples' Python (decoding glue, the augmentation's small numpy steps) then never holds
    the interpreter lock that the training step's graph building needs, as it does on threads.
    The workers are spawned, not forked (a fork of a process using the GPU is not safe), so a
    script that trains must guard its entry point with ``if __name__ == "__main__":``, as with
    any multiprocessing. Each worker keeps its share of :data:`DEFAULT_CACHE_BYTES` of images."""

    def __init__(self, ds: DetectionSet, labels: Sequence[Labels], *, imgsz: int, workers: int,
                 settings: AugmentSettings = AugmentSettings()) -> None:
        if workers < 1:
            raise MlxnetError(f"worker processes: at least 1, got {workers}")
        if multiprocessing.parent_process() is not None and multiprocessing.current_process().name != "MainProcess":
            raise MlxnetError(f"data worker processes started from a data worker process: the script that trains "
                              f"needs {_MAIN_GUARD}")
        self.ds, self.imgsz, self.settings = ds, imgsz, settings
        self._prefetched: dict[tuple[int, int, int, bool], Future] = {}
        self._pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                         initializer=_start_worker,
                                         # the labels go over read: a COCO split's reader is a closure
                                         initargs=(replace(ds, labels_of=None), list(labels), imgsz, settings,
                                                   DEFAULT_CACHE_BYTES // workers))

    def submit(self, index: int, seed: int, epoch: int, mosaic: bool) -> Future:
        """Sample ``index`` of ``epoch``, the one :meth:`prefetch` started if it did."""
        started = self._prefetched.pop((index, seed, epoch, mosaic), None)
        return started if started is not None else self._pool.submit(_worker_sample, index, seed, epoch, mosaic)

    def prefetch(self, indices: Iterable[int], seed: int, epoch: int, mosaic: bool) -> None:
        """Start these samples now (the first batches of the next epoch, while this one validates);
        :meth:`submit` hands them out. Samples started earlier and never asked for are dropped."""
        for f in self._prefetched.values():
            f.cancel()
        self._prefetched = {(int(i), seed, epoch, mosaic): self._pool.submit(_worker_sample, int(i), seed, epoch, mosaic)
                            for i in indices}

    def close(self) -> None:
        self._prefetched.clear()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "SampleProcesses":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _collect(ds: DetectionSet, indices: list[int], images: np.ndarray, futures: list[Future],
             from_processes: bool) -> list[tuple[np.ndarray, np.ndarray]]:
    """The batch's (boxes, classes), in order; a process's pixels copied into ``images``."""
    results = []
    for j, f in enumerate(futures):
        try:
            result = f.result()
        except BrokenProcessPool:
            raise MlxnetError(f"the data worker process making {ds.images[indices[j]]} died: out of memory (try "
                              f"fewer --workers), or the script that trains lacks {_MAIN_GUARD}") from None
        if from_processes:
            images[j] = result[0]
            result = result[1:]
        results.append(result)
    return results


def batches(ds: DetectionSet, labels: Sequence[Labels], indices_per_batch: Iterable[Sequence[int]], *,
            imgsz: int, seed: int, epoch: int, mosaic: bool, workers: int | None = None,
            settings: AugmentSettings = AugmentSettings(), ahead: int = AHEAD,
            cache: ImageCache | None = None, processes: SampleProcesses | None = None) -> Iterator[Batch]:
    """The batches of ``indices_per_batch`` (dataset indices), in order, each sample
    :func:`train_sample` with ``sample_rng(seed, epoch, index)``. Samples are made on ``workers``
    threads (None: :func:`default_workers`; 0: in the caller's thread), or by ``processes`` (a
    run's :class:`SampleProcesses`; then ``workers`` and ``cache`` are unused), at most
    ``ahead`` batches beyond the one being consumed, so memory stays bounded. A failure
    re-raises here, in order, as one line naming the image. ``cache``: resized images shared
    across calls (None: one of :data:`DEFAULT_CACHE_BYTES` for this call)."""
    workers = default_workers() if workers is None else workers
    if workers < 0 or ahead < 1:
        raise MlxnetError(f"workers must be 0 or more and ahead at least 1, got {workers} and {ahead}")
    if processes is not None and (processes.ds is not ds or processes.imgsz != imgsz or processes.settings != settings):
        raise MlxnetError("batches: the worker processes were started for another data set, imgsz or settings")
    cache = ImageCache(DEFAULT_CACHE_BYTES) if cache is None and processes is None else cache
    options = dict(imgsz=imgsz, seed=seed, epoch=epoch, mosaic=mosaic, settings=settings, cache=cache)

    groups = iter(indices_per_batch)
    if workers == 0 and processes is None:
        for group in groups:
            indices = [int(i) for i in group]
            images = np.empty((len(indices), imgsz, imgsz, 3), np.uint8)
            start = time.perf_counter()
            results = [_sample_into(ds, labels, i, images[j], **options) for j, i in enumerate(indices)]
            yield _batch(ds, indices, images, results, time.perf_counter() - start)
        return

    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="detect-data") if processes is None else None
    pending: deque[tuple[list[int], np.ndarray, list[Future]]] = deque()

    def submit_next() -> bool:
        group = next(groups, None)
        if group is None:
            return False
        indices = [int(i) for i in group]
        images = np.empty((len(indices), imgsz, imgsz, 3), np.uint8)
        if processes is not None:
            futures = [processes.submit(i, seed, epoch, mosaic) for i in indices]
        else:
            futures = [pool.submit(_sample_into, ds, labels, i, images[j], **options) for j, i in enumerate(indices)]
        pending.append((indices, images, futures))
        return True

    try:
        while len(pending) < ahead and submit_next():
            pass
        while pending:
            indices, images, futures = pending.popleft()
            submit_next()  # keep the workers ``ahead`` batches beyond this one while it is consumed
            start = time.perf_counter()
            results = _collect(ds, indices, images, futures, processes is not None)
            yield _batch(ds, indices, images, results, time.perf_counter() - start)
    finally:
        # A consumer that stops early (an error, a break) leaves nothing running behind it.
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        else:
            for _, _, futures in pending:
                for f in futures:
                    f.cancel()


def _batch(ds: DetectionSet, indices: list[int], images: np.ndarray,
           results: list[tuple[np.ndarray, np.ndarray]], waited: float) -> Batch:
    return Batch(images, [b for b, _ in results], [c for _, c in results], [ds.images[i] for i in indices], waited)
