"""`mlxnet detect`: YOLOv8 object detection; labelled boxes drawn on a copy of each image."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from mlxnet.errors import MlxnetError


def detect(
    images: List[str] = typer.Argument(..., help="Image files (any format Pillow reads)."),
    output: Path = typer.Option(..., "--output", "-o", help="Folder for the annotated copies (same file names)."),
    model: Optional[str] = typer.Option(None, "--model", "-m",
                                        help="yolov8n|s|m|l|x (default: what --weights holds, else yolov8n)."),
    weights: Optional[str] = typer.Option(None, "--weights", "-w",
                                          help="Weights id or file: ultralytics .pt or converted safetensors "
                                               "(default: the model's official checkpoint from the hub)."),
    conf: float = typer.Option(0.25, "--conf", min=0.0, max=1.0, help="Confidence threshold."),
    iou: float = typer.Option(0.7, "--iou", min=0.0, max=1.0, help="NMS IoU threshold."),
    imgsz: int = typer.Option(640, "--imgsz", help="Inference size (long side, multiple of 32)."),
    max_det: int = typer.Option(300, "--max-det", min=1, help="Most detections per image."),
    as_json: bool = typer.Option(False, "--json", help="Print the detections as JSON."),
) -> None:
    """Detect COCO objects in each image and write a labelled copy to OUTPUT."""
    from mlxnet.image import check_output_path, load_image, save_image
    from mlxnet import families

    family = families.for_task(model or "yolov8n", "detect")
    if imgsz < 32 or imgsz % 32:
        raise MlxnetError(f"--imgsz must be a positive multiple of 32, got {imgsz}")
    targets = [output / Path(p).name for p in images]
    if len(set(targets)) != len(targets):
        raise MlxnetError("two input images have the same file name; their outputs would collide in "
                          f"{output}")
    pixels = [load_image(p) for p in images]  # fail on a bad image before loading any weights
    for target in targets:
        check_output_path(target, images)
    try:
        detector = family.predictor(weights, model)
    except MlxnetError as e:  # the loader lists every problem; the CLI says it in one line
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        raise MlxnetError(lines[0].rstrip(":") + (f" (first: {lines[1]})" if len(lines) > 1 else "")) from None
    output.mkdir(parents=True, exist_ok=True)
    report = []
    for path, image, target in zip(images, pixels, targets):
        det = detector.predict(image, conf=conf, iou=iou, imgsz=imgsz, max_det=max_det)
        save_image(det.render(image), target)
        report.append({"image": path, "output": str(target), "width": image.shape[1], "height": image.shape[0],
                       **det.to_dict()})
        if not as_json:
            print(f"{path}: {det.summary()} -> {target}")
    if as_json:
        print(json.dumps({"model": model, "conf": conf, "iou": iou, "imgsz": imgsz, "images": report}, indent=1))
