"""Ultralytics YOLOv8 detection (n/s/m/l/x), NHWC, with ultralytics' pre/post-processing.

Architecture (ultralytics/cfg/models/v8/yolov8.yaml): a CSP backbone of Conv(BN+SiLU) and C2f
blocks ending in SPPF, a PAN neck (nearest x2 upsampling + concatenation, then strided convs
back down), and a decoupled anchor-free Detect head on strides 8/16/32 whose box branch
predicts a 16-bin distribution per side, decoded by DFL (softmax expectation).

Parameters live in one list ``model`` indexed like the yaml's rows, so the official
checkpoint keys (``model.2.m.0.cv1.conv.weight``, ``model.22.dfl.conv.weight``...) are ours.

    det = YOLO.from_pretrained("yolov8n")
    result = det.predict("bus.jpg")          # Detections: boxes (xyxy, pixels), scores, classes
"""
from __future__ import annotations

import itertools
import os
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlxnet import families
from mlxnet.errors import MlxnetError
from mlxnet.image import ImageInput, as_rgb, as_rgb_images
from mlxnet.weights import (Checkpoint, count_mismatch, Description, FoldBN, Record, WeightSpec, load_variant, names_of,
                            random_init, register_spec)

from .yolo_arch import ARCHITECTURES, COCO_KEYPOINTS, TASKS, YOLONet, best_pairs, layout_of, task_architecture
from .yolo_blocks import BN_EPS, STRIDES, _make_divisible  # noqa: F401  (STRIDES: the trainer reads it here)
from .yolo_instances import InstanceMasks, instance_masks, keypoints_to_image
from .yolo_val import detections_many as val_detections_many
from .yolo_process import (MASK_ALPHA, Detections, Letterboxed, class_colours, coco80_names, end2end_detections,
                           letterbox, letterbox_to, postprocess_batch)

if TYPE_CHECKING:
    from mlxnet.tracking import TrackerSettings
    from mlxnet.video import FrameResult

# [depth, width, max_channels] per scale, from yolov8.yaml.
SCALES: dict[str, tuple[float, float, int]] = {s: tuple(v) for s, v in ARCHITECTURES["yolov8"]["scales"].items()}
class YOLOv8(YOLONet):
    """The YOLOv8 detection network (ultralytics' yolov8.yaml at ``scale``): the builder's
    network, the class the training code and the v8 goldens name."""

    def __init__(self, scale: str = "n", nc: int = 80, fold_bn: bool = False) -> None:
        if scale not in SCALES:
            raise MlxnetError(f"unknown YOLOv8 scale {scale!r}: expected one of {', '.join(SCALES)}")
        super().__init__(ARCHITECTURES["yolov8"], scale, nc, fold_bn, family="yolov8")


def yolov8n(nc: int = 80) -> YOLOv8:
    return YOLOv8("n", nc)


def yolov8s(nc: int = 80) -> YOLOv8:
    return YOLOv8("s", nc)


def yolov8m(nc: int = 80) -> YOLOv8:
    return YOLOv8("m", nc)


def yolov8l(nc: int = 80) -> YOLOv8:
    return YOLOv8("l", nc)


def yolov8x(nc: int = 80) -> YOLOv8:
    return YOLOv8("x", nc)


# --- Weights -----------------------------------------------------------------------------------
# The official checkpoints are pickled ultralytics DetectionModel objects (fp16) under "model";
# the safe reader flattens the module tree into the usual state dict, whose keys are ours.
# The families the architecture builder (models/yolo_arch.py) makes: YOLOv8's own class (its
# layers fixed, the training code's network) and YOLO11 / YOLO26 built from their architectures.
FAMILIES = ("yolov8", "yolo11", "yolo26")
MODELS = tuple(f"{family}{s}{suffix}" for suffix in TASKS.values() for family in FAMILIES for s in SCALES)
_STEM = "model.0.conv.weight"  # output axis: the width, which names the scale
_HEAD = {"yolov8": 22, "yolo11": 23, "yolo26": 23}  # the Detect row
_DISPLAY = {"yolov8": "YOLOv8", "yolo11": "YOLO11", "yolo26": "YOLO26"}


def _family_of(ckpt: Checkpoint, shapes: dict, yaml: dict) -> str:
    """Which family a checkpoint holds: mlxnet's metadata, else the ultralytics yaml's modules,
    else the tensors (YOLO11's depthwise class branch; YOLO26's one-to-one head)."""
    said = ckpt.metadata.get("model", "") if ckpt.converted else ""
    for family in FAMILIES:
        if said.startswith(family):
            return family
    rows = [r for r in list(yaml.get("backbone", [])) + list(yaml.get("head", [])) if isinstance(r, list) and len(r) > 2]
    if rows:
        if yaml.get("end2end") or int(yaml.get("reg_max", 16)) == 1:
            return "yolo26"
        return "yolo11" if any(r[2] == "C3k2" for r in rows) else "yolov8"
    if any(k.startswith("model.23.one2one_cv2.") for k in shapes):
        return "yolo26"
    return "yolo11" if "model.23.cv3.0.0.0.conv.weight" in shapes else "yolov8"


def _yaml_and_names(ckpt: Checkpoint) -> tuple[dict, object]:
    """The model's yaml dict and names as a pickled ultralytics model carries them ({} / None)."""
    raw = ckpt.raw
    net = raw.get("ema") or raw.get("model") if isinstance(raw, dict) else raw
    attrs = net.attrs if isinstance(net, Record) else {}
    yaml = attrs.get("yaml") if isinstance(attrs.get("yaml"), dict) else {}
    return yaml, attrs.get("names")


def describe_checkpoint(ckpt: Checkpoint) -> Description:
    """Family, scale, task, class count and names of a YOLOv8 / YOLO11 / YOLO26 checkpoint (detect,
    segment or pose; a pose model's keypoint shape too):
    from mlxnet metadata, an ultralytics pickle's ``yaml``/``names``, and the tensors' shapes (the
    stem's width and the depth of the first C2f / C3k2 give the scale, the class branch's last
    conv the class count), which must agree."""
    from .yolo_arch import ARCHITECTURES

    shapes = ckpt.shapes()
    yaml, names = _yaml_and_names(ckpt)
    family = _family_of(ckpt, shapes, yaml)
    head = f"model.{_HEAD[family]}"
    task = next((t for t, mark in (("segment", ".proto."), ("pose", ".cv4")) if any(k.startswith(head + mark) for k in shapes)),
                "detect")
    said_model = ckpt.metadata.get("model", "") if ckpt.converted else ""
    if said_model in MODELS and split_variant(said_model)[2] != task:
        raise MlxnetError(f"{ckpt.path}: its metadata says it holds a {said_model}, but its tensors are a {task} "
                          f"model's")
    classes = f"model.{_HEAD[family]}.cv3.0.2.weight"
    if _STEM not in shapes or classes not in shapes:
        found = ", ".join(list(shapes)[:3]) or "no tensors"
        raise MlxnetError(f"{ckpt.path}: not a {_DISPLAY[family]} detection checkpoint (no {_STEM if _STEM not in shapes else classes}; "
                          f"found {len(shapes)} tensors: {found}, ...)")
    width = shapes[_STEM][0]
    scales = SCALES if family == "yolov8" else ARCHITECTURES[family]["scales"]
    # Scales of one width (YOLO11's m and l) differ in depth: l repeats its first C3k2's block.
    fits = [s for s, (depth, w, _) in scales.items() if _make_divisible(64 * w) == width]
    if len(fits) > 1:
        fits = [s for s in fits if ("model.2.m.1.cv1.conv.weight" in shapes) == (round(2 * scales[s][0]) > 1)]
    if len(fits) != 1:
        widths = ", ".join(str(_make_divisible(64 * w)) for _, w, _ in scales.values())
        raise MlxnetError(f"{ckpt.path}: a {_DISPLAY[family]} stem {width} channels wide fits no scale "
                          f"(n, s, m, l, x have {widths})")
    scale, nc = fits[0], shapes[classes][0]
    if ckpt.converted:
        names = ckpt.meta_json("names")
    said = {"scale": yaml.get("scale"), "nc": yaml.get("nc")}
    for key, value in (("scale", scale), ("nc", nc)):
        if said[key] is not None and said[key] != value:
            raise MlxnetError(f"{ckpt.path}: its yaml says {key}={said[key]!r} but its tensors are for {key}={value!r}")
    names = names_of(names, str(ckpt.path)) if names is not None else None
    if names is not None and len(names) != nc:
        raise MlxnetError(f"{ckpt.path}: {count_mismatch(names, nc)}")
    config: dict[str, Any] = {"nc": nc}
    if task == "pose":
        config["kpt_shape"] = _keypoint_shape(ckpt, shapes, yaml, head)
    return Description(f"{family}{scale}{TASKS[task]}", config, names)


def _keypoint_shape(ckpt: Checkpoint, shapes: dict, yaml: dict, head: str) -> tuple[int, int]:
    """A pose checkpoint's (keypoints, dims): its yaml's or metadata's ``kpt_shape``, which must fit
    the keypoint branch's width; without one, 3 dims (x, y, visibility) where the width allows."""
    width = next(shapes[k][0] for k in (f"{head}.cv4_kpts.0.weight", f"{head}.cv4.0.2.weight") if k in shapes)
    said = yaml.get("kpt_shape") or (ckpt.meta_json("kpt_shape") if ckpt.converted else None)
    if said is not None:
        shape = tuple(int(v) for v in said)
        if len(shape) != 2 or shape[1] not in (2, 3) or shape[0] * shape[1] != width:
            raise MlxnetError(f"{ckpt.path}: kpt_shape {list(shape)} does not fit its keypoint branch of {width} outputs")
        return shape  # type: ignore[return-value]
    return (width // 3, 3) if width % 3 == 0 else (width // 2, 2)


def split_variant(variant: str) -> tuple[str, str, str]:
    """A model id's (family, scale, task): ``yolo11s-seg`` -> (yolo11, s, segment)."""
    base, _, suffix = variant.partition("-")
    task = next((t for t, tail in TASKS.items() if tail == (f"-{suffix}" if suffix else "")), None)
    family, scale = base[:-1], base[-1:]
    if family not in FAMILIES or scale not in SCALES or task is None:
        raise MlxnetError(f"unknown model {variant!r}: expected one of {', '.join(MODELS)}")
    return family, scale, task


def build_variant(variant: str, nc: int = 80, fold_bn: bool = False,
                  kpt_shape: Sequence[int] = COCO_KEYPOINTS) -> YOLONet:
    """The network of a model id (``yolov8s``, ``yolo11n-seg``, ``yolo26m-pose``...) for ``nc``
    classes (and a pose model's ``kpt_shape`` keypoints)."""
    family, scale, task = split_variant(variant)
    if family == "yolov8" and task == "detect":
        return YOLOv8(scale, nc, fold_bn=fold_bn)
    return YOLONet(task_architecture(family, task, kpt_shape), scale, nc, fold_bn, family=family)


_REPOS = {"yolov8": "Ultralytics/YOLOv8", "yolo11": "Ultralytics/YOLO11", "yolo26": "Ultralytics/YOLO26"}
for _id in MODELS:
    register_spec(WeightSpec(
        id=_id, repo=_REPOS[split_variant(_id)[0]], filename=f"{_id}.pt", checkpoint_key=None,
        keys=[(r"(model\.\d+\..*)", r"\1")],
        # Training-only parts: batch counters, YOLO26-pose's flow model.
        drop=[r".*\.num_batches_tracked", r".*\.flow_model\..*"],
        layouts=lambda key, shape: layout_of(key, tuple(shape)) if len(shape) == 4 else None,
        fold_bn=[FoldBN(r"(.*(?<!\.dfl))\.conv", r"\1.bn", eps=BN_EPS)],
        build=lambda fold_bn=False, nc=80, kpt_shape=COCO_KEYPOINTS, _id=_id: build_variant(_id, nc, fold_bn, kpt_shape),
        describe=describe_checkpoint,
    ))


def seeded_torch_state(scale: str, seed: int, bn_gain: float = 1.0, head_gain: float = 20.0,
                       nc: int = 80) -> dict[str, np.ndarray]:
    """Deterministic random weights in the official checkpoint's keys and PyTorch layouts, exactly
    as scripts/goldens/golden_yolo.py gives ultralytics (mlxnet.weights.seeded.seeded_yolo_state)."""
    from mlx.utils import tree_flatten

    from mlxnet.weights.seeded import seeded_yolo_state

    shapes = [(k, (v.shape[0], v.shape[3], v.shape[1], v.shape[2]) if v.ndim == 4 else v.shape)
              for k, v in tree_flatten(YOLOv8(scale, nc).parameters())]
    return seeded_yolo_state(shapes, seed, bn_gain, head_gain)


def seeded(scale: str = "n", seed: int = 1234, bn_gain: float = 1.0, head_gain: float = 20.0) -> YOLOv8:
    """A YOLOv8 with :func:`seeded_torch_state` weights, converted by its WeightSpec."""
    from mlxnet.weights import convert_state_dict, load_into

    state = {k: mx.array(v) for k, v in seeded_torch_state(scale, seed, bn_gain, head_gain).items()}
    return load_into(YOLOv8(scale), convert_state_dict(state, f"yolov8{scale}"))


ImageLike = ImageInput  # a path, a PIL image, a NumPy or MLX array (mlxnet.image.as_rgb)
# A video file's path, a live source ("camera:0", a stream URL), or an iterator of frames (mlxnet.video)
VideoSource = str | os.PathLike | Iterable[ImageLike]


def _letterboxed(pixels: np.ndarray, imgsz: int) -> Letterboxed:
    """Pixels already checked as RGB (:func:`mlxnet.image.as_rgb`), letterboxed for the network."""
    return Letterboxed(pixels.shape[:2], letterbox(pixels, imgsz))


class YOLO:
    """A YOLOv8 detector with ultralytics' predictor pipeline around the network.

    ``predict`` letterboxes (stride-32 minimum rectangle, grey 114), runs the network, keeps
    boxes above ``conf``, applies class-aware NMS (``iou``, ``max_det``) and maps the boxes back
    onto the original image.
    """

    def __init__(self, net: YOLOv8, names: Sequence[str] | None = None) -> None:
        self.net = net
        if names is None:  # COCO's for the 80-class models, else the class indices
            names = coco80_names() if net.nc == 80 else tuple(f"class{i}" for i in range(net.nc))
        if len(names) != net.nc:
            raise MlxnetError(count_mismatch(names, net.nc))
        self.names = tuple(names)

    @classmethod
    def from_pretrained(cls, weights: str | os.PathLike = "yolov8n", *, model: str | None = None,
                        dtype: str | None = "float32", fuse: bool = True,
                        names: Sequence[str] | None = None) -> "YOLO":
        """Weights by id ("yolov8n": the official checkpoint from the hub) or by file: an
        ultralytics .pt (custom-trained included), a file from ``mlxnet convert`` or from
        ``YOLOv8.save_weights``. The scale, class count and class names come from the
        checkpoint; ``model``, if given, must agree; ``names`` overrides the class names.
        Float weights are cast to ``dtype`` (ultralytics' files are fp16)."""
        net, found = load_variant(weights, MODELS, model=model, dtype=dtype)
        return cls(net.fuse() if fuse else net, names if names is not None else found.names)

    @staticmethod
    def prepare(image: ImageLike, imgsz: int = 640, shape: tuple[int, int] | None = None) -> Letterboxed:
        """The host half of preprocessing, for one image: its pixels (see
        :func:`mlxnet.image.as_rgb`) letterboxed for the network. Host work only (OpenCV, NumPy),
        so it may run on reader threads while the device runs another batch. ``shape``: letterbox
        to this (H, W), as ``yolo val`` does to a rect batch's shape (:func:`letterbox_to`);
        None: the smallest stride-32 rectangle around the image scaled to ``imgsz``."""
        pixels = as_rgb(image, "YOLO.predict")
        if shape is None:
            return _letterboxed(pixels, imgsz)
        boxed, ratio_pad = letterbox_to(pixels, imgsz, shape)
        return Letterboxed(pixels.shape[:2], boxed, ratio_pad)

    def predict(self, images: ImageLike | Sequence[ImageLike] | VideoSource, *, conf: float = 0.25,
                iou: float = 0.7, imgsz: int = 640, max_det: int = 300, agnostic: bool = False,
                classes: Sequence[int] | None = None, batch: int = 1, nms: bool = True
                ) -> Detections | list[Detections] | Iterator[FrameResult]:
        """Detections for one image (a path, a PIL image, or an (H, W, 3) NumPy / MLX array: see
        :func:`mlxnet.image.as_rgb`), or a list for a list. A list runs as batches of the images
        whose letterboxed shapes agree; each image's boxes are those it gets alone, up to
        floating-point rounding (a batch's convolutions may sum in another order). ``classes``:
        class ids to keep (the others are dropped before NMS, as ultralytics' ``classes=`` does).
        ``nms=False``: an end-to-end model's (YOLO26's) one-to-one head, whose best ``max_det``
        (anchor, class) pairs need no NMS, as ultralytics' ``nms=False`` (``iou`` and
        ``agnostic`` then play no part).

        A video (a file path with a video extension; a live source: ``camera:N``, a stream URL,
        ``lavfi:GRAPH``) or an iterator of frames (a generator of images) gives a generator of
        :class:`mlxnet.video.FrameResult`, one per frame in order, run ``batch`` frames at a time:
        frames are decoded (and letterboxed, on a thread) only a few ahead of the model, so a long
        video or an endless camera is never held in memory (:mod:`mlxnet.video` reads them)."""
        from mlxnet.video import is_video_source

        if is_video_source(images):
            return self._frames(images, "YOLO.predict", None, conf=conf, iou=iou, imgsz=imgsz,
                                max_det=max_det, agnostic=agnostic, classes=classes, batch=batch)
        pixels, single = as_rgb_images(images, "YOLO.predict")
        results = self.predict_prepared([_letterboxed(p, imgsz) for p in pixels], conf=conf, iou=iou,
                                        max_det=max_det, agnostic=agnostic, classes=classes, nms=nms)
        return results[0] if single else results

    def track(self, source: VideoSource | Sequence[ImageLike], *, conf: float = 0.1, iou: float = 0.7,
              imgsz: int = 640, max_det: int = 300, agnostic: bool = False, classes: Sequence[int] | None = None,
              batch: int = 1, tracker: TrackerSettings | None = None) -> Iterator[FrameResult]:
        """:meth:`predict` on a video, a live source or frames (an iterator or a list, in order),
        followed by ByteTrack (:class:`mlxnet.tracking.ByteTracker`, ultralytics' settings unless
        ``tracker`` says): a generator of :class:`mlxnet.video.FrameResult` whose detections are
        those of confirmed tracks and whose ``ids`` are their track ids. ``conf`` defaults to 0.1,
        as ultralytics' ``track``, so that ByteTrack's second stage gets low-scoring boxes. The
        lost-track buffer scales with the video's frame rate (30 frames/s for frames given as
        images)."""
        from mlxnet.tracking import ByteTracker
        from mlxnet.video import is_video_source

        if not is_video_source(source) and not (isinstance(source, Sequence) and not isinstance(source, str)):
            raise MlxnetError(f"YOLO.track: expected a video path, a live source, or frames (an iterator or a "
                              f"list of images); got {type(source).__name__}")
        return self._frames(source if is_video_source(source) else iter(source), "YOLO.track",
                            lambda fps: ByteTracker(frame_rate=fps, settings=tracker), conf=conf, iou=iou,
                            imgsz=imgsz, max_det=max_det, agnostic=agnostic, classes=classes, batch=batch)

    def _frames(self, source: VideoSource, what: str, make_tracker: Callable[[float], Any] | None, *,
                imgsz: int, batch: int, **options: Any) -> Iterator[FrameResult]:
        """Frames through the model ``batch`` at a time (and the tracker, in order): the source is
        opened now, so a bad one fails at the call; frames are read as the generator is advanced."""
        from mlxnet.video import FrameResult, open_frames, read_ahead

        if batch < 1:
            raise MlxnetError(f"{what}: batch must be at least 1, got {batch}")
        info, frames = open_frames(source, what)
        prepared: Iterator = ((f, _letterboxed(f.rgb, imgsz)) for f in frames)
        if info is not None:  # a file or stream: decoding and the letterbox run ahead on a thread
            prepared = read_ahead(prepared, depth=max(2 * batch, 4))
        tracker = make_tracker(float(info.fps) if info is not None else 30.0) if make_tracker else None

        def run() -> Iterator[FrameResult]:
            while members := list(itertools.islice(prepared, batch)):
                found = self.predict_prepared([boxed for _, boxed in members], **options)
                for (frame, _), det in zip(members, found):
                    ids = None
                    if tracker is not None:
                        det, ids = tracker.update_detections(det)
                    yield FrameResult(frame, det, ids)
        return run()

    def predict_prepared(self, items: Sequence[Letterboxed], *, conf: float = 0.25, iou: float = 0.7,
                         max_det: int = 300, agnostic: bool = False, classes: Sequence[int] | None = None,
                         batch_size: int | None = None, nms: bool = True,
                         mask_pixels: bool = True) -> list[Detections]:
        """:meth:`predict` for images already through :meth:`prepare`: one forward per letterbox
        shape, one transfer back to the host per forward. ``batch_size``: run every forward at
        this batch size, a short batch filled up with copies of its last image (their results
        dropped). ``mask_pixels=False``: a segment model's masks are made to be drawn only
        (:func:`.yolo_instances.instance_masks`' ``pixels``), for a caller that never reads them.
        On a GPU each new input shape costs a trace and convolution plans, many times a forward,
        so a folder then costs one per letterbox shape, not one per shape and count."""
        if not nms and not hasattr(self.net.head, "one2one_cv2"):
            raise MlxnetError("nms=False needs an end-to-end model's one-to-one head (YOLO26); this model has none")
        same_shape: dict[tuple[int, ...], list[int]] = {}
        for i, item in enumerate(items):
            same_shape.setdefault(item.pixels.shape, []).append(i)
        results: list[Detections] = [None] * len(items)  # type: ignore[list-item]
        for members in same_shape.values():
            rows = [items[i].pixels for i in members]
            rows += rows[-1:] * max(0, (batch_size or 0) - len(rows))
            if self.net.task != "detect":
                found_instances = self._instances(rows, [items[i] for i in members], conf=conf, iou=iou,
                                                  max_det=max_det, agnostic=agnostic, classes=classes, nms=nms,
                                                  mask_pixels=mask_pixels)
                for i, det in zip(members, found_instances):
                    results[i] = det
                continue
            if nms:
                found = postprocess_batch(self._forward(rows), conf=conf, iou=iou, max_det=max_det,
                                          agnostic=agnostic, classes=classes, images=len(members))
            else:
                found = end2end_detections(self._end2end(rows, max_det), conf=conf, classes=classes)[:len(members)]
            for i, det in zip(members, found):
                results[i] = Detections(items[i].to_image(det[:, :4]), det[:, 4], det[:, 5].astype(np.int32),
                                        self.names)
        return results

    def _instances(self, pixels: Sequence[np.ndarray], items: Sequence[Letterboxed], *, conf: float, iou: float,
                   max_det: int, agnostic: bool, classes: Sequence[int] | None, nms: bool,
                   mask_pixels: bool = True) -> list[Detections]:
        """A segment or pose model's detections, each with its mask or keypoints
        (:mod:`.yolo_instances`)."""
        out = self.net.task_outputs(self._input(pixels), one2one=not nms)
        if nms:
            found = postprocess_batch(out["detections"], conf=conf, iou=iou, max_det=max_det, agnostic=agnostic,
                                      classes=classes, images=len(items), anchors=True)
        else:
            d = out["detections"].astype(mx.float32)
            rows, anchors = best_pairs(mx.concatenate([d[..., :2] - d[..., 2:4] / 2, d[..., :2] + d[..., 2:4] / 2], -1),
                                       d[..., 4:], max_det)
            found = end2end_detections(rows, conf=conf, classes=classes, anchors=anchors)[:len(items)]
        extras = {k: v for k, v in out.items() if k != "detections"}
        results = []
        for b, (item, (det, anchor)) in enumerate(zip(items, found)):
            boxes = item.to_image(det[:, :4])
            masks = keypoints = None
            if "protos" in extras:
                masks = self._masks(extras, b, anchor, boxes, item, class_colours(det[:, 5]), pixels=mask_pixels)
                keep = masks.non_empty()  # as ultralytics: a detection whose mask is empty is dropped
                det, boxes, masks = det[keep], boxes[keep], masks[keep]
            else:
                keypoints = self.val_instances(extras, b, anchor, boxes, item)
            results.append(Detections(boxes, det[:, 4], det[:, 5].astype(np.int32), self.names, masks, keypoints))
        return results

    def _forward(self, pixels: Sequence[np.ndarray]) -> mx.array:
        """The network on letterboxed uint8 images of one shape (lazy: evaluated by the caller)."""
        return self.net(self._input(pixels))

    def _end2end(self, pixels: Sequence[np.ndarray], max_det: int) -> mx.array:
        return self.net.end2end(self._input(pixels), max_det)

    def _input(self, pixels: Sequence[np.ndarray]) -> mx.array:
        batch = np.stack(pixels) if len(pixels) > 1 else pixels[0][None]
        # uint8 crosses to the device (a quarter of float32's bytes) and is scaled there.
        return mx.array(batch).astype(self.net.model[0].conv.weight.dtype) / 255

    def head_outputs(self, items: Sequence[Letterboxed]) -> np.ndarray:
        """The raw head output (B, A, 4 + nc) float32 for letterboxed images of one shape, on the
        host: what an evaluation thresholds and suppresses its own way (:meth:`val_detections`)."""
        head = self._forward([item.pixels for item in items])
        return np.array(head.astype(mx.float32))  # MLX is lazy: the forward runs here

    def val_detections(self, head: np.ndarray, item: Letterboxed, *, conf: float = 0.001, iou: float = 0.7,
                       max_det: int = 300, multi_label: bool = True, anchors: bool = False
                       ) -> tuple[np.ndarray, ...]:
        """One image's head output -> its detections as ``yolo val`` makes them
        (:mod:`.yolo_val`): xyxy boxes on the network input, the same on the image (clipped),
        scores and classes, highest score first (``anchors``: and each one's anchor)."""
        return self.val_detections_many([head], [item], conf=conf, iou=iou, max_det=max_det,
                                        multi_label=multi_label, anchors=anchors)[0]

    def val_detections_many(self, heads: Sequence[np.ndarray], items: Sequence[Letterboxed], *, conf: float = 0.001,
                            iou: float = 0.7, max_det: int = 300, multi_label: bool = True, anchors: bool = False
                            ) -> list[tuple[np.ndarray, ...]]:
        """:meth:`val_detections` of a batch's images (their NMS launched together)."""
        found = val_detections_many(heads, conf=conf, iou=iou, max_det=max_det, multi_label=multi_label,
                                    anchors=anchors)
        return [(boxes, item.to_image(boxes), scores, classes, *where)
                for (boxes, scores, classes, *where), item in zip(found, items)]

    def task_head_outputs(self, items: Sequence[Letterboxed]) -> tuple[np.ndarray, dict[str, mx.array]]:
        """:meth:`head_outputs` of a segment or pose model, with its other outputs (mask
        coefficients and prototypes, or keypoints on the input), kept on the device."""
        out = self.net.task_outputs(self._input([item.pixels for item in items]))
        return np.array(out.pop("detections").astype(mx.float32)), out

    def val_instances(self, extras: dict[str, mx.array], index: int, anchors: np.ndarray, boxes: np.ndarray,
                      item: Letterboxed) -> np.ndarray:
        """Batch member ``index``'s masks (K, H, W) bool or keypoints (K, P, dims) on the image,
        for the detections of ``anchors`` whose image boxes are ``boxes`` (as ``yolo val`` makes them)."""
        if "protos" in extras:
            return self._masks(extras, index, anchors, boxes, item).dense()
        # The kept anchors' rows are picked on the host: a gather on the device would be one more
        # kernel for a GPU back end to compile at run time (seconds, on a fresh machine).
        points = np.array(extras["keypoints"][index].astype(mx.float32))[anchors]
        return keypoints_to_image(points.reshape(len(anchors), *self.net.head.kpt_shape), item.letterbox_ratio_pad(),
                                  item.image_hw)

    @staticmethod
    def _masks(extras: dict[str, mx.array], index: int, anchors: np.ndarray, boxes: np.ndarray,
               item: Letterboxed, colours: np.ndarray | None = None, pixels: bool = True) -> InstanceMasks:
        """Batch member ``index``'s instance masks for the detections of ``anchors`` (picked on the
        host, as the keypoints are); given the colours they are drawn in, with their layer."""
        coefficients = np.array(extras["mask_coefficients"][index].astype(mx.float32))[anchors]
        return instance_masks(extras["protos"][index], mx.array(coefficients), boxes, item.image_hw, item.ratio_pad,
                              colours, MASK_ALPHA, pixels)


class YOLOFamily(families.ModelFamily):
    name = "yolov8"
    variants = MODELS
    default_size = 640

    def build(self, variant: str) -> nn.Module:
        return random_init(build_variant(variant))

    def from_pretrained(self, source: str, variant: str | None = None, dtype: str | None = None) -> YOLOv8:
        return YOLO.from_pretrained(source, model=variant, dtype=dtype or "float32", fuse=False).net

    def example_inputs(self, variant: str, size: int) -> list[mx.array]:
        side = max(32, size // 32 * 32)
        return [mx.random.uniform(shape=(1, side, side, 3), key=mx.random.key(0))]

    def image_inputs(self, variant: str, image: np.ndarray, size: int) -> list[mx.array]:
        return [mx.array(letterbox(image, size)[None]) / 255]

    def prepare(self, image: np.ndarray, imgsz: int = 640,  # type: ignore[override]
                shape: tuple[int, int] | None = None) -> Letterboxed:
        return YOLO.prepare(image, imgsz, shape)

    task = "detect"

    def predictor(self, weights: str | None, variant: str | None, dtype: str | None = None,
                  names: Sequence[str] | None = None) -> YOLO:
        return YOLO.from_pretrained(weights or variant or "yolov8n", model=variant,
                                    dtype=dtype or "float32", names=names)


families.register(YOLOFamily())
