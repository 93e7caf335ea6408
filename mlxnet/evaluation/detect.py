"""A detector's mAP on labelled images, in one process, as ``mlxnet val detect`` measures it
(ultralytics' validation settings: rect letterbox batches, conf 0.001, IoU 0.7, max_det 300,
multi-label NMS, ultralytics' matching and AP): the per-epoch validation of ``mlxnet train detect``.
The same functions as the command, with reader threads of its own, without its output."""
from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .metrics import Result, Stats, ap_per_class, match
from .rect import batch_shapes, image_hw

# Threads decoding validation images (PIL and numpy release the interpreter lock while they work).
READERS = min(8, os.cpu_count() or 1)


class PreparedImages:
    """Images as :func:`evaluate` reads them (size, letterboxed pixels and labels), kept for the
    next evaluation of the same images: a training run validates one set every epoch, and
    decoding it again each time is most of a small set's validation. At most ``budget`` bytes
    of pixels are kept (the images met first); the others are read each time."""

    def __init__(self, budget: int = 256 << 20) -> None:
        self.budget, self.used = budget, 0
        self._sizes: dict[Path, tuple[int, int] | None] = {}
        self._items: dict[tuple, tuple[Any, tuple[np.ndarray, np.ndarray]]] = {}
        self._lock = threading.Lock()

    def size(self, path: Path) -> tuple[int, int] | None:
        if path not in self._sizes:
            self._sizes[path] = image_hw(path)
        return self._sizes[path]

    def get(self, key: tuple) -> tuple[Any, tuple[np.ndarray, np.ndarray]] | None:
        return self._items.get(key)

    def put(self, key: tuple, value: tuple[Any, tuple[np.ndarray, np.ndarray]], nbytes: int) -> None:
        with self._lock:
            if key not in self._items and self.used + nbytes <= self.budget:
                self._items[key] = value
                self.used += nbytes


def _done(value: Any) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


def evaluate(yolo: Any, images: Sequence[Path], labels: Callable[[Path, int, int], tuple[np.ndarray, np.ndarray]],
             *, imgsz: int = 640, batch: int = 16, conf: float = 0.001, iou: float = 0.7, max_det: int = 300,
             metric: str = "ultralytics", progress: Callable[[int], None] | None = None,
             readers: int = READERS, prepared: PreparedImages | None = None) -> Result:
    """``yolo``: a :class:`mlxnet.models.yolo.YOLO`; ``labels(image, width, height)``: its (N, 4)
    xyxy pixel boxes and (N,) classes. ``progress(n)``: called after each batch of n images.
    ``readers`` threads decode and letterbox the next batch's images while one is evaluated.
    ``prepared``: images read by an earlier call with the same images and settings, and where
    this call keeps what it reads (the labels are taken to be unchanged)."""
    from ..image import load_image

    sizes = [image_hw(p) if prepared is None else prepared.size(p) for p in images]
    known = [i for i, hw in enumerate(sizes) if hw is not None]
    order, shapes = batch_shapes([sizes[i] for i in known], batch, imgsz)
    # yolo val's batches: images of one rect shape, in its (aspect-ratio) order.
    plan = [([known[i] for i in order[start:start + batch]], tuple(int(v) for v in shapes[order[start]]))
            for start in range(0, len(order), batch)]

    def key(i: int, shape: tuple[int, int]) -> tuple:
        return images[i], shape, imgsz

    def read(i: int, shape: tuple[int, int]) -> tuple[Any, tuple[np.ndarray, np.ndarray]]:
        pixels = load_image(images[i])
        item = yolo.prepare(pixels, imgsz, shape)
        value = item, labels(images[i], pixels.shape[1], pixels.shape[0])
        if prepared is not None:
            prepared.put(key(i, shape), value, item.pixels.nbytes)
        return value

    stats = Stats()
    # The reader threads start with the first image not kept from an earlier call: where every
    # image is kept (a training run's later epochs) no thread is started, and none has to be
    # joined, each waiting its turn at the interpreter lock while the trainer's loader is busy.
    pool: ThreadPoolExecutor | None = None

    def submit(k: int) -> list[Future]:
        nonlocal pool
        futures = []
        for i in plan[k][0] if k < len(plan) else ():
            kept = None if prepared is None else prepared.get(key(i, plan[k][1]))
            if kept is None and pool is None:
                pool = ThreadPoolExecutor(max_workers=max(1, readers), thread_name_prefix="val-read")
            futures.append(_done(kept) if kept is not None else pool.submit(read, i, plan[k][1]))
        return futures

    try:
        ahead = submit(0)
        for k in range(len(plan)):
            current, ahead = ahead, submit(k + 1)  # one batch read ahead: memory stays two batches
            items, truth = zip(*(f.result() for f in current))
            head = yolo.head_outputs(items)
            found = yolo.val_detections_many(head[:len(items)], items, conf=conf, iou=iou, max_det=max_det)
            for item, (boxes, ids), (input_boxes, _, scores, classes) in zip(items, truth, found):
                stats.add(match(input_boxes, scores, classes, item.to_input(boxes), ids, metric), scores, classes, ids)
            if progress is not None:
                progress(len(items))
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return ap_per_class(stats, metric)
