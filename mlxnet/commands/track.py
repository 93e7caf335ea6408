"""`mlxnet track`: ultralytics' `yolo track` — YOLOv8 detection on each video frame, followed by
ByteTrack (:mod:`mlxnet.tracking`), each box labelled with its object's id. The frame pipeline is
detect's (:mod:`mlxnet.commands.video`); this command is `mlxnet detect --track` with tracking's
default confidence."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from mlxnet.commands import grammar
from mlxnet.commands.detect import (detector_weights, imgsz_option, iou_option, labels_option,
                                    max_det_option, max_frames_option, show_option, source_option)


def track(
    videos: Optional[List[str]] = typer.Argument(
        None, metavar="SOURCE...", show_default=False,
        help="Video files (.mp4, .mov, .mkv, .avi...), folders (searched recursively), quoted glob patterns "
             "('clips/*.mp4') or live sources (see --source)."),
    output: str = grammar.output("Folder for the annotated videos (inputs keep their relative paths below it); "
                                 "with one video, a path with a video extension (.mp4) is the file itself."),
    model: Optional[str] = grammar.model("yolov8n|s|m|l|x, yolo11n-x, yolo26n-x", "yolov8n"),
    weights: Optional[str] = detector_weights(),
    labels: Optional[Path] = labels_option(),
    # ultralytics' track lowers the detector's threshold to 0.1, so that ByteTrack's second
    # stage gets the low-scoring boxes (an occluded object's) it exists for.
    conf: float = typer.Option(0.1, "--conf", min=0.0, max=1.0, help="Detector confidence threshold."),
    iou: float = iou_option(),
    imgsz: int = imgsz_option(),
    max_det: int = max_det_option("frame"),
    classes: Optional[List[str]] = typer.Option(
        None, "--classes", metavar="IDS|NAMES",
        help="Track only these classes: ids or names, comma-separated or repeated.", show_default=False),
    vid_stride: int = typer.Option(1, "--vid-stride", min=1,
                                   help="Run on every N-th frame and write those (the rate divided by N)."),
    batch: int = grammar.batch(8),
    dtype: str = grammar.dtype(),
    device: Optional[str] = grammar.device(),
    as_json: bool = grammar.json_lines(),
    source: Optional[List[str]] = source_option(),
    max_frames: Optional[int] = max_frames_option(),
    show: bool = show_option(),
) -> None:
    """Track objects through each video with ByteTrack and write it with ids on the boxes to OUTPUT."""
    from mlxnet.commands.detect import detect

    detect(images=videos, output=output, model=model, weights=weights, labels=labels, conf=conf, iou=iou,
           imgsz=imgsz, max_det=max_det, classes=classes, save_txt=False, save_conf=False, save_crop=False,
           vid_stride=vid_stride, batch=batch, dtype=dtype, device=device, as_json=as_json, track=True,
           source=source, max_frames=max_frames, show=show)
