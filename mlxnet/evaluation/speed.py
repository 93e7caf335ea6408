"""Where a validation run's time goes: images per second of wall time, and per image the time
spent decoding (reading, decoding, letterboxing or cropping, on the reader threads: summed over
them, so it may exceed its share of the wall time), in the forward pass (the batch's forward,
waited for) and in NMS (or, for a classifier, the top-k), as ``yolo val`` prints its speed line."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator

STAGES = ("decode", "forward", "nms")
_SHOWN = {"nms": "NMS", "topk": "top-k"}


class Speed:
    """Seconds per stage, summed over threads; the wall clock starts at construction. Also the
    image commands' timings line (:class:`mlxnet.commands.pipeline.StageTimes`)."""

    def __init__(self, stages: tuple[str, ...] = STAGES) -> None:
        self.start = time.perf_counter()
        self.end: float | None = None
        self.seconds = dict.fromkeys(stages, 0.0)
        self._lock = threading.Lock()

    def add_since(self, stage: str, since: float) -> None:
        """Add the time from ``since`` (a ``time.perf_counter()`` reading) to now to ``stage``."""
        self.add(stage, time.perf_counter() - since)

    def add(self, stage: str, seconds: float) -> None:
        with self._lock:  # readers add their times from several threads
            self.seconds[stage] += seconds

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        since = time.perf_counter()
        try:
            yield
        finally:
            self.add_since(stage, since)

    def stop(self) -> None:
        self.end = time.perf_counter()

    @property
    def wall(self) -> float:
        return (self.end if self.end is not None else time.perf_counter()) - self.start

    def summary(self, images: int) -> dict:
        """JSON-ready: images, wall seconds, images/s, and milliseconds per image in each stage."""
        per = 1e3 / max(images, 1)
        return {"images": images, "seconds": round(self.wall, 4),
                "images_per_s": round(images / self.wall, 3) if self.wall > 0 else 0.0,
                **{f"{stage}_ms": round(s * per, 3) for stage, s in self.seconds.items()}}

    def line(self, images: int) -> str:
        s = self.summary(images)
        stages = ", ".join(f"{_SHOWN.get(stage, stage)} {s[f'{stage}_ms']:.1f} ms" for stage in self.seconds)
        return f"Speed: {s['images_per_s']:.1f} images/s ({images} in {s['seconds']:.2f} s); per image {stages}"
