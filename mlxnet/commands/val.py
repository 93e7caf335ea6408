"""`mlxnet val`: a model measured on your own labelled data, through the image pipeline (read
ahead, batches of one letterbox shape). ``val detect``: a detector's mAP on a YOLO-format or
COCO-format dataset at ultralytics' validation settings; ``val classify``
(:mod:`mlxnet.commands.val_classify`): top-1 / top-5 accuracy on an ImageFolder tree.

Text output is a progress bar (on a terminal), then the table and a speed line; ``--verbose``
adds a line per image, ``--json`` prints JSON Lines (one object per image, then the metrics)."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import typer

from mlxnet.commands import grammar
from mlxnet.commands.guides import epilog
from mlxnet.commands.detect import detector_weights, imgsz_option
from mlxnet.commands.val_classify import classify as _classify
from mlxnet.errors import MlxnetError

val = typer.Typer(name="val", no_args_is_help=True, rich_markup_mode=None, help="Measure a model on your own labelled data.",
                  epilog=epilog("val"))
val.command("classify", epilog=epilog("val classify"))(_classify)


def table(result: Any, names: tuple[str, ...], images: int, kind: str = "Box") -> str:
    """ultralytics' validation table: all, then each class that has labels (``kind``: Box, Mask
    or Pose, what the columns measure)."""
    head = f"{'Class':>22}{'Images':>11}{'Instances':>11}{kind + '(P':>11}{'R':>11}{'mAP50':>11}{'mAP50-95)':>11}"
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


def stem_id(image: Path) -> int | str:
    """ultralytics' image id of a YOLO-format image: the file stem, as a number where it is one."""
    return int(image.stem) if image.stem.isnumeric() else image.stem


def coco_results(image_id: int | str, boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray,
                 category: Callable[[int], int | None] = int, masks: np.ndarray | None = None,
                 keypoints: np.ndarray | None = None) -> list[dict]:
    """One image's detections as COCO results records; ``category(class)``: the category id of
    a class index, None for a class the dataset has no category for (left out). A segment
    model's masks go in as ``segmentation`` (compressed RLE), a pose model's keypoints as
    ``keypoints`` (x, y, score per keypoint), as COCOeval's segm and keypoints evaluations read
    them."""
    from mlxnet.evaluation.instances import coco_rle, with_visibility

    records = []
    for k, (b, s, c) in enumerate(zip(boxes, scores, classes)):
        cid = category(int(c))
        if cid is not None:
            record = {"image_id": image_id, "category_id": cid,
                      "bbox": [round(float(b[0]), 3), round(float(b[1]), 3), round(float(b[2] - b[0]), 3),
                               round(float(b[3] - b[1]), 3)], "score": round(float(s), 5)}
            if masks is not None:
                record["segmentation"] = coco_rle(masks[k])
            if keypoints is not None:
                record["keypoints"] = [round(float(v), 3) for v in with_visibility(keypoints[k]).reshape(-1)]
            records.append(record)
    return records


@dataclass
class Labelled:
    """What val detect measures against, whatever the format: the images, each image's labels
    (boxes in pixels, class indices of the model) and id for --save-json, and the class names;
    and the labels with their shapes, keypoints and areas (``instances``)."""

    source: str  # the data.yaml or the COCO JSON, as messages name it
    images: list[Path]
    labels: Callable[[Path, int, int], tuple[np.ndarray, np.ndarray]]  # (image, width, height) -> boxes, classes
    image_id: Callable[[Path], int | str]
    category: Callable[[int], int | None]
    names: tuple[str, ...]
    instances: Callable[[Path, int, int], Any]  # (image, width, height) -> dataset.Instances


def yolo_format(data: Path) -> Labelled:
    from mlxnet.evaluation import dataset as ds

    dataset = ds.load(data)
    classes = len(dataset.names)
    return Labelled(str(dataset.yaml), dataset.images,
                    lambda image, w, h: ds.read_labels(image, w, h, classes), stem_id, int, dataset.names,
                    lambda image, w, h: ds.read_instances(image, w, h, classes, dataset.kpt_shape))


def coco_format(data: Path, images: Optional[Path], model_names: tuple[str, ...], task: str = "detect") -> Labelled:
    """A COCO file's images and labels, its categories mapped to the model's classes by name;
    its objects' masks made only for a segment model (``task``)."""
    from mlxnet.evaluation import coco

    dataset = coco.load(data, images)
    to_class = coco.class_map(dataset, model_names)
    to_category = {c: cid for cid, c in to_class.items()}
    if dataset.crowd:
        print(f"note: {dataset.crowd} crowd annotation{'s' if dataset.crowd > 1 else ''} of {data} left out "
              "(as ultralytics' COCO converter does)", file=sys.stderr, flush=True)

    def labels(image: Path, _w: int, _h: int) -> tuple[np.ndarray, np.ndarray]:
        found = dataset.by_path[str(image)]
        return found.boxes, np.array([to_class[c] for c in found.categories.tolist()], np.int64)

    def instances(image: Path, w: int, h: int) -> Any:
        from mlxnet.evaluation.dataset import Instances

        found = dataset.by_path[str(image)]
        boxes, classes = labels(image, w, h)
        shapes = found.masks((h, w)) if task == "segment" else [None] * len(boxes)
        return Instances(boxes, classes, shapes, found.keypoints, found.areas)

    return Labelled(str(data), [image.path for image in dataset.images], labels,
                    lambda image: dataset.by_path[str(image)].id, to_category.get, model_names, instances)


def instance_overlap(task: str, found: Any, predicted: np.ndarray, pred_boxes: np.ndarray, image_hw: tuple[int, int],
                     metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(labels, predictions) mask IoU (segment) or OKS (pose) of one image; which labels count;
    and, for COCOeval's convention, the labels it ignores (a pose label without a visible
    keypoint; ultralytics counts it, with OKS 0)."""
    from mlxnet.evaluation import instances as inst

    everyone = np.ones(len(found.classes), bool)
    if task == "segment":
        labels = inst.polygon_masks(found.polygons, found.boxes, image_hw)
        return inst.mask_iou(labels, predicted, found.boxes, pred_boxes), everyone, None
    if found.keypoints is None:
        raise MlxnetError("a pose model's keypoints are measured against keypoint labels: a data.yaml needs its "
                          "kpt_shape, a COCO file its annotations' keypoints")
    if found.keypoints.shape[1] != predicted.shape[1]:
        raise MlxnetError(f"the labels have {found.keypoints.shape[1]} keypoints an object, the model predicts "
                          f"{predicted.shape[1]}")
    visible = (found.keypoints[..., 2] > 0).any(axis=1) if found.keypoints.shape[-1] > 2 else everyone
    points = inst.with_visibility(found.keypoints)
    areas = found.areas if found.areas is not None else \
        np.prod(found.boxes[:, 2:] - found.boxes[:, :2], axis=1) * inst.AREA_FROM_BOX
    oks = inst.keypoint_oks(points, predicted, found.boxes, areas)
    if metric == "coco":
        return oks, visible, ~visible
    return oks * visible[:, None], everyone, None


@val.command("detect", epilog=epilog("val detect"))
def detect(
    data: Path = typer.Argument(..., metavar="DATA",
                                help="A YOLO-format dataset: its data.yaml (path, val, names), or a folder "
                                     "holding one (labels: the image path with /images/ -> /labels/ and .txt); "
                                     "or a COCO instances JSON (categories mapped to the model's classes by name; "
                                     "images found beside it, or --images)."),
    images: Optional[Path] = typer.Option(None, "--images", metavar="DIR",
                                          help="COCO format: the folder the JSON's file_names are relative to "
                                               "(default: ../images/<split>, ../<split>, <split>, images or the "
                                               "JSON's folder, the first holding the first image)."),
    model: Optional[str] = grammar.model("yolov8n|s|m|l|x, yolo11n-x, yolo26n-x; each also -seg and -pose",
                                         "yolov8n"),
    weights: Optional[str] = detector_weights(),
    conf: float = typer.Option(0.001, "--conf", min=0.0, max=1.0,
                               help="Confidence threshold (ultralytics' val: 0.001, every plausible box)."),
    iou: float = typer.Option(0.7, "--iou", min=0.0, max=1.0, help="NMS IoU threshold (ultralytics' val: 0.7)."),
    imgsz: int = imgsz_option(),
    max_det: int = typer.Option(300, "--max-det", min=1, help="Most detections per image (ultralytics' val: 300)."),
    single_label: bool = typer.Option(False, "--single-label",
                                      help="One class per anchor, its best (as `mlxnet detect`); default: every "
                                           "class scoring above --conf, as `yolo val`'s multi-label NMS."),
    metric: str = typer.Option("ultralytics", "--metric", metavar="ultralytics|coco",
                               help="ultralytics: `yolo val`'s numbers (each prediction picks its best-IoU label, "
                                    "the higher score keeps it; trapezoid AP); coco: pycocotools' COCOeval "
                                    "(labels taken by score; 101-point mean AP)."),
    rect: bool = typer.Option(True, "--rect/--no-rect",
                              help="Letterbox as `yolo val` does (default): images sorted by aspect ratio in "
                                   "batches of --batch, each batch one shape (its ratios' range, stride 32, "
                                   "pad 0.5), each image's long side scaled to --imgsz, then padded to its batch's "
                                   "shape. --no-rect: each image letterboxed on its own (the smallest stride-32 "
                                   "rectangle, as `mlxnet detect`)."),
    batch: int = grammar.batch(8),
    dtype: str = grammar.dtype(),
    device: Optional[str] = grammar.device(),
    as_json: bool = grammar.json_lines("Print JSON Lines: one object per image, then the metrics and speed."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Text output: also a line per image."),
    save_json: Optional[Path] = typer.Option(None, "--save-json", metavar="FILE",
                                             help="Also write the predictions as a COCO results JSON (image_id: "
                                                  "the COCO file's ids, or a YOLO-format image's file stem, a "
                                                  "number where it is one; category_id: the COCO category, or the "
                                                  "class id; bbox: x, y, w, h in image pixels; a -seg model's "
                                                  "segmentation as RLE, a -pose model's keypoints)."),
) -> None:
    """mAP50-95, mAP50, precision and recall, overall and per class, of a detector on the
    dataset's val images (at ultralytics' validation settings: conf 0.001, IoU 0.7, max_det 300,
    multi-label NMS, rect letterbox batches), and the speed: images/s, decode / forward / NMS per
    image. A segment checkpoint adds the same for its masks (mask IoU), a pose checkpoint for its
    keypoints (OKS), against polygon or keypoint labels (YOLO format) or a COCO file's segmentations
    and keypoints."""
    from mlxnet import distributed, families
    from mlxnet.commands.images import Job, Source, load_model
    from mlxnet.commands.pipeline import run_jobs
    from mlxnet.evaluation import coco
    from mlxnet.evaluation.metrics import METHODS, Stats, ap_per_class, match, match_iou
    from mlxnet.evaluation.rect import batch_shapes, image_hw
    from mlxnet.evaluation.speed import Speed
    from mlxnet.image import load_image

    grammar.apply_device(device)
    grammar.check_dtype(dtype)
    if metric not in METHODS:
        raise MlxnetError(f"--metric must be one of {', '.join(METHODS)}, got {metric!r}")
    if imgsz < 32 or imgsz % 32:
        raise MlxnetError(f"--imgsz must be a positive multiple of 32, got {imgsz}")
    if distributed.size() > 1:  # each rank would measure its shard alone: numbers no one asked for
        raise MlxnetError("val runs in one process: its metrics are over every image (not under mlx.launch)")
    if images is not None and not coco.is_coco(data):
        raise MlxnetError("--images is for COCO-format data (a .json); a data.yaml names its own images")
    family = families.for_task(model or "yolov8n", "detect")
    labelled = None if coco.is_coco(data) else yolo_format(data)  # a bad data.yaml fails before the weights load
    # The weights load before the clock starts (images/s is the images' pace), and a COCO file's
    # categories are mapped to the model's class names.
    detector = load_model(lambda: family.predictor(weights, model, dtype))
    if labelled is None:
        labelled = coco_format(data, images, detector.names, detector.net.task)
    elif len(detector.names) != len(labelled.names):
        print(f"note: the model has {len(detector.names)} classes, {labelled.source} names {len(labelled.names)}",
              file=sys.stderr, flush=True)
    jobs = [Job(Source(str(path), Path(path.name))) for path in labelled.images]
    # Rect: every image's letterbox shape is its rect batch's, known from the headers before any
    # decoding. The jobs keep the dataset's order (reports and --save-json in that order) and the
    # pipeline batches images of one shape together, so a forward may mix images of several rect
    # batches of the same shape: an image's result does not depend on its batch mates.
    target: dict[str, tuple[int, int]] = {}
    if rect:
        sizes = {str(path): image_hw(path) for path in labelled.images}
        known = [path for path, hw in sizes.items() if hw is not None]  # the others fail on decoding
        _, shapes = batch_shapes([sizes[path] for path in known], batch, imgsz)
        target = {path: (int(h), int(w)) for path, (h, w) in zip(known, shapes)}
    stats = Stats()
    task = detector.net.task
    task_stats = Stats()  # masks (segment) or keypoints (pose)
    predictions: list[dict] = []  # COCO results, for --save-json
    speed = Speed()

    def prepare(job: Job) -> tuple[Any, np.ndarray, np.ndarray, Any]:
        with speed.timed("decode"):
            image = load_image(job.source.path)
            if task == "detect":
                boxes, ids = labelled.labels(job.source.path, image.shape[1], image.shape[0])
                found = None
            else:
                found = labelled.instances(job.source.path, image.shape[1], image.shape[0])
                boxes, ids = found.boxes, found.classes
            return family.prepare(image, imgsz=imgsz, shape=target.get(str(job.source.path))), boxes, ids, found

    def predict(yolo, items: list) -> list:
        boxed_items = [item[0] for item in items]
        with speed.timed("forward"):
            if task == "detect":
                head, extras = yolo.head_outputs(boxed_items), None  # one letterbox shape a batch
            else:
                head, extras = yolo.task_head_outputs(boxed_items)
        with speed.timed("nms"):
            found = yolo.val_detections_many(head[:len(boxed_items)], boxed_items, conf=conf, iou=iou,
                                             max_det=max_det, multi_label=not single_label,
                                             anchors=extras is not None)
            if extras is None:
                return found
            return [(*det[:4], yolo.val_instances(extras, i, det[4], det[1], boxed))
                    for i, (det, boxed) in enumerate(zip(found, boxed_items))]

    def finish(job: Job, item: tuple[Any, np.ndarray, np.ndarray, Any], det) -> tuple[dict, str | None]:
        boxed, boxes, ids, found = item
        input_boxes, pred_boxes, scores, classes = det[:4]
        if task != "detect":
            overlap, counted, ignored = instance_overlap(task, found, det[4], pred_boxes, boxed.image_hw, metric)
            task_stats.add(match_iou(overlap, scores, classes, ids, metric, ignored=ignored), scores, classes,
                           ids[counted])
        if metric == "ultralytics":
            # yolo val (8.4) matches on the network input: the labels mapped onto it, the
            # predictions as NMS gave them (not clipped to the image, which mapping back does).
            correct = match(input_boxes, scores, classes, boxed.to_input(boxes), ids, metric)
        else:  # COCOeval reads the --save-json boxes: on the image, clipped
            correct = match(pred_boxes, scores, classes, boxes, ids, metric)
        stats.add(correct, scores, classes, ids)  # the writer thread alone adds: no lock
        if save_json is not None:
            extra = {} if task == "detect" else {"masks" if task == "segment" else "keypoints": det[4]}
            predictions.extend(coco_results(labelled.image_id(job.source.path), pred_boxes, scores, classes,
                                            labelled.category, **extra))
        record = {"labels": int(len(ids)), "predictions": int(len(scores)),
                  "true_positives_50": int(correct[:, 0].sum())}
        line = (f"{job.name}: {len(ids)} labels, {len(scores)} predictions, {record['true_positives_50']} "
                f"right at IoU 0.5")
        return record, line if verbose else None

    failed: typer.Exit | None = None
    try:
        run_jobs(jobs, batch, what="val", as_json=as_json, load=lambda: detector, prepare=prepare, predict=predict,
                 finish=finish, group=lambda item: item[0].pixels.shape)
    except typer.Exit as e:
        if not e.exit_code or not stats.scores:
            raise
        failed = e  # reported per image; the metrics of the others still print
    speed.stop()
    if save_json is not None:
        from mlxnet.image import atomic_write_bytes

        atomic_write_bytes(save_json, json.dumps(predictions).encode())
    result = ap_per_class(stats, metric)
    measured = len(stats.scores)
    kind = {"segment": ("masks", "Mask"), "pose": ("keypoints", "Pose")}.get(task)
    task_result = ap_per_class(task_stats, metric) if kind else None
    if as_json:
        metrics = summary(result, labelled.names, measured, metric)
        if kind:
            metrics[kind[0]] = summary(task_result, labelled.names, measured, metric)
        print(json.dumps({"metrics": metrics, "speed": speed.summary(measured)}), flush=True)
    else:
        print(table(result, labelled.names, measured), flush=True)
        if kind:
            print(table(task_result, labelled.names, measured, kind[1]), flush=True)
        print(speed.line(measured), flush=True)
    if failed is not None:
        raise failed
