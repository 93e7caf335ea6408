"""`mlxnet detect`: YOLOv8 object detection; labelled boxes drawn on a copy of each image."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import numpy as np
import typer

from mlxnet.commands.images import Job, check_outputs, expand_inputs, load_model, mirror, run_jobs
from mlxnet.errors import MlxnetError


def detect(
    images: List[str] = typer.Argument(..., help="Image files, folders (searched recursively) or quoted glob "
                                                 "patterns ('photos/**/*.jpg')."),
    output: Path = typer.Option(..., "--output", "-o",
                                help="Folder for the annotated copies: a file's copy has its name, a folder's "
                                     "images keep their paths below it."),
    model: Optional[str] = typer.Option(None, "--model", "-m",
                                        help="yolov8n|s|m|l|x (default: what --weights holds, else yolov8n)."),
    weights: Optional[str] = typer.Option(None, "--weights", "-w",
                                          help="Weights id or file: ultralytics .pt or converted safetensors "
                                               "(default: the model's official checkpoint from the hub)."),
    labels: Optional[Path] = typer.Option(None, "--labels",
                                          help="Class names: one per line, or a JSON list or {index: name} "
                                               "(default: the checkpoint's, else COCO's)."),
    conf: float = typer.Option(0.25, "--conf", min=0.0, max=1.0, help="Confidence threshold."),
    iou: float = typer.Option(0.7, "--iou", min=0.0, max=1.0, help="NMS IoU threshold."),
    imgsz: int = typer.Option(640, "--imgsz", help="Inference size (long side, multiple of 32)."),
    max_det: int = typer.Option(300, "--max-det", min=1, help="Most detections per image."),
    batch: int = typer.Option(8, "--batch", min=1, help="Images per forward pass (memory grows with it)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON Lines (one object per image) instead of text."),
) -> None:
    """Detect objects in each image and write a labelled copy under OUTPUT."""
    from mlxnet import families
    from mlxnet.image import load_image, save_image
    from mlxnet.weights import read_labels

    family = families.for_task(model or "yolov8n", "detect")
    if imgsz < 32 or imgsz % 32:
        raise MlxnetError(f"--imgsz must be a positive multiple of 32, got {imgsz}")
    names = read_labels(labels) if labels is not None else None
    jobs = [Job(source, (mirror(source, output),)) for source in expand_inputs(images, skip=output)]
    check_outputs(jobs)

    def finish(job: Job, image: np.ndarray, det) -> tuple[dict, str]:
        target = job.outputs[0]
        save_image(det.render(image), target)
        record = {"output": str(target), "width": image.shape[1], "height": image.shape[0], **det.to_dict()}
        return record, f"{job.name}: {det.summary()} -> {target}"

    run_jobs(
        jobs, batch, what="detect", as_json=as_json,
        load=lambda: load_model(lambda: family.predictor(weights, model, names=names)),
        prepare=lambda job: load_image(job.source.path),
        predict=lambda detector, pixels: detector.predict(pixels, conf=conf, iou=iou, imgsz=imgsz, max_det=max_det),
        finish=finish)
