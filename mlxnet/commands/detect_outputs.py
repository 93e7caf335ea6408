"""What `mlxnet detect` writes besides the labelled copy: ultralytics' ``classes=``, ``save_txt``,
``save_conf`` and ``save_crop``.

Layout, below the output folder (``-o``; in the one-file form ``-o out.jpg``, that file's folder),
each image keyed by its labelled copy's path there without the extension (``sub/bus``):

- ``labels/<key>.txt`` (``--save-txt``): YOLO labels, one line per detection,
  ``class cx cy w h`` normalised to [0, 1] by the image's width and height (ultralytics' ``xywhn``,
  ``%g`` numbers), then the score with ``--save-conf``. An image without detections gets an empty
  file (ultralytics writes none), so a rerun never leaves an earlier run's labels beside it.
- ``crops/<class name>/<key>.jpg``, ``<key>_2.jpg``... (``--save-crop``): each detection cut out as
  ultralytics' ``save_one_box`` does (box ×1.02 + 10 pixels, clipped), in score order. Crops
  an earlier run wrote beyond this run's count stay.

Every file is written atomically and never over an input or another output of the run: label
paths are checked before any work, like the labelled copies; a crop, named only once its image
is detected, is checked when it is written, and a clash fails that image.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from glob import escape as glob_escape
from pathlib import Path
from typing import Sequence

import numpy as np

from mlxnet.commands.images import Job, file_id
from mlxnet.errors import MlxnetError

CROP_GAIN, CROP_PAD = 1.02, 10  # ultralytics' save_one_box defaults
_UNSAFE_IN_FOLDER_NAME = re.compile(r"[/\\\x00-\x1f\x7f]")


# --- --classes -------------------------------------------------------------------------------------

def resolve_classes(specs: Sequence[str], names: Sequence[str]) -> list[int]:
    """Class ids from ``--classes`` values, each a comma-separated list of ids (``0,2``) or names
    (``person,bus``; exact, else the one name equal ignoring case), in the order given, each once.
    Anything else is one line listing the valid ids and names."""
    ids: list[int] = []
    tokens = [t.strip() for spec in specs for t in spec.split(",") if t.strip()]
    if not tokens:
        raise MlxnetError("--classes: no class given; " + _valid(names))
    for token in tokens:
        found = _class_id(token, names)
        if found is None:
            raise MlxnetError(f"--classes: unknown class {token!r}; " + _valid(names))
        if found not in ids:
            ids.append(found)
    return ids


def _class_id(token: str, names: Sequence[str]) -> int | None:
    if token.isdigit():  # ids, as ultralytics' classes=[0, 2] takes them
        return int(token) if int(token) < len(names) else None
    if token in names:
        return list(names).index(token)
    folded = [i for i, name in enumerate(names) if name.casefold() == token.casefold()]
    return folded[0] if len(folded) == 1 else None


def _valid(names: Sequence[str]) -> str:
    return f"valid: ids 0-{len(names) - 1} or names {', '.join(names)}"


# --- Layout ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Extras:
    """One image's extra outputs: its label file (or None) and the key its crops are named by
    (or None)."""

    labels: Path | None
    crops_key: Path | None


def output_base(output: Path, one_file: bool) -> Path:
    """The folder that holds ``labels/`` and ``crops/``: ``-o``, or in the one-file form its folder."""
    return output.parent if one_file else output


def plan_extras(jobs: Sequence[Job], base: Path, save_txt: bool, save_crop: bool) -> dict[Job, Extras]:
    """Each job's extra outputs, keyed by its labelled copy's path below ``base``. Two images
    with one key (``bus.jpg`` and ``bus.png`` in one folder) would write the same labels or
    crops: refused before any work, as two labelled copies of one name are."""
    plans: dict[Job, Extras] = {}
    owner: dict[str, Job] = {}
    for job in jobs:
        key = Path(os.path.relpath(job.outputs[0], base)).with_suffix("")
        labels = base / "labels" / f"{key}.txt" if save_txt else None
        first = owner.setdefault(os.path.normcase(str(key)), job)
        if first is not job and (save_txt or save_crop):
            what = labels if labels is not None else base / "crops" / "*" / f"{key}*.jpg"
            raise MlxnetError(f"{first.name} and {job.name} would both write {what}; "
                              "rename one or run them separately")
        plans[job] = Extras(labels, key if save_crop else None)
    return plans


def _key(path: Path) -> str:
    return os.path.normcase(os.path.realpath(path))


class Guard:
    """The run's inputs and planned outputs, which no extra output may replace."""

    def __init__(self, jobs: Sequence[Job], plans: dict[Job, Extras]) -> None:
        self.inputs = {found: path for job in jobs for path in job.reads
                       if (found := file_id(path)) is not None}
        self.planned = {_key(out) for job in jobs for out in job.outputs}
        self.planned |= {_key(extra.labels) for extra in plans.values() if extra.labels is not None}

    def refuse(self, what: str, path: Path, planned_here: bool = False) -> None:
        """One-line MlxnetError if writing ``path`` (``what``: "its crop") would replace an input
        (any name for the same file), or another planned output (unless ``path`` is one of them)."""
        clash = self.inputs.get(file_id(path))  # type: ignore[arg-type]
        if clash is not None:
            raise MlxnetError(f"{what} {path} would overwrite the input {clash}; choose another output folder")
        if not planned_here and _key(path) in self.planned:
            raise MlxnetError(f"{what} {path} would overwrite another output of this run; "
                              "choose another output folder")


def check_extras(plans: dict[Job, Extras], base: Path, guard: Guard) -> None:
    """Before any work: every label path (writable folder, never an input), and the crops folder."""
    from mlxnet.image import check_output_path

    for extra in plans.values():
        if extra.labels is not None:
            guard.refuse("labels file", extra.labels, planned_here=True)
            check_output_path(extra.labels, kind="file")
    if any(extra.crops_key is not None for extra in plans.values()):
        check_output_path(base / "crops" / "class" / "image.jpg")


# --- Writing ---------------------------------------------------------------------------------------

def _corners(box: np.ndarray, width: int, height: int) -> tuple[float, float, float, float]:
    """xyxy in order (untrained weights may give x2 < x1) and clipped to the image."""
    x1, x2 = sorted((float(box[0]), float(box[2])))
    y1, y2 = sorted((float(box[1]), float(box[3])))
    return (min(max(x1, 0.0), width), min(max(y1, 0.0), height),
            min(max(x2, 0.0), width), min(max(y2, 0.0), height))


def label_lines(det, width: int, height: int, save_conf: bool) -> str:
    """YOLO label text, normalised, one detection per line, as ultralytics' ``save_txt``:
    ``class cx cy w h [score]``; a segment model's ``class x1 y1 x2 y2 ... [score]`` (its mask's
    outline; a mask whose outline has fewer than 3 points has no line); a pose model's box
    followed by each keypoint's ``x y`` (and visibility)."""
    outlines = det.outlines() if getattr(det, "masks", None) is not None else None
    points = getattr(det, "keypoints", None)
    lines = []
    for i, (box, score, cls) in enumerate(zip(det.boxes, det.scores, det.classes)):
        x1, y1, x2, y2 = _corners(box, width, height)
        values = [(x1 + x2) / 2 / width, (y1 + y2) / 2 / height, (x2 - x1) / width, (y2 - y1) / height]
        if outlines is not None:
            if len(outlines[i]) < 3:
                continue
            values = list((outlines[i] / [width, height]).reshape(-1))
        if points is not None:
            kp = points[i].astype(np.float64)
            kp[:, :2] /= [width, height]
            values += list(kp.reshape(-1))
        if save_conf:
            values.append(float(score))
        lines.append(" ".join([str(int(cls))] + [f"{v:g}" for v in values]))
    return "".join(line + "\n" for line in lines)


def crop(image: np.ndarray, box: np.ndarray) -> np.ndarray:
    """The box cut out of the image with ultralytics' save_one_box margin: the box's width and
    height times 1.02 plus 10 pixels about its centre, truncated to whole pixels, clipped."""
    height, width = image.shape[:2]
    x1, y1, x2, y2 = _corners(box, width, height)
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
    half_w, half_h = ((x2 - x1) * CROP_GAIN + CROP_PAD) / 2, ((y2 - y1) * CROP_GAIN + CROP_PAD) / 2
    left, top = max(int(cx - half_w), 0), max(int(cy - half_h), 0)  # int(): torch's .long() truncation
    right, bottom = min(int(cx + half_w), width), min(int(cy + half_h), height)
    return image[top:bottom, left:right]


def folder_name(name: str, class_id: int) -> str:
    """A class name as one folder name: separators and control characters replaced by ``_``,
    no leading or trailing dots or blanks (no ``..``, no hidden folder); ``class<N>`` if empty."""
    safe = _UNSAFE_IN_FOLDER_NAME.sub("_", name).strip(". ")
    return safe or f"class{class_id}"


class ExtraOutputs:
    """The run's labels and crops: planned and checked when made (before any work), written
    per image by :meth:`write`; nothing at all when neither is asked for."""

    def __init__(self, jobs: Sequence[Job], output: Path, one_file: bool, *, save_txt: bool, save_conf: bool,
                 save_crop: bool) -> None:
        if save_conf and not save_txt:
            raise MlxnetError("--save-conf adds scores to the --save-txt label files; add --save-txt")
        self.base = output_base(output, one_file)
        self.save_conf = save_conf
        self.plans = plan_extras(jobs, self.base, save_txt, save_crop) if save_txt or save_crop else {}
        self.guard = Guard(jobs, self.plans) if self.plans else None
        if self.guard is not None:
            check_extras(self.plans, self.base, self.guard)

    def write(self, job: Job, image: np.ndarray, det) -> dict:
        """Write ``job``'s labels and crops; returns what its JSON record adds (the paths)."""
        if self.guard is None:
            return {}
        return write_extras(self.plans[job], self.base, image, det, self.save_conf, self.guard,
                            source=job.source.path)

    @staticmethod
    def summary(written: dict) -> list[str]:
        """What the text line adds: ``labels PATH``, ``N crops``."""
        return ([f"labels {written['labels']}"] if "labels" in written else []) + \
            ([f"{len(written['crops'])} crops"] if "crops" in written else [])


def _remove_earlier_crops(crops: Path, key: Path, guard: Guard) -> None:
    """Remove the crops an earlier run wrote for this image (``KEY.jpg``, ``KEY_N.jpg`` in any
    class folder), so that the folder holds this run's detections only, not a mix of both."""
    if not crops.is_dir():
        return
    pattern = re.compile(re.escape(key.name) + r"(_\d+)?\.jpg")
    for folder in crops.iterdir():
        place = folder / key.parent
        if not place.is_dir():
            continue
        for old in place.glob(f"{glob_escape(key.name)}*.jpg"):
            if pattern.fullmatch(old.name) and file_id(old) not in guard.inputs:  # never an input of this run
                old.unlink()


def write_extras(extra: Extras, base: Path, image: np.ndarray, det, save_conf: bool, guard: Guard,
                 source: Path | None = None) -> dict:
    """Write one image's labels and crops (JPEG at ``source``'s quality, the image's file);
    returns what the JSON record adds (paths written)."""
    from mlxnet.image import atomic_write_bytes, save_image

    record: dict = {}
    height, width = image.shape[:2]
    if extra.labels is not None:
        atomic_write_bytes(extra.labels, label_lines(det, width, height, save_conf).encode())
        record["labels"] = str(extra.labels)
    if extra.crops_key is not None:
        _remove_earlier_crops(base / "crops", extra.crops_key, guard)
        written: list[str] = []
        count: dict[str, int] = {}
        for box, cls in zip(det.boxes, det.classes):
            pixels = crop(image, box)
            if not pixels.size:  # a box wholly outside the image
                continue
            folder = folder_name(det.names[int(cls)], int(cls))
            count[folder] = n = count.get(folder, 0) + 1
            target = base / "crops" / folder / f"{extra.crops_key}{'' if n == 1 else f'_{n}'}.jpg"
            guard.refuse("its crop", target)
            save_image(np.ascontiguousarray(pixels), target, source=source)
            written.append(str(target))
        record["crops"] = written
    return record
