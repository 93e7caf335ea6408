"""`mlxnet detect`: YOLOv8 object detection; labelled boxes drawn on a copy of each image, and on
request ultralytics' extras: only some classes, YOLO label files, crops
(:mod:`mlxnet.commands.detect_outputs`)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, List, Optional

import numpy as np
import typer

from mlxnet.commands import grammar, video
from mlxnet.commands.images import Job, check_outputs, expand_inputs, load_model, mirror, names_one_file
from mlxnet.commands.pipeline import readers, run_jobs
from mlxnet.errors import MlxnetError
from mlxnet.video import VIDEO_EXTENSIONS


# The detector's options that `mlxnet track` shares (one declaration each).
def detector_weights() -> Any:
    return grammar.weights("the model's official checkpoint from the hub; files: ultralytics .pt or converted "
                           "safetensors")


def labels_option() -> Any:
    return typer.Option(None, "--labels", help="Class names: one per line, or a JSON list or {index: name} "
                                               "(default: the checkpoint's, else COCO's).")


def iou_option() -> Any:
    return typer.Option(0.7, "--iou", min=0.0, max=1.0, help="NMS IoU threshold.")


def imgsz_option() -> Any:
    return typer.Option(640, "--imgsz", help="Inference size (long side, multiple of 32).")


def max_det_option(per: str) -> Any:
    return typer.Option(300, "--max-det", min=1, help=f"Most detections per {per}.")


# Live sources and their limits, shared with `mlxnet track`.
def source_option() -> Any:
    return typer.Option(None, "--source", metavar="SOURCE",
                        help="A source besides SOURCE...: a video or image, or a live one: camera:N (AVFoundation on "
                             "macOS, V4L2 on Linux), an rtsp:// or http(s):// stream URL, lavfi:GRAPH (FFmpeg's "
                             "synthetic sources). A live source runs until Ctrl+C or --max-frames.",
                        show_default=False)


def max_frames_option() -> Any:
    return typer.Option(None, "--max-frames", min=1, metavar="N",
                        help="Videos: stop each after N frames run (the end of a live source).")


def show_option() -> Any:
    return typer.Option(False, "--show", help="Videos: show the annotated frames in a window as they are written "
                                              "(q stops a live source; needs OpenCV with GUI support).")


def detect(
    images: Optional[List[str]] = typer.Argument(
        None, metavar="SOURCE...", show_default=False,
        help=grammar.SOURCES_HELP + " Video files (.mp4, .mov, .mkv, .avi...) too, alone or in folders and patterns: "
             "each written annotated, frame by frame; and live sources (see --source)."),
    output: str = grammar.output(grammar.OUTPUT_HELP + " With one video, a path with a video extension (.mp4)."),
    model: Optional[str] = grammar.model("yolov8n|s|m|l|x, yolo11n-x, yolo26n-x; each also -seg and -pose", "yolov8n"),
    weights: Optional[str] = detector_weights(),
    labels: Optional[Path] = labels_option(),
    conf: float = typer.Option(0.25, "--conf", min=0.0, max=1.0, help="Confidence threshold."),
    iou: float = iou_option(),
    imgsz: int = imgsz_option(),
    max_det: int = max_det_option("image"),
    classes: Optional[List[str]] = typer.Option(
        None, "--classes", metavar="IDS|NAMES",
        help="Keep only these classes: ids or names, comma-separated or repeated (--classes 0,2, "
             "--classes person --classes bus); the others are dropped before NMS, as ultralytics' classes= does.",
        show_default=False),
    save_txt: bool = typer.Option(False, "--save-txt",
                                  help="Also write YOLO labels to OUTPUT/labels/NAME.txt: 'class cx cy w h' "
                                       "normalised to 0-1, one line per detection (a -seg model: the mask's "
                                       "outline 'class x1 y1 x2 y2 ...'; a -pose model: the box, then 'x y "
                                       "visibility' per keypoint)."),
    save_conf: bool = typer.Option(False, "--save-conf", help="With --save-txt: end each line with the score."),
    save_crop: bool = typer.Option(False, "--save-crop",
                                   help="Also save each detection's crop as OUTPUT/crops/CLASS/NAME.jpg (NAME_2.jpg... "
                                        "for more of one class)."),
    batch: int = grammar.batch(8),
    dtype: str = grammar.dtype(),
    device: Optional[str] = grammar.device(),
    as_json: bool = grammar.json_lines(),
    vid_stride: int = typer.Option(1, "--vid-stride", min=1,
                                   help="Videos: run on every N-th frame and write those (the rate divided by N)."),
    track: bool = typer.Option(False, "--track", help="Videos: follow objects with ByteTrack and label each "
                                                      "box with its track id (as `mlxnet track`)."),
    source: Optional[List[str]] = source_option(),
    max_frames: Optional[int] = max_frames_option(),
    show: bool = show_option(),
) -> None:
    """Detect objects in each image or video and write a labelled copy to OUTPUT.

    A segment checkpoint (yolo11n-seg, a custom -seg .pt) adds each object's mask, a pose
    checkpoint (yolov8n-pose...) its keypoints: drawn, in --json and in --save-txt."""
    grammar.apply_device(device)
    grammar.check_dtype(dtype)
    import mlxnet
    from mlxnet import families
    from mlxnet.commands import detect_outputs as extras
    from mlxnet.image import load_image, save_image
    from mlxnet.weights import read_labels

    family = families.for_task(model or "yolov8n", "detect")
    if imgsz < 32 or imgsz % 32:
        raise MlxnetError(f"--imgsz must be a positive multiple of 32, got {imgsz}")
    names = read_labels(labels) if labels is not None else None
    # Videos (files, or found in folders and patterns) go through the frame pipeline; the rest are images.
    arguments = [*(images or []), *(source or [])]
    if not arguments:
        raise MlxnetError("no source: give SOURCE... or --source (a file, folder, pattern, URL or camera:N)")
    images, videos = video.split_sources(arguments, Path(output))
    if track and images:
        raise MlxnetError(f"{images[0]}: tracking follows objects through a video; this is no video file "
                          f"(extensions: {', '.join(sorted(VIDEO_EXTENSIONS))})")
    one_file = names_one_file(images, output)
    if one_file:
        jobs = [Job(source, (Path(output),)) for source in expand_inputs(images)]
    else:
        jobs = [Job(source, (mirror(source, Path(output)),)) for source in expand_inputs(images, skip=Path(output))]
    check_outputs(jobs)
    video_jobs = video.video_jobs(videos, output, video.names_one_video(arguments, output))
    video.check_video_outputs(video_jobs, jobs)
    more = extras.ExtraOutputs(jobs, Path(output), one_file, save_txt=save_txt, save_conf=save_conf,
                               save_crop=save_crop)
    wanted: list[list[int] | None] = [None]  # --classes as ids, once the model's names are known
    # On a GPU a short batch runs padded to the full size: one traced shape per letterbox shape.
    fixed_batch = batch if batch > 1 and mlxnet.backend() != "cpu" else None

    loaded: list = []

    def load():
        if not loaded:  # once, whether images or videos need it first
            detector = load_model(lambda: family.predictor(weights, model, dtype, names=names))
            if classes:
                wanted[0] = extras.resolve_classes(classes, detector.names)
            loaded.append(detector)
        return loaded[0]

    def prepare(job: Job) -> tuple[np.ndarray, Any]:
        image = load_image(job.source.path)
        return image, family.prepare(image, imgsz=imgsz)  # the letterboxed pixels, on a reader thread

    def finish(job: Job, item: tuple[np.ndarray, Any], det) -> tuple[dict, str]:
        image, target = item[0], job.outputs[0]
        save_image(det.render(image), target, source=job.source.path)
        written = more.write(job, image, det)
        # The detections' record only where it is printed: a segment model's outlines need every
        # mask's pixels on the host.
        record = {"output": str(target), "width": image.shape[1], "height": image.shape[0], **written,
                  **(det.to_dict() if as_json else {})}
        return record, f"{job.name}: {det.summary()} -> {', '.join([str(target), *more.summary(written)])}"

    def predict(detector, boxed: list) -> list:
        # A segment model's mask pixels are made only where something reads them (the JSON
        # record's outlines, --save-txt); drawing needs only their layer.
        return detector.predict_prepared(boxed, conf=conf, iou=iou, max_det=max_det, classes=wanted[0],
                                         batch_size=fixed_batch, mask_pixels=as_json or save_txt)

    images_failed = False
    if jobs:
        try:
            run_jobs(
                jobs, batch, what="detect", as_json=as_json, load=load,
                prepare=prepare,
                predict=lambda detector, items: predict(detector, [boxed for _, boxed in items]),
                finish=finish,
                group=lambda item: item[1].pixels.shape,  # a batch is one letterbox shape: one forward
                writers=readers())  # each image's drawing and files are its own: written side by side
        except typer.Exit as e:
            if not video_jobs or not e.exit_code:
                raise
            images_failed = True  # reported; the videos still run
    if video_jobs:
        failed = video.run_videos(video_jobs, batch=batch, what="track" if track else "detect", as_json=as_json,
                                  model=load, prepare=lambda rgb: family.prepare(rgb, imgsz=imgsz),
                                  predict=predict, track=track, stride=vid_stride, max_frames=max_frames,
                                  show=show)
        if failed and len(video_jobs) > 1:
            print(f"{failed} of {len(video_jobs)} videos failed", file=sys.stderr, flush=True)
        if failed or images_failed:
            raise typer.Exit(1)
