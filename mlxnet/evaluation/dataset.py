"""YOLO-format datasets as ultralytics reads them, for validation (and training).

``data.yaml`` (or a folder holding it) names ``names`` (a list, or {id: name}), ``val`` (a folder
searched recursively for images, a .txt file of image paths, or a list of those), ``train`` (the
same, for training) and optionally ``path``, the root the others are relative to (default: the
yaml's folder; a relative ``path`` is relative to the yaml's folder too). An image's labels are
the .txt file found by replacing the last ``/images/`` of its path with ``/labels/`` and its
extension with ``.txt``: one object a line, ``class cx cy w h`` normalised to 0-1 (a polygon
``class x1 y1 x2 y2 ...`` counts as its bounding box). A missing label file is an image without
objects, as in ultralytics.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlxnet.errors import MlxnetError
from mlxnet.image import is_image_name


@dataclass(frozen=True)
class Dataset:
    """The images of one split (in sorted order per source), the class names and, for a pose
    dataset, its keypoint shape (``kpt_shape``: keypoints, 2 or 3 values each)."""

    yaml: Path
    images: list[Path]
    names: tuple[str, ...]
    kpt_shape: tuple[int, int] | None = None


@dataclass
class Instances:
    """One image's objects in its pixels: boxes (N, 4) xyxy, classes (N,); each one's shape for
    mask metrics (a polygon (P, 2), a COCO object's mask, or None for a box line: see
    :func:`mlxnet.evaluation.instances.polygon_masks`), pose labels' keypoints (N, P, dims) and,
    where the labels give them, the objects' areas (COCO's ``area``, OKS's scale)."""

    boxes: np.ndarray
    classes: np.ndarray
    polygons: list[np.ndarray | None]
    keypoints: np.ndarray | None = None
    areas: np.ndarray | None = None


def _names(value: object, yaml_file: Path) -> tuple[str, ...]:
    if isinstance(value, list) and value:
        return tuple(str(n) for n in value)
    if isinstance(value, dict) and value:
        try:
            ids = sorted(int(k) for k in value)
        except (TypeError, ValueError):
            raise MlxnetError(f"{yaml_file}: 'names' keys must be class ids 0, 1, ...") from None
        if ids != list(range(len(ids))):
            raise MlxnetError(f"{yaml_file}: 'names' ids must be 0..{len(ids) - 1} without gaps")
        return tuple(str(value[k] if k in value else value[str(k)]) for k in ids)
    raise MlxnetError(f"{yaml_file}: 'names' must be a non-empty list or {{id: name}} mapping")


def _images_of(entry: str, root: Path, yaml_file: Path, split: str) -> list[Path]:
    path = Path(entry) if os.path.isabs(entry) else root / entry
    if path.is_dir():
        found = sorted(p for p in path.rglob("*") if p.is_file() and is_image_name(p.name)
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not found:
            raise MlxnetError(f"{path}: no images in this '{split}' folder (from {yaml_file})")
        return found
    if path.suffix == ".txt" and path.is_file():
        lines = [line.strip() for line in path.read_text().splitlines()]
        # Relative lines are relative to the list's folder (ultralytics: those starting with ./).
        return [Path(line) if os.path.isabs(line) else path.parent / line for line in lines if line]
    raise MlxnetError(f"{path}: '{split}' names no folder or .txt list of images (from {yaml_file})")


def load(data: str | Path, split: str = "val") -> Dataset:
    """The ``split`` ('val', or 'train') of the dataset that ``data`` (a data.yaml, or a folder
    holding one) describes."""
    import yaml

    yaml_file = Path(data)
    if yaml_file.is_dir():
        yaml_file = yaml_file / "data.yaml"
    if not yaml_file.is_file():
        raise MlxnetError(f"{yaml_file}: no such dataset file (a data.yaml, or a folder holding one)")
    try:
        spec = yaml.safe_load(yaml_file.read_text())
    except yaml.YAMLError as e:
        raise MlxnetError(f"{yaml_file}: not valid YAML ({' '.join(str(e).split())})") from None
    if not isinstance(spec, dict):
        raise MlxnetError(f"{yaml_file}: expected a mapping with '{split}' and 'names'")
    missing = [key for key in (split, "names") if spec.get(key) in (None, "", [])]
    if missing:
        raise MlxnetError(f"{yaml_file}: missing key{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    root = Path(str(spec.get("path") or "."))
    root = root if root.is_absolute() else yaml_file.parent / root
    entries = spec[split] if isinstance(spec[split], list) else [spec[split]]
    images = [image for entry in entries for image in _images_of(str(entry), root, yaml_file, split)]
    kpt_shape = spec.get("kpt_shape")
    if kpt_shape is not None:
        if (not isinstance(kpt_shape, list) or len(kpt_shape) != 2 or not all(isinstance(v, int) for v in kpt_shape)
                or kpt_shape[0] < 1 or kpt_shape[1] not in (2, 3)):
            raise MlxnetError(f"{yaml_file}: kpt_shape must be [keypoints, 2 or 3], got {kpt_shape!r}")
        kpt_shape = tuple(kpt_shape)
    return Dataset(yaml_file, images, _names(spec["names"], yaml_file), kpt_shape)


def label_path(image: Path) -> Path:
    """ultralytics' img2label_paths: the last /images/ becomes /labels/, the extension .txt."""
    text = str(image)
    marker = f"{os.sep}images{os.sep}"
    if marker in text:
        head, tail = text.rsplit(marker, 1)
        text = f"{head}{os.sep}labels{os.sep}{tail}"
    return Path(os.path.splitext(text)[0] + ".txt")


def read_labels(image: Path, width: int, height: int, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """The image's objects: (N, 4) xyxy boxes in its pixels and (N,) class ids. Errors name the
    label file and line."""
    found = read_instances(image, width, height, classes)
    return found.boxes, found.classes


def read_instances(image: Path, width: int, height: int, classes: int,
                   kpt_shape: tuple[int, int] | None = None) -> Instances:
    """The image's objects with their polygons (segment labels) or, given the dataset's
    ``kpt_shape``, their keypoints (pose labels ``class cx cy w h x1 y1 [v1] ...``)."""
    path = label_path(image)
    empty = Instances(np.zeros((0, 4)), np.zeros(0, np.int64), [],
                      None if kpt_shape is None else np.zeros((0, *kpt_shape)))
    if not path.is_file():
        return empty
    boxes, ids, polygons, points = [], [], [], []
    pose_fields = None if kpt_shape is None else 5 + kpt_shape[0] * kpt_shape[1]
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        where = f"{path}:{number}"
        if pose_fields is not None and len(fields) != pose_fields:
            raise MlxnetError(f"{where}: expected 'class cx cy w h' and {kpt_shape[0]} keypoints of {kpt_shape[1]} "
                              f"values ({pose_fields} fields, the dataset's kpt_shape), got {len(fields)}")
        if pose_fields is None and len(fields) != 5 and (len(fields) < 7 or len(fields) % 2 == 0):
            raise MlxnetError(f"{where}: expected 'class cx cy w h' (or a polygon 'class x1 y1 x2 y2 ...'), "
                              f"got {len(fields)} fields")
        try:
            values = [float(v) for v in fields[1:]]
            cls = int(fields[0])
        except ValueError:
            raise MlxnetError(f"{where}: not numbers: {line.strip()!r}") from None
        if not 0 <= cls < classes:
            raise MlxnetError(f"{where}: class {cls} is out of range (the dataset has {classes} names)")
        v = np.array(values)
        coords = v if pose_fields is None else np.concatenate([v[:4], v[4:].reshape(kpt_shape)[:, :2].ravel()])
        if not np.isfinite(v).all() or (v < 0).any() or (coords > 1).any():
            raise MlxnetError(f"{where}: coordinates must be normalised to 0-1")
        if pose_fields is not None or len(fields) == 5:
            cx, cy, w, h = v[:4]
            box = [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]
            polygons.append(None)
            if pose_fields is not None:
                kp = v[4:].reshape(kpt_shape).copy()
                kp[:, 0] *= width
                kp[:, 1] *= height
                points.append(kp)
        else:
            xs, ys = v[0::2], v[1::2]
            box = [xs.min(), ys.min(), xs.max(), ys.max()]
            polygons.append(np.column_stack([xs * width, ys * height]))
        boxes.append(box)
        ids.append(cls)
    if not boxes:
        return empty
    # A line written twice is one object (ultralytics drops duplicate rows too).
    rows = np.unique(np.column_stack([ids, boxes]), axis=0, return_index=True)[1]
    keep = np.sort(rows)
    scaled = np.array([boxes[i] for i in keep]) * np.array([width, height, width, height])
    return Instances(scaled, np.array([ids[i] for i in keep], np.int64), [polygons[i] for i in keep],
                     np.array([points[i] for i in keep]) if pose_fields is not None else None)
