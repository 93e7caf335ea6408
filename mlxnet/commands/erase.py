"""`mlxnet erase`: remove what you point at: SAM selects it, LaMa fills it.

The region of each image is the union of: the points (``--point``, with ``--neg-point`` for
background) as one SAM prompt; each ``--box`` as its own prompt (refined by the background
points); a ``--mask`` file (one for every image, or a folder of masks as ``mlxnet inpaint``
takes); and every instance of each ``--class`` that YOLOv8 finds, each detection's box a SAM
prompt. SAM keeps its best mask by predicted IoU. The region is dilated by ``--dilate`` pixels
and LaMa fills it on a crop around it (:mod:`mlxnet.app.erasing` states the crop and resize
rule); outside the dilated region the output equals the input exactly. An image whose region is
empty (no instance found) is written unchanged and says so.

Outputs follow the grammar: ``-o FILE`` for one image, else a folder mirroring the inputs;
``--save-mask`` also writes the filled (dilated) mask beside each output as ``NAME.mask.png``.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import List, Optional

import numpy as np
import typer

from mlxnet.commands import grammar
from mlxnet.commands.images import Job, check_outputs, expand_inputs, mirror, names_one_file
from mlxnet.commands.pipeline import run_jobs
from mlxnet.errors import MlxnetError

WEIGHTS_METAVAR = "ID|FILE|random"


def model_weights(flag: str, default: str, what: str) -> typer.Option:
    return typer.Option(default, flag, metavar=WEIGHTS_METAVAR,
                        help=f"{what} weights: a hub id, a local file, or 'random' (seeded, to try it offline).")


def parse_region(point: List[str], neg_point: List[str], box: List[str]
                 ) -> tuple[np.ndarray | None, np.ndarray | None, list[list[float]]]:
    """(points (N, 2), labels (N,), boxes): checked once, before any image."""
    pos = [grammar.numbers(p, 2, "--point", "X,Y") for p in point]
    neg = [grammar.numbers(p, 2, "--neg-point", "X,Y") for p in neg_point]
    boxes = [grammar.numbers(b, 4, "--box", "X0,Y0,X1,Y1") for b in box]
    for b, text in zip(boxes, box):
        if not (b[0] < b[2] and b[1] < b[3]):
            raise MlxnetError(f"--box: need X0 < X1 and Y0 < Y1, got {text}")
    if neg and not pos and not boxes:
        raise MlxnetError("--neg-point marks background for a --point or --box; give one of those too")
    if not pos and not neg:
        return None, None, boxes
    points = np.array(pos + neg, np.float64)
    labels = np.array([1] * len(pos) + [0] * len(neg), np.int32)
    return points, labels, boxes


def mask_path(output: Path) -> Path:
    return output.with_name(f"{output.stem}.mask.png")


def erase(
    images: List[str] = grammar.sources(),
    output: str = grammar.output(),
    point: List[str] = typer.Option([], "--point", "-p", metavar="X,Y",
                                    help="A point on what to erase, in pixels (repeatable: one SAM prompt)."),
    neg_point: List[str] = typer.Option([], "--neg-point", metavar="X,Y",
                                        help="A background point (repeatable): refines the points and boxes."),
    box: List[str] = typer.Option([], "--box", "-b", metavar="X0,Y0,X1,Y1",
                                  help="A box around what to erase (repeatable: each its own SAM prompt)."),
    mask: Optional[str] = typer.Option(None, "--mask", metavar="FILE|FOLDER",
                                       help="A mask to erase as well (non-black pixels): one file for every image, "
                                            "or a folder of masks with the images' relative paths."),
    cls: List[str] = typer.Option([], "--class", metavar="NAME",
                                  help="Erase every instance of this class (YOLO finds them, SAM masks each "
                                       "box; a -seg --yolo-weights masks them itself, no SAM); names or ids, "
                                       "comma-separated or repeated."),
    conf: float = typer.Option(0.25, "--conf", min=0.0, max=1.0, help="--class: detection confidence threshold."),
    dilate: int = typer.Option(15, "--dilate", min=0, metavar="PX",
                               help="Grow the region by PX pixels on each side before filling."),
    margin: int = typer.Option(128, "--margin", min=0, metavar="PX",
                               help="Context around the region that LaMa sees (the crop's margin)."),
    max_side: int = typer.Option(1024, "--max-side", min=16, metavar="PX",
                                 help="Resize a larger crop to this long side for LaMa (then back)."),
    save_mask: bool = typer.Option(False, "--save-mask",
                                   help="Also write the filled (dilated) mask beside each output as NAME.mask.png."),
    sam_weights: str = model_weights("--sam-weights", "sam-tiny", "SAM (sam-tiny)"),
    lama_weights: str = model_weights("--lama-weights", "lama", "LaMa"),
    yolo_weights: str = model_weights("--yolo-weights", "yolov8n", "YOLO (--class; a -seg model masks too)"),
    batch: int = grammar.read_ahead(),
    dtype: str = grammar.dtype(),
    device: Optional[str] = grammar.device(),
    as_json: bool = grammar.json_lines(),
) -> None:
    """Erase objects from each SOURCE (points, boxes, masks or classes) and write the result to OUTPUT."""
    grammar.apply_device(device)
    grammar.check_dtype(dtype)
    import mlxnet
    from mlxnet.app import erasing, regions
    from mlxnet.app.models import Models, Weights
    from mlxnet.commands.detect_outputs import resolve_classes
    from mlxnet.commands.inpaint import mask_finder
    from mlxnet.dtypes import computes_in
    from mlxnet.image import load_image, load_mask, save_image

    points, labels, boxes = parse_region(point, neg_point, box)
    if points is None and not boxes and mask is None and not cls:
        raise MlxnetError("say what to erase: --point X,Y, --box X0,Y0,X1,Y1, --mask FILE or --class NAME")
    if mask is not None and not os.path.exists(mask):
        raise MlxnetError(f"--mask {mask}: no such file or folder")
    one_output = names_one_file(images, output)
    sources = expand_inputs(images) if one_output else expand_inputs(images, skip=Path(output))
    one_mask = mask is not None and not os.path.isdir(mask)
    find_mask = mask_finder(Path(mask)) if mask is not None and not one_mask else None
    jobs = []
    for source in sources:
        out = Path(output) if one_output else mirror(source, Path(output))
        reads = (Path(mask),) if one_mask else (find_mask(source),) if find_mask else ()
        jobs.append(Job(source, (out, mask_path(out)) if save_mask else (out,), reads))
    check_outputs(jobs)
    shared_mask = load_mask(mask) > 0 if one_mask else None
    weights = Weights(sam=sam_weights, lama=lama_weights, yolo=yolo_weights, dtype=dtype)
    wanted: list[int] = []

    def load() -> Models:
        models = Models(weights).preload(["lama"] + (["yolo"] if cls else []))
        # SAM masks points, boxes and a detection model's boxes; a segment model masks its own.
        if points is not None or boxes or (cls and models.yolo().net.task != "segment"):
            models.preload(["sam"])
        if cls:
            try:
                wanted.extend(resolve_classes(cls, models.yolo().names))
            except MlxnetError as e:
                raise MlxnetError(str(e).replace("--classes", "--class", 1)) from None
        return models

    def prepare(job: Job) -> tuple[np.ndarray, np.ndarray | None]:
        pixels = load_image(job.source.path)
        size = pixels.shape[:2]
        regions.check_points(points, size, "--point/--neg-point")
        for b in boxes:
            regions.check_box(b, size, "--box")
        region_mask = shared_mask
        if find_mask is not None:
            (mask_file,) = job.also_reads
            if not mask_file.is_file():
                raise MlxnetError(f"no mask {mask_file} for it in the folder of masks")
            region_mask = load_mask(mask_file) > 0
        if region_mask is not None and region_mask.shape != size:
            raise MlxnetError(f"--mask is {region_mask.shape[1]}x{region_mask.shape[0]} but the image is "
                              f"{size[1]}x{size[0]}")
        return pixels, region_mask

    def run(models: Models, item: tuple[np.ndarray, np.ndarray | None]):
        start = time.perf_counter()
        pixels, region_mask = item
        needs_sam = points is not None or boxes or (cls and models.yolo().net.task != "segment")
        region = regions.select(pixels, sam=models.sam() if needs_sam else None,
                                detector=models.yolo() if cls else None, points=points, labels=labels,
                                boxes=boxes, mask=region_mask, classes=wanted or None, conf=conf)
        erased = erasing.erase(models.lama(), pixels, region.mask, dilate_px=dilate, margin=margin,
                               max_side=max_side)
        return region, erased, time.perf_counter() - start

    def finish(job: Job, item, result) -> tuple[dict, str]:
        region, erased, seconds = result
        # nothing erased: the input file itself (its bytes, when the output has its format)
        save_image(erased.image, job.outputs[0], source=job.source.path, unchanged=erased.crop is None)
        if save_mask:
            save_image(erased.mask.astype(np.uint8) * 255, job.outputs[1])
        record = {"output": str(job.outputs[0]), **erased.to_dict(),
                  "scores": [round(s, 4) for s in region.scores], "instances": region.instances,
                  "dtype": computes_in(dtype), "backend": mlxnet.backend(), "seconds": round(seconds, 3)}
        if save_mask:
            record["mask"] = str(job.outputs[1])
        found = f"{len(region.instances)} instance(s); " if cls else ""
        return record, f"{job.name}: {found}{erased.summary()} in {seconds:.2f} s -> {job.outputs[0]}"

    run_jobs(jobs, batch, what="erase", as_json=as_json, load=load, prepare=prepare,
             predict=lambda models, items: [run(models, item) for item in items], finish=finish)
