"""`mlxnet segment`: Segment Anything (MobileSAM) from point/box prompts, or everything in the image.

Writes OUT (the image with the mask(s) overlaid, prompts marked) and OUT's ``.mask`` sibling
(``out.png`` → ``out.mask.png``): the chosen binary mask (0/255), or with ``--everything`` a label
map (0 = background, i = i-th mask by predicted IoU; 16-bit if there are more than 255).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np
import typer

from mlxnet.errors import MlxnetError


def _numbers(text: str, n: int, option: str, what: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        values = []
    if len(values) != n or not all(np.isfinite(values)):
        raise MlxnetError(f"{option}: expected {what} ({n} comma-separated numbers), got {text!r}")
    return values


def parse_prompts(points: Sequence[str], labels: Sequence[int], box: str | None, size: tuple[int, int]
                  ) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """--point X,Y (repeatable), --label 1|0 (one per point, default 1), --box X1,Y1,X2,Y2, checked
    against the image size (H, W)."""
    h, w = size
    coords = np.array([_numbers(p, 2, "--point", "X,Y") for p in points], dtype=np.float64).reshape(-1, 2)
    for x, y in coords:
        if not (0 <= x <= w and 0 <= y <= h):
            raise MlxnetError(f"--point {x:g},{y:g} lies outside the {w}x{h} image")
    if labels and len(labels) != len(coords):
        raise MlxnetError(f"--label: got {len(labels)} label(s) for {len(coords)} point(s); give one per point")
    if any(v not in (0, 1) for v in labels):
        raise MlxnetError(f"--label: 1 marks foreground, 0 background; got {list(labels)}")
    box_arr = None
    if box is not None:
        box_arr = np.array(_numbers(box, 4, "--box", "X1,Y1,X2,Y2"))
        if not (box_arr[0] < box_arr[2] and box_arr[1] < box_arr[3]):
            raise MlxnetError(f"--box: need X1 < X2 and Y1 < Y2, got {box}")
    if not len(coords):
        return None, None, box_arr
    lab = np.array(labels if labels else [1] * len(coords), dtype=np.int32)
    return coords, lab, box_arr


def mask_path(output: Path) -> Path:
    return output.with_name(f"{output.stem}.mask{output.suffix}")


def segment(
    image: str = typer.Argument(..., help="Image file (any format Pillow reads)."),
    output: Path = typer.Option(..., "--output", "-o", help="Overlay image to write; the mask goes to OUT.mask.png."),
    point: List[str] = typer.Option([], "--point", "-p", help="Prompt point X,Y in pixels (repeatable)."),
    label: List[int] = typer.Option([], "--label", "-l", help="1 foreground / 0 background, one per --point "
                                                              "(default: all 1)."),
    box: Optional[str] = typer.Option(None, "--box", "-b", help="Prompt box X1,Y1,X2,Y2 in pixels."),
    everything: bool = typer.Option(False, "--everything", help="Segment everything (point grid) instead."),
    weights: str = typer.Option("sam-tiny", "--weights", "-w",
                                help="Weights id or file: MobileSAM's mobile_sam.pt or a safetensors file."),
    multimask: Optional[bool] = typer.Option(None, "--multimask/--single-mask",
                                             help="Predict 3 masks and keep the best (default: only for a lone "
                                                  "point, as SAM recommends)."),
    points_per_side: int = typer.Option(32, "--points-per-side", min=1, help="--everything: grid size."),
    points_per_batch: int = typer.Option(64, "--points-per-batch", min=1, help="--everything: prompts per batch."),
    pred_iou_thresh: float = typer.Option(0.88, "--pred-iou-thresh", help="--everything: predicted IoU cutoff."),
    stability_thresh: float = typer.Option(0.95, "--stability-thresh", help="--everything: stability cutoff."),
    stability_offset: float = typer.Option(1.0, "--stability-offset", help="--everything: logit offset."),
    nms_thresh: float = typer.Option(0.7, "--nms-thresh", min=0.0, max=1.0, help="--everything: box NMS IoU."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Segment an object from point/box prompts, or everything with --everything."""
    from mlxnet.image import check_output_path, load_image, save_image
    from mlxnet import families

    if everything and (point or box or label):
        raise MlxnetError("--everything takes no --point/--label/--box prompts")
    if not everything and not point and box is None:
        raise MlxnetError("give at least one --point X,Y or a --box X1,Y1,X2,Y2 (or --everything)")
    pixels = load_image(image)  # fail on a bad image or prompt before loading any weights
    h, w = pixels.shape[:2]
    coords, labels, box_arr = (None, None, None) if everything else parse_prompts(point, label, box, (h, w))
    check_output_path(output, [image])
    check_output_path(mask_path(output), [image])
    try:
        family = families.for_task("sam-tiny", "segment")
        predictor = family.predictor(weights, "sam-tiny")
    except MlxnetError as e:  # the loader lists every problem; the CLI says it in one line
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        raise MlxnetError(lines[0] + (f" (first: {lines[1]})" if len(lines) > 1 else "")) from None

    if everything:
        result = family.segment_everything(
            predictor, pixels, points_per_side=points_per_side, points_per_batch=points_per_batch,
            pred_iou_thresh=pred_iou_thresh, stability_score_thresh=stability_thresh,
            stability_score_offset=stability_offset, box_nms_thresh=nms_thresh)
    else:
        result = family.segment(predictor, pixels, coords, labels, box_arr, multimask)
    save_image(result.render(pixels), output)
    save_image(result.mask_image(), mask_path(output))
    if as_json:
        print(json.dumps({"image": image, "width": w, "height": h, "overlay": str(output),
                          "mask": str(mask_path(output)), **result.to_dict()}, indent=1))
    else:
        print(f"{image}: {result.summary()} -> {output}, {mask_path(output)}")
