"""A detector's mAP on labelled images, in one process, as ``mlxnet val detect`` measures it
(ultralytics' validation settings: rect letterbox batches, conf 0.001, IoU 0.7, max_det 300,
multi-label NMS, ultralytics' matching and AP): the per-epoch validation of ``mlxnet train detect``.
The same functions as the command, without its reader threads and output."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .metrics import Result, Stats, ap_per_class, match
from .rect import batch_shapes, image_hw


def evaluate(yolo: Any, images: Sequence[Path], labels: Callable[[Path, int, int], tuple[np.ndarray, np.ndarray]],
             *, imgsz: int = 640, batch: int = 16, conf: float = 0.001, iou: float = 0.7, max_det: int = 300,
             metric: str = "ultralytics", progress: Callable[[int], None] | None = None) -> Result:
    """``yolo``: a :class:`mlxnet.models.yolo.YOLO`; ``labels(image, width, height)``: its (N, 4)
    xyxy pixel boxes and (N,) classes. ``progress(n)``: called after each batch of n images."""
    from ..image import load_image

    sizes = [image_hw(p) for p in images]
    known = [i for i, hw in enumerate(sizes) if hw is not None]
    order, shapes = batch_shapes([sizes[i] for i in known], batch, imgsz)
    stats = Stats()
    # yolo val's batches: images of one rect shape, in its (aspect-ratio) order.
    for start in range(0, len(order), batch):
        members = [known[i] for i in order[start:start + batch]]
        shape = tuple(int(v) for v in shapes[order[start]])
        items, truth = [], []
        for i in members:
            pixels = load_image(images[i])
            truth.append(labels(images[i], pixels.shape[1], pixels.shape[0]))
            items.append(yolo.prepare(pixels, imgsz, shape))
        head = yolo.head_outputs(items)
        for k, (item, (boxes, ids)) in enumerate(zip(items, truth)):
            input_boxes, _, scores, classes = yolo.val_detections(head[k], item, conf=conf, iou=iou, max_det=max_det)
            stats.add(match(input_boxes, scores, classes, item.to_input(boxes), ids, metric), scores, classes, ids)
        if progress is not None:
            progress(len(members))
    return ap_per_class(stats, metric)
