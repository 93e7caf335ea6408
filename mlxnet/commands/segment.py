"""`mlxnet segment`: Segment Anything (MobileSAM) from point/box prompts, or everything in the image.

For each image, writes an overlay (the image with the mask(s) overlaid, prompts marked) and a
mask: the chosen binary mask (0/255), or with ``--everything`` a label map (0 = background,
i = i-th mask by predicted IoU; 16-bit if there are more than 255). One image: ``-o OUT`` names
the overlay and the mask is OUT's ``.mask`` sibling (``out.png`` → ``out.mask.png``). Several
images, a folder or a pattern: ``-o`` is a folder; each overlay has its input's relative path
and its mask is beside it as ``NAME.mask.png`` (PNG: a mask must not be lossy). The prompts
apply to every image; a point outside an image fails that image only.

``--everything`` takes minutes on a CPU for SAM's 32×32 grid, so it reports its progress over
the grid's points: a bar under the images' bar on a terminal, a plain line on stderr every
:data:`PROGRESS_LINE_EVERY_S` seconds otherwise, nothing under ``--json``.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Sequence

import numpy as np
import typer

from mlxnet import distributed
from mlxnet.commands import grammar
from mlxnet.commands.images import Job, check_outputs, expand_inputs, load_model, mirror, names_one_file
from mlxnet.commands.pipeline import run_jobs
from mlxnet.errors import MlxnetError
from mlxnet.progress import progress_bar

PROGRESS_LINE_EVERY_S = 10.0  # without a terminal: often enough to show it runs, not a line a batch


def parse_prompts(points: Sequence[str], labels: Sequence[int], box: str | None
                  ) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """--point X,Y (repeatable), --label 1|0 (one per point, default 1), --box X1,Y1,X2,Y2: their
    syntax, checked once before any image (:func:`check_points_inside` checks each image)."""
    coords = np.array([grammar.numbers(p, 2, "--point", "X,Y") for p in points], dtype=np.float64).reshape(-1, 2)
    if labels and len(labels) != len(coords):
        raise MlxnetError(f"--label: got {len(labels)} label(s) for {len(coords)} point(s); give one per point")
    if any(v not in (0, 1) for v in labels):
        raise MlxnetError(f"--label: 1 marks foreground, 0 background; got {list(labels)}")
    box_arr = None
    if box is not None:
        box_arr = np.array(grammar.numbers(box, 4, "--box", "X1,Y1,X2,Y2"))
        if not (box_arr[0] < box_arr[2] and box_arr[1] < box_arr[3]):
            raise MlxnetError(f"--box: need X1 < X2 and Y1 < Y2, got {box}")
    if not len(coords):
        return None, None, box_arr
    lab = np.array(labels if labels else [1] * len(coords), dtype=np.int32)
    return coords, lab, box_arr


def check_points_inside(coords: np.ndarray | None, size: tuple[int, int]) -> None:
    """Every point within the image of size (H, W)."""
    h, w = size
    for x, y in coords if coords is not None else []:
        if not (0 <= x <= w and 0 <= y <= h):
            raise MlxnetError(f"--point {x:g},{y:g} lies outside the {w}x{h} image")


@contextmanager
def points_progress(name: str, total: int, quiet: bool) -> Iterator[Callable[[int, int], None]]:
    """--everything's report over one image's ``total`` points, for the mask generator's
    ``progress``: a bar on a terminal (drawn under the images' bar), else a plain line on stderr
    at most every :data:`PROGRESS_LINE_EVERY_S` seconds; nothing when ``quiet`` (--json)."""
    with progress_bar(f"{name}: points", total, quiet=quiet, unit="pt") as bar:
        counted, said = 0, time.monotonic()

        def report(done: int, total: int) -> None:
            nonlocal counted, said
            if bar.drawn:
                bar.advance(count=done - counted)
            elif not quiet and time.monotonic() - said >= PROGRESS_LINE_EVERY_S:
                bar.err(f"{name}: {done}/{total} points")
                said = time.monotonic()
            counted = done

        yield report


def mask_path(output: Path) -> Path:
    """The mask beside a one-image overlay: OUT's ``.mask`` sibling, same format."""
    return output.with_name(f"{output.stem}.mask{output.suffix}")


def segment(
    images: List[str] = grammar.sources(),
    output: str = grammar.output(grammar.OUTPUT_HELP + " Each overlay's mask is beside it as NAME.mask.png."),
    point: List[str] = typer.Option([], "--point", "-p", help="Prompt point X,Y in pixels (repeatable)."),
    label: List[int] = typer.Option([], "--label", "-l", help="1 foreground / 0 background, one per --point "
                                                              "(default: all 1)."),
    box: Optional[str] = typer.Option(None, "--box", "-b", help="Prompt box X1,Y1,X2,Y2 in pixels."),
    everything: bool = typer.Option(False, "--everything", help="Segment everything (point grid) instead."),
    model: Optional[str] = grammar.model("sam-tiny", "sam-tiny"),
    weights: Optional[str] = grammar.weights("sam-tiny's weights from the hub; files: MobileSAM's mobile_sam.pt "
                                             "or safetensors"),
    multimask: Optional[bool] = typer.Option(None, "--multimask/--single-mask",
                                             help="Predict 3 masks and keep the best (default: only for a lone "
                                                  "point, as SAM recommends)."),
    points_per_side: int = typer.Option(32, "--points-per-side", min=1, help="--everything: grid size."),
    points_per_batch: int = typer.Option(64, "--points-per-batch", min=1, help="--everything: prompts per batch."),
    pred_iou_thresh: float = typer.Option(0.88, "--pred-iou-thresh", help="--everything: predicted IoU cutoff."),
    stability_thresh: float = typer.Option(0.95, "--stability-thresh", help="--everything: stability cutoff."),
    stability_offset: float = typer.Option(1.0, "--stability-offset", help="--everything: logit offset."),
    nms_thresh: float = typer.Option(0.7, "--nms-thresh", min=0.0, max=1.0, help="--everything: box NMS IoU."),
    batch: int = grammar.read_ahead(),
    dtype: str = grammar.dtype(),
    device: Optional[str] = grammar.device(),
    as_json: bool = grammar.json_lines(),
) -> None:
    """Segment an object from point/box prompts, or everything with --everything."""
    grammar.apply_device(device)
    grammar.check_dtype(dtype)
    from mlxnet import families
    from mlxnet.image import load_image, save_image

    if everything and (point or box or label):
        raise MlxnetError("--everything takes no --point/--label/--box prompts")
    if not everything and not point and box is None:
        raise MlxnetError("give at least one --point X,Y or a --box X1,Y1,X2,Y2 (or --everything)")
    coords, labels, box_arr = (None, None, None) if everything else parse_prompts(point, label, box)
    if names_one_file(images, output):
        overlay = Path(output)
        jobs = [Job(source, (overlay, mask_path(overlay))) for source in expand_inputs(images)]
    else:
        folder = Path(output)
        jobs = []
        for source in expand_inputs(images, skip=folder):
            overlay = mirror(source, folder)
            jobs.append(Job(source, (overlay, overlay.with_name(f"{overlay.stem}.mask.png"))))
    check_outputs(jobs)
    family = families.for_task(model or "sam-tiny", "segment")

    def prepare(job: Job) -> tuple[str, np.ndarray]:
        pixels = load_image(job.source.path)
        check_points_inside(coords, pixels.shape[:2])
        return job.name, pixels

    def run(predictor, item: tuple[str, np.ndarray]):
        name, pixels = item
        if everything:
            quiet = as_json or not distributed.is_main()  # as the images' bar
            with points_progress(name, points_per_side ** 2, quiet) as report:
                return family.segment_everything(
                    predictor, pixels, points_per_side=points_per_side, points_per_batch=points_per_batch,
                    pred_iou_thresh=pred_iou_thresh, stability_score_thresh=stability_thresh,
                    stability_score_offset=stability_offset, box_nms_thresh=nms_thresh, progress=report)
        return family.segment(predictor, pixels, coords, labels, box_arr, multimask)

    def finish(job: Job, item: tuple[str, np.ndarray], result) -> tuple[dict, str]:
        pixels = item[1]
        overlay, mask = job.outputs
        save_image(result.render(pixels), overlay, source=job.source.path)
        save_image(result.mask_image(), mask)
        h, w = pixels.shape[:2]
        record = {"width": w, "height": h, "overlay": str(overlay), "mask": str(mask), **result.to_dict()}
        return record, f"{job.name}: {result.summary()} -> {overlay}, {mask}"

    run_jobs(
        jobs, batch, what="segment", as_json=as_json,
        load=lambda: load_model(lambda: family.predictor(weights or model or "sam-tiny", model or "sam-tiny", dtype)),
        prepare=prepare,
        predict=lambda predictor, items: [run(predictor, item) for item in items],
        finish=finish)
