"""`mlxnet inpaint`: fill the masked region of images with LaMa (big-lama).

MASK is one mask for every image, or a folder of masks: an image's mask there has the image's
path relative to its folder or pattern (a file argument: its name), or the same path with
another image extension (``photo.jpg`` → ``photo.png``). One image: ``-o`` names the output
file; several, a folder or a pattern: ``-o`` is a folder and outputs keep the inputs' paths.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, List, Optional

import numpy as np
import typer

from mlxnet.commands import grammar
from mlxnet.commands.images import (Job, Source, check_outputs, expand_inputs, load_model, mirror,
                                    names_one_file)
from mlxnet.commands.pipeline import run_jobs
from mlxnet.errors import MlxnetError
from mlxnet.image import readable_extensions


def mask_finder(folder: Path) -> Callable[[Source], Path]:
    """Where an image's mask is in a folder of masks: the same relative path, else the one mask
    with the same path and another image extension. The folder is listed once (a lookup per
    image would list it once per image); a mask that is not there fails its image when read."""
    by_stem: dict[Path, list[Path]] = {}
    for root, _dirs, files in os.walk(folder):
        for name in files:
            if os.path.splitext(name)[1].lower() in readable_extensions():
                rel = Path(os.path.relpath(os.path.join(root, name), folder))
                by_stem.setdefault(rel.with_suffix(""), []).append(rel)

    def find(source: Source) -> Path:
        others = by_stem.get(source.rel.with_suffix(""), [])
        if (folder / source.rel).is_file() or len(others) != 1:
            return folder / source.rel
        return folder / others[0]

    return find


def inpaint(
    images: Optional[List[str]] = grammar.sources(required=False),
    mask: Optional[str] = typer.Argument(None, metavar="MASK",
                               help="Mask (non-black pixels are filled): one image file for every image, "
                                    "or a folder of masks with the images' relative paths."),
    output: str = grammar.output(),
    weights: Optional[str] = grammar.weights("big-lama's weights from the hub (or lama-fourier's); files: "
                                             ".ckpt or safetensors"),
    model: Optional[str] = grammar.model("lama|lama-fourier", "lama"),
    dtype: str = grammar.dtype(),
    resize_mask: bool = typer.Option(False, "--resize-mask",
                                     help="Resize a mask of another size to its image (nearest)."),
    batch: int = grammar.read_ahead(),
    device: Optional[str] = grammar.device(),
    as_json: bool = grammar.json_lines(),
) -> None:
    """Inpaint each SOURCE where its MASK is set and write the result to OUTPUT."""
    grammar.apply_device(device)
    import mlx.core as mx

    import mlxnet
    from mlxnet import families
    from mlxnet.dtypes import computes_in
    from mlxnet.image import load_image, load_mask, resize_pil, save_image

    if not images:  # one argument: click gave it to MASK
        raise MlxnetError(f"no MASK after {mask or 'the images'}: give SOURCE... MASK (the last argument is the mask)")
    grammar.check_dtype(dtype)
    weights = weights or model or "lama"
    one_output, one_mask = names_one_file(images, output), not os.path.isdir(mask)
    sources = expand_inputs(images) if one_output else expand_inputs(images, skip=Path(output))
    mask_of = (lambda source: Path(mask)) if one_mask else mask_finder(Path(mask))
    jobs = [Job(source, (Path(output) if one_output else mirror(source, Path(output)),), (mask_of(source),))
            for source in sources]
    check_outputs(jobs)
    # One mask for every image is read once, now: if it is unreadable, no image can run.
    shared = load_mask(mask) if one_mask else None
    family = families.for_task(model or (weights if weights in families.variants() else "lama"), "inpaint")

    def prepare(job: Job) -> tuple[np.ndarray, np.ndarray]:
        img = load_image(job.source.path)
        (mask_file,) = job.also_reads
        if shared is None and not mask_file.is_file():
            raise MlxnetError(f"no mask {mask_file} for it in the folder of masks")
        msk = shared if shared is not None else load_mask(mask_file)
        if msk.shape != img.shape[:2]:
            if not resize_mask:
                raise MlxnetError(f"mask {mask_file} is {msk.shape[1]}×{msk.shape[0]} but the image is "
                                  f"{img.shape[1]}×{img.shape[0]}; pass --resize-mask to resize it")
            msk = resize_pil(msk, (img.shape[1], img.shape[0]), "nearest")
        return img, msk

    def run(net, item: tuple[np.ndarray, np.ndarray]):
        start = time.perf_counter()
        result = family.inpaint(net, *item)
        return result, time.perf_counter() - start

    def finish(job: Job, item: tuple[np.ndarray, np.ndarray], timed) -> tuple[dict, str]:
        (out_path,), (mask_file,) = job.outputs, job.also_reads
        result, seconds = timed
        save_image(result.render(item[0]), out_path, source=job.source.path)
        record = {"mask": str(mask_file), "output": str(out_path), **result.to_dict(), "weights": weights,
                  "dtype": computes_in(dtype), "backend": mlxnet.backend(), "seconds": round(seconds, 4),
                  "peak_memory_mb": round(mx.get_peak_memory() / 2**20, 1)}
        return record, f"{out_path}: {result.summary()} in {seconds:.2f} s ({mlxnet.backend()}, {computes_in(dtype)})"

    run_jobs(
        jobs, batch, what="inpaint", as_json=as_json,
        load=lambda: load_model(lambda: family.predictor(weights, model, dtype)),
        prepare=prepare,
        predict=lambda net, items: [run(net, item) for item in items],
        finish=finish)
