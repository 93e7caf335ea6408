"""COCO-format detection datasets (an ``instances_*.json`` and its image folder), for validation.

The JSON holds ``images`` (``id``, ``file_name``), ``annotations`` (``image_id``, ``category_id``,
``bbox`` as x, y, w, h in pixels, optional ``iscrowd``) and ``categories`` (``id``, ``name``).
For a segment or pose model an annotation's ``segmentation`` (polygons, or run-length encoded as
pycocotools writes it), ``keypoints`` (x, y, v per keypoint) and ``area`` are read as well, as
COCOeval's ``segm`` and ``keypoints`` evaluations read them: an annotation without a
segmentation is its box, one without keypoints has none visible, one without an area is given
its box's area × 0.53 (ultralytics' stand-in for a person's area).
Category ids are mapped to a model's class indices by name (:func:`class_map`): COCO's own ids
(1..90, with gaps) are not the 0..79 a YOLO checkpoint predicts.

The images are found where people put them (:func:`image_folder`): given ``--images``, there;
else the first of these folders that holds the first image: for ``annotations/instances_val2017.json``
``../images/val2017`` (ultralytics' layout), ``../val2017`` (COCO's download), then ``val2017``,
``images`` and the JSON's own folder.

Crowd annotations (``iscrowd: 1``) are left out, as ultralytics' COCO converter leaves them out:
pycocotools instead ignores the detections that fall on them, so on a file with crowd regions
``--metric coco`` counts those detections as false positives where COCOeval would not.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from mlxnet.errors import MlxnetError
from mlxnet.evaluation.instances import AREA_FROM_BOX, coco_polygon_mask, coco_rle_decode

# An annotation's segmentation as read: polygons (each (P, 2) in pixels), an RLE dict
# ({"size": [h, w], "counts": str or list}), or None (no segmentation: its box).
Segment = list[np.ndarray] | dict | None


@dataclass(frozen=True)
class CocoImage:
    """One image of the file: its COCO id, where it lies, and its (non-crowd) objects."""

    id: int
    path: Path
    boxes: np.ndarray  # (N, 4) xyxy in pixels
    categories: np.ndarray  # (N,) COCO category ids
    segments: list[Segment] = field(default_factory=list)  # per object: polygons, an RLE, or None (its box)
    keypoints: np.ndarray | None = None  # (N, P, 3), where the file has keypoints
    areas: np.ndarray | None = None  # (N,) the annotations' areas (box area × 0.53 where one gives none)

    def masks(self, image_hw: tuple[int, int]) -> list[np.ndarray]:
        """Each object's bool (H, W) mask as pycocotools makes it from the file: its polygons
        filled (its box, where it has none), or its run-length mask (which must be the image's
        size)."""
        out = []
        for i, (segment, box) in enumerate(zip(self.segments, self.boxes)):
            where = f"{self.path}: object {i}'s segmentation"
            if isinstance(segment, dict):
                size = tuple(segment["size"])
                if size != tuple(image_hw):
                    raise MlxnetError(f"{where} is a {size[1]}x{size[0]} run-length mask, the image "
                                      f"{image_hw[1]}x{image_hw[0]}")
                out.append(coco_rle_decode(segment, where))
            else:
                x1, y1, x2, y2 = box
                corners = np.array([[x1, y1], [x1, y2], [x2, y2], [x2, y1]])  # pycocotools' box polygon
                out.append(coco_polygon_mask(segment if segment is not None else [corners], image_hw))
        return out


@dataclass(frozen=True)
class CocoDataset:
    json: Path
    images: list[CocoImage]
    categories: dict[int, str]  # COCO category id -> name, in the file's order
    crowd: int = 0  # crowd annotations left out
    by_path: dict[str, CocoImage] = field(default_factory=dict, repr=False)


def is_coco(data: str | Path) -> bool:
    """Whether ``mlxnet val detect DATA`` names a COCO file (a .json) rather than a YOLO dataset."""
    return Path(data).suffix.lower() == ".json"


def _read(json_file: Path) -> dict:
    if not json_file.is_file():
        raise MlxnetError(f"{json_file}: no such COCO annotations file")
    try:
        spec = json.loads(json_file.read_bytes())
    except json.JSONDecodeError as e:
        raise MlxnetError(f"{json_file}: not valid JSON (line {e.lineno}: {e.msg})") from None
    except UnicodeDecodeError:
        raise MlxnetError(f"{json_file}: not valid JSON (not UTF-8 text)") from None
    if not isinstance(spec, dict):
        raise MlxnetError(f"{json_file}: expected a JSON object with 'images', 'annotations' and 'categories'")
    for key in ("images", "annotations", "categories"):
        if not isinstance(spec.get(key), list):
            problem = "missing key" if key not in spec else "expected a list at key"
            raise MlxnetError(f"{json_file}: {problem} '{key}'")
    return spec


def _field(record: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``record[key]`` of type ``kind``, or a one-line error naming the file, the record and the key."""
    if not isinstance(record, dict):
        raise MlxnetError(f"{where}: expected an object, got {type(record).__name__}")
    if key not in record:
        raise MlxnetError(f"{where}: missing key '{key}'")
    value = record[key]
    # bool is an int in Python; an id of `true` is a mistake, not 1.
    if not isinstance(value, kind) or isinstance(value, bool):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise MlxnetError(f"{where}: key '{key}' must be {names}, got {json.dumps(value)[:40]}")
    return value


def _categories(spec: dict, json_file: Path) -> dict[int, str]:
    found: dict[int, str] = {}
    for i, record in enumerate(spec["categories"]):
        where = f"{json_file}: categories[{i}]"
        cid, name = _field(record, "id", int, where), _field(record, "name", str, where)
        if cid in found:
            raise MlxnetError(f"{where}: key 'id' {cid} is category '{found[cid]}'s already")
        found[cid] = name
    if not found:
        raise MlxnetError(f"{json_file}: key 'categories' is an empty list")
    names = list(found.values())
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # mapped by name: two ids of one name could not be told apart
        raise MlxnetError(f"{json_file}: key 'categories' names {twice[0]!r} twice")
    return found


def _finite(value: Any) -> bool:
    """A JSON number (not a bool: ``true`` is a mistake, not 1) that is finite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _box(record: dict, where: str) -> list[float]:
    bbox = _field(record, "bbox", list, where)
    if len(bbox) != 4 or not all(_finite(v) for v in bbox):
        raise MlxnetError(f"{where}: key 'bbox' must be 4 finite numbers [x, y, w, h], got {json.dumps(bbox)[:60]}")
    x, y, w, h = (float(v) for v in bbox)
    if w < 0 or h < 0:
        raise MlxnetError(f"{where}: key 'bbox' has a negative width or height: {json.dumps(bbox)}")
    return [x, y, x + w, y + h]


def _segment(record: dict, where: str) -> Segment:
    """The annotation's ``segmentation``: polygons ``[[x1, y1, x2, y2, ...], ...]`` (3 points or
    more each) or an RLE ``{"size": [h, w], "counts": ...}``; None when it has none."""
    value = record.get("segmentation")
    if value is None or value == []:
        return None
    if isinstance(value, dict):
        size, counts = value.get("size"), value.get("counts")
        if (not isinstance(size, list) or len(size) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in size)):
            raise MlxnetError(f"{where}: key 'segmentation' run-length 'size' must be [height, width], "
                              f"got {json.dumps(size)[:40]}")
        if not isinstance(counts, (str, list)):
            raise MlxnetError(f"{where}: key 'segmentation' run-length 'counts' must be a string or a list")
        return {"size": size, "counts": counts}
    if not isinstance(value, list) or not all(isinstance(p, list) for p in value):
        raise MlxnetError(f"{where}: key 'segmentation' must be polygons [[x1, y1, x2, y2, ...], ...] or "
                          f"run-length {{size, counts}}, got {json.dumps(value)[:40]}")
    polygons = []
    for p in value:
        if len(p) < 6 or len(p) % 2 or not all(_finite(v) for v in p):
            raise MlxnetError(f"{where}: key 'segmentation' has a polygon that is not 3 or more x, y pairs of "
                              f"finite numbers: {json.dumps(p)[:60]}")
        polygons.append(np.array(p, np.float64).reshape(-1, 2))
    return polygons


def _keypoints(record: dict, where: str, count: int | None) -> np.ndarray | None:
    """The annotation's ``keypoints`` [x1, y1, v1, ...] as (P, 3); None when it has none. Every
    annotation of a file has as many (``count``: the first's)."""
    value = record.get("keypoints")
    if value is None:
        return None
    if (not isinstance(value, list) or not value or len(value) % 3
            or not all(_finite(v) for v in value)):
        raise MlxnetError(f"{where}: key 'keypoints' must be x, y, visibility triples of finite numbers, "
                          f"got {json.dumps(value)[:60]}")
    if count is not None and len(value) // 3 != count:
        raise MlxnetError(f"{where}: key 'keypoints' has {len(value) // 3} keypoints, the file's first annotation "
                          f"with keypoints {count}")
    return np.array(value, np.float64).reshape(-1, 3)


def _area(record: dict, where: str) -> float | None:
    value = record.get("area")
    if value is None:
        return None
    if not _finite(value) or value < 0:
        raise MlxnetError(f"{where}: key 'area' must be a number >= 0, got {json.dumps(value)[:40]}")
    return float(value)


def image_folder(json_file: Path, first: str, images: Path | None = None) -> Path:
    """The folder that ``file_name``s are relative to (see the module's doc); ``first``: the
    first image's ``file_name``, which must be there."""
    if images is not None:
        if not images.is_dir():
            raise MlxnetError(f"{images}: --images names no folder")
        return images
    split = json_file.stem.split("_", 1)[1] if json_file.stem.startswith("instances_") else None
    here, above = json_file.parent, json_file.parent.parent
    candidates = ([above / "images" / split, above / split, here / split] if split else []) + \
                 [above / "images", here / "images", here]
    for folder in candidates:
        if (folder / first).is_file():
            return folder
    looked = ", ".join(str(c) for c in dict.fromkeys(candidates))
    raise MlxnetError(f"{json_file}: cannot find its first image {first!r} (looked in {looked}); "
                      "give the image folder with --images DIR")


def load(json_file: str | Path, images: Path | None = None) -> CocoDataset:
    """The images of a COCO instances file with their objects; errors name the file and key."""
    json_file = Path(json_file)
    spec = _read(json_file)
    categories = _categories(spec, json_file)
    records: list[tuple[int, str]] = []
    seen_ids: set[int] = set()
    seen_files: dict[str, int] = {}
    for i, record in enumerate(spec["images"]):
        where = f"{json_file}: images[{i}]"
        iid, name = _field(record, "id", int, where), _field(record, "file_name", str, where)
        if iid in seen_ids:
            raise MlxnetError(f"{where}: key 'id' {iid} appears twice")
        if name in seen_files:
            raise MlxnetError(f"{where}: key 'file_name' {name!r} is image {seen_files[name]}'s already")
        seen_ids.add(iid)
        seen_files[name] = iid
        records.append((iid, name))
    if not records:
        raise MlxnetError(f"{json_file}: key 'images' is an empty list")
    boxes: dict[int, list[list[float]]] = {iid: [] for iid, _ in records}
    cats: dict[int, list[int]] = {iid: [] for iid, _ in records}
    segments: dict[int, list[Segment]] = {iid: [] for iid, _ in records}
    points: dict[int, list[np.ndarray | None]] = {iid: [] for iid, _ in records}
    areas: dict[int, list[float]] = {iid: [] for iid, _ in records}
    keypoint_count: int | None = None
    crowd = 0
    for i, record in enumerate(spec["annotations"]):
        where = f"{json_file}: annotations[{i}]"
        iid = _field(record, "image_id", int, where)
        cid = _field(record, "category_id", int, where)
        if iid not in boxes:
            raise MlxnetError(f"{where}: key 'image_id' {iid} is no image of the file")
        if cid not in categories:
            raise MlxnetError(f"{where}: key 'category_id' {cid} is no category of the file")
        box = _box(record, where)
        if record.get("iscrowd", 0):
            crowd += 1
            continue
        boxes[iid].append(box)
        cats[iid].append(cid)
        segments[iid].append(_segment(record, where))
        kp = _keypoints(record, where, keypoint_count)
        keypoint_count = len(kp) if kp is not None else keypoint_count
        points[iid].append(kp)
        area = _area(record, where)
        areas[iid].append((box[2] - box[0]) * (box[3] - box[1]) * AREA_FROM_BOX if area is None else area)
    folder = image_folder(json_file, records[0][1], images)

    def keypoints_of(iid: int) -> np.ndarray | None:
        if keypoint_count is None:
            return None
        return np.array([np.zeros((keypoint_count, 3)) if p is None else p for p in points[iid]],
                        np.float64).reshape(-1, keypoint_count, 3)

    found = [CocoImage(iid, folder / name, np.array(boxes[iid], np.float64).reshape(-1, 4),
                       np.array(cats[iid], np.int64), segments[iid], keypoints_of(iid),
                       np.array(areas[iid], np.float64)) for iid, name in records]
    return CocoDataset(json_file, found, categories, crowd, {str(image.path): image for image in found})


def class_map(dataset: CocoDataset, model_names: Sequence[str]) -> dict[int, int]:
    """COCO category id -> the model's class index, by name; every category must be a class."""
    index = {name: i for i, name in enumerate(model_names)}
    missing = [name for name in dataset.categories.values() if name not in index]
    if missing:
        shown = ", ".join(repr(n) for n in missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        model = ", ".join(model_names[:5]) + (", ..." if len(model_names) > 5 else "")
        raise MlxnetError(f"{dataset.json}: categor{'ies' if len(missing) > 1 else 'y'} {shown} not among the "
                          f"model's {len(model_names)} class names ({model})")
    return {cid: index[name] for cid, name in dataset.categories.items()}
