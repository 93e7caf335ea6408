"""Image-classification data: an ImageFolder tree and the usual transforms.

``DATA_DIR/<class>/**/<image>``: one folder per class (sorted names are the class order),
images found recursively as the image commands find them (hidden names skipped, extensions
Pillow reads). Every random choice (the epoch's order, each crop and flip) is drawn from a seed
made of the run's seed, the epoch and the image's index, so a batch is the same whichever rank
reads it and whether or not the run was interrupted and resumed.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import MlxnetError
from ..image import is_image_name, load_image, resize_pil



@dataclass(frozen=True)
class Sample:
    path: Path
    label: int


@dataclass(frozen=True)
class ImageFolder:
    classes: tuple[str, ...]
    samples: tuple[Sample, ...]

    def __len__(self) -> int:
        return len(self.samples)


def scan(root: str | os.PathLike) -> ImageFolder:
    """The classes (sub-folders, sorted) and their images under ``root``."""
    root = Path(root)
    if not root.is_dir():
        raise MlxnetError(f"{root}: not a folder (expected one sub-folder of images per class)")
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if len(classes) < 2:
        raise MlxnetError(f"{root}: found {len(classes)} class folder(s); a classifier needs at least 2 "
                          "(layout: DATA_DIR/<class>/<image>)")
    samples = []
    for label, name in enumerate(classes):
        files = sorted(Path(dirpath, f) for dirpath, dirs, names in os.walk(root / name)
                       for f in names if is_image_name(f) and not _hidden_below(root / name, dirpath))
        if not files:
            raise MlxnetError(f"{root / name}: class folder without images")
        samples += [Sample(f, label) for f in files]
    return ImageFolder(tuple(classes), tuple(samples))


def _hidden_below(top: Path, dirpath: str) -> bool:
    return any(part.startswith(".") for part in Path(dirpath).relative_to(top).parts)


def split(data: ImageFolder, fraction: float, seed: int) -> tuple[ImageFolder, ImageFolder]:
    """(train, validation): ``fraction`` of each class (at least one image, and at least one
    left to train on), chosen by ``seed``."""
    if not 0 < fraction < 1:
        raise MlxnetError(f"--val-split must be between 0 and 1 (exclusive), got {fraction}")
    rng = np.random.default_rng(seed)
    train, val = [], []
    for label in range(len(data.classes)):
        members = [s for s in data.samples if s.label == label]
        if len(members) < 2:
            raise MlxnetError(f"class {data.classes[label]!r} has {len(members)} image: "
                              "cannot hold one out for validation")
        order = rng.permutation(len(members))
        k = min(max(1, round(fraction * len(members))), len(members) - 1)
        val += [members[i] for i in sorted(order[:k])]
        train += [members[i] for i in sorted(order[k:])]
    return ImageFolder(data.classes, tuple(train)), ImageFolder(data.classes, tuple(val))


def same_classes(train: ImageFolder, val: ImageFolder, val_root: str | os.PathLike) -> None:
    if val.classes != train.classes:
        raise MlxnetError(f"{val_root}: classes {list(val.classes)} differ from the training folder's "
                          f"{list(train.classes)}")


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    return np.random.default_rng((seed, epoch, index))


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The training order of epoch ``epoch``: the same permutation on every rank."""
    return np.random.default_rng((seed, epoch, 2**31 - 1)).permutation(n)


def normalise(pixels: np.ndarray) -> np.ndarray:
    """ImageNet's mean and deviation, as the classify command's preprocessing."""
    from ..models.resnet import IMAGENET_MEAN, IMAGENET_STD

    mean, std = np.array(IMAGENET_MEAN, np.float32), np.array(IMAGENET_STD, np.float32)
    return (pixels.astype(np.float32) / 255.0 - mean) / std


def random_resized_crop(image: np.ndarray, size: int, rng: np.random.Generator,
                        scale: tuple[float, float] = (0.08, 1.0),
                        ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> np.ndarray:
    """A random part of the image (area ``scale`` of it, aspect ``ratio``), resized to size²:
    torchvision's RandomResizedCrop rule (ten tries, then the centre crop it falls back to)."""
    h, w = image.shape[:2]
    area = h * w
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
        cw, ch = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < cw <= w and 0 < ch <= h:
            top, left = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
            return resize_pil(image[top:top + ch, left:left + cw], (size, size))
    short = min(h, w)
    top, left = (h - short) // 2, (w - short) // 2
    return resize_pil(image[top:top + short, left:left + short], (size, size))


def train_image(sample: Sample, size: int, rng: np.random.Generator) -> np.ndarray:
    """Random resized crop, horizontal flip half the time, ImageNet normalisation: (size, size, 3)."""
    pixels = random_resized_crop(load_image(sample.path), size, rng)
    if rng.random() < 0.5:
        pixels = pixels[:, ::-1]
    return normalise(pixels)


def eval_image(sample: Sample, size: int) -> np.ndarray:
    """Resize the short side to size·256/224, centre crop: the classify command's preprocessing."""
    from ..models.resnet import preprocess

    return np.array(preprocess(load_image(sample.path), resize=round(size * 256 / 224), crop=size))[0]


def batch_of(data: ImageFolder, indices: Sequence[int], size: int, *, epoch: int | None,
             seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, size, size, 3) and labels (N,) of ``indices``: augmented for an epoch, else
    the evaluation transform."""
    samples = [data.samples[i] for i in indices]
    if epoch is None:
        images = [eval_image(s, size) for s in samples]
    else:
        images = [train_image(s, size, sample_rng(seed, epoch, i)) for s, i in zip(samples, indices)]
    return np.stack(images), np.array([s.label for s in samples], np.int32)
