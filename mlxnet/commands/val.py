"""`mlxnet val detect DATA`: a detector's mAP on a labelled YOLO-format dataset, at ultralytics'
validation settings, through the image pipeline (read ahead, batches of one letterbox shape)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import numpy as np
import typer

from mlxnet.commands import grammar
from mlxnet.commands.detect import detector_weights, imgsz_option
from mlxnet.errors import MlxnetError

val = typer.Typer(name="val", no_args_is_help=True, help="Measure a model on your own labelled data.")


def table(result: Any, names: tuple[str, ...], images: int) -> str:
    """ultralytics' validation table: all, then each class that has labels."""
    head = f"{'Class':>22}{'Images':>11}{'Instances':>11}{'Box(P':>11}{'R':>11}{'mAP50':>11}{'mAP50-95)':>11}"
    rows = [head, f"{'all':>22}{images:>11}{int(result.labels.sum()):>11}"
                  f"{result.mp:>11.3g}{result.mr:>11.3g}{result.map50:>11.3g}{result.map:>11.3g}"]
    for i, c in enumerate(result.classes.tolist()):
        rows.append(f"{names[c]:>22}{int(result.images[i]):>11}{int(result.labels[i]):>11}"
                    f"{result.precision[i]:>11.3g}{result.recall[i]:>11.3g}{result.ap[i, 0]:>11.3g}"
                    f"{result.ap[i].mean():>11.3g}")
    return "\n".join(rows)


def summary(result: Any, names: tuple[str, ...], images: int, method: str) -> dict:
    """The metrics as JSON: overall and per class (AP at each IoU threshold 0.50:0.95:0.05)."""
    per_class = [{"class": c, "name": names[c], "images": int(result.images[i]), "instances": int(result.labels[i]),
                  "precision": float(result.precision[i]), "recall": float(result.recall[i]),
                  "map50": float(result.ap[i, 0]), "map50_95": float(result.ap[i].mean())}
                 for i, c in enumerate(result.classes.tolist())]
    return {"metric": method, "images": images, "instances": int(result.labels.sum()), "precision": result.mp,
            "recall": result.mr, "map50": result.map50, "map50_95": result.map, "classes": per_class}


def coco_results(image: Path, boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray) -> list[dict]:
    """One image's detections as COCO results records (ultralytics' naming of YOLO-format images:
    the stem, as a number where it is one)."""
    stem = image.stem
    image_id: int | str = int(stem) if stem.isnumeric() else stem
    return [{"image_id": image_id, "category_id": int(c),
             "bbox": [round(float(b[0]), 3), round(float(b[1]), 3), round(float(b[2] - b[0]), 3),
                      round(float(b[3] - b[1]), 3)], "score": round(float(s), 5)}
            for b, s, c in zip(boxes, scores, classes)]


@val.command("detect")
def detect(
    data: Path = typer.Argument(..., metavar="DATA",
                                help="A YOLO-format dataset: its data.yaml (path, val, names), or a folder "
                                     "holding one. Labels: the image path with /images/ -> /labels/ and .txt."),
    model: Optional[str] = grammar.model("yolov8n|s|m|l|x", "yolov8n"),
    weights: Optional[str] = detector_weights(),
    conf: float = typer.Option(0.001, "--conf", min=0.0, max=1.0,
                               help="Confidence threshold (ultralytics' val: 0.001, every plausible box)."),
    iou: float = typer.Option(0.7, "--iou", min=0.0, max=1.0, help="NMS IoU threshold (ultralytics' val: 0.7)."),
    imgsz: int = imgsz_option(),
    max_det: int = typer.Option(300, "--max-det", min=1, help="Most detections per image (ultralytics' val: 300)."),
    metric: str = typer.Option("ultralytics", "--metric", metavar="ultralytics|coco",
                               help="ultralytics: `yolo val`'s numbers (each prediction picks its best-IoU label, "
                                    "the higher score keeps it; trapezoid AP); coco: pycocotools' COCOeval "
                                    "(labels taken by score; 101-point mean AP)."),
    batch: int = grammar.batch(8),
    dtype: str = grammar.dtype(),
    device: Optional[str] = grammar.device(),
    as_json: bool = grammar.json_lines("Print JSON Lines: one object per image, then the metrics."),
    save_json: Optional[Path] = typer.Option(None, "--save-json", metavar="FILE",
                                             help="Also write the predictions as a COCO results JSON (image_id: "
                                                  "the image file's stem, a number where it is one; category_id: "
                                                  "the class id; bbox: x, y, w, h in image pixels)."),
) -> None:
    """mAP50-95, mAP50, precision and recall, overall and per class, of a detector on the
    dataset's val images (at ultralytics' validation settings: conf 0.001, IoU 0.7, max_det 300)."""
    from mlxnet import families
    from mlxnet.commands.images import Job, Source, load_model
    from mlxnet.commands.pipeline import run_jobs
    from mlxnet.evaluation import dataset as ds
    from mlxnet.evaluation.metrics import METHODS, Stats, ap_per_class, match
    from mlxnet.image import load_image

    grammar.apply_device(device)
    grammar.check_dtype(dtype)
    if metric not in METHODS:
        raise MlxnetError(f"--metric must be one of {', '.join(METHODS)}, got {metric!r}")
    if imgsz < 32 or imgsz % 32:
        raise MlxnetError(f"--imgsz must be a positive multiple of 32, got {imgsz}")
    from mlxnet import distributed

    if distributed.size() > 1:  # each rank would measure its shard alone: numbers no one asked for
        raise MlxnetError("val runs in one process: its metrics are over every image (not under mlx.launch)")
    family = families.for_task(model or "yolov8n", "detect")
    dataset = ds.load(data)
    jobs = [Job(Source(str(path), Path(path.name))) for path in dataset.images]
    stats = Stats()
    classes = len(dataset.names)
    predictions: list[dict] = []  # COCO results, for --save-json

    def load():
        detector = load_model(lambda: family.predictor(weights, model, dtype))
        if len(detector.names) != classes:
            print(f"note: the model has {len(detector.names)} classes, {dataset.yaml} names {classes}",
                  file=sys.stderr, flush=True)
        return detector

    def prepare(job: Job) -> tuple[Any, np.ndarray, np.ndarray]:
        image = load_image(job.source.path)
        boxes, ids = ds.read_labels(job.source.path, image.shape[1], image.shape[0], classes)
        return family.prepare(image, imgsz=imgsz), boxes, ids

    def finish(job: Job, item: tuple[Any, np.ndarray, np.ndarray], det) -> tuple[dict, str]:
        _, boxes, ids = item
        correct = match(det.boxes, det.scores, det.classes, boxes, ids, metric)
        stats.add(correct, det.scores, det.classes, ids)  # the writer thread alone adds: no lock
        if save_json is not None:
            predictions.extend(coco_results(job.source.path, det.boxes, det.scores, det.classes))
        record = {"labels": int(len(ids)), "predictions": int(len(det)), "true_positives_50": int(correct[:, 0].sum())}
        return record, f"{job.name}: {len(ids)} labels, {len(det)} predictions, {record['true_positives_50']} " \
                       f"right at IoU 0.5"

    failed: typer.Exit | None = None
    try:
        run_jobs(jobs, batch, what="val", as_json=as_json, load=load, prepare=prepare,
                 predict=lambda detector, items: detector.predict_prepared(
                     [boxed for boxed, _, _ in items], conf=conf, iou=iou, max_det=max_det),
                 finish=finish, group=lambda item: item[0].pixels.shape)  # one letterbox shape a batch
    except typer.Exit as e:
        if not e.exit_code or not stats.scores:
            raise
        failed = e  # reported per image; the metrics of the others still print
    if save_json is not None:
        from mlxnet.image import atomic_write_bytes

        atomic_write_bytes(save_json, json.dumps(predictions).encode())
    result = ap_per_class(stats, metric)
    images = len(stats.scores)
    if as_json:
        print(json.dumps({"metrics": summary(result, dataset.names, images, metric)}), flush=True)
    else:
        print(table(result, dataset.names, images), flush=True)
    if failed is not None:
        raise failed
