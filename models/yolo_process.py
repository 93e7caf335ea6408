"""YOLOv8 pre/post-processing, as ultralytics' DetectionPredictor does it.

letterbox:   LetterBox(imgsz, auto=True, stride=32): scale the long side to imgsz (aspect kept),
             pad to the smallest stride-32 rectangle with grey 114, centred.
postprocess: non_max_suppression: keep anchors whose best class score > conf (and, given
             ``classes``, whose best class is one of them), xywh -> xyxy, class-aware NMS
             (IoU > iou suppresses, at most max_det, max_nms candidates).
scale_boxes: undo the letterbox (padding, then gain) and clip to the original image.

letterbox_to: ``yolo val``'s letterbox to a batch's rect shape: the dataset's load (long side to
             imgsz, up or down), then LetterBox(shape, scaleup=False), centred, grey 114.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Sequence

import mlx.core as mx
import numpy as np

from mlxnet import ops
from mlxnet.errors import MlxnetError
from mlxnet.image import PALETTE, draw_boxes, draw_keypoints, resize_bilinear

from .yolo_instances import COCO_SKELETON, InstanceMasks, mask_outline

STRIDE = 32
PAD_VALUE = 114
MAX_NMS = 30000  # ultralytics: at most this many candidates enter NMS (highest scores)
MAX_WH = 7680  # ultralytics: per-class coordinate offset for class-aware NMS
RatioPad = tuple[tuple[float, float], tuple[int, int]]  # ((gain_h, gain_w), (pad_x, pad_y))
MASK_ALPHA = 0.5  # how much of its colour an instance mask lays over the image


def class_colours(classes: np.ndarray) -> np.ndarray:
    """(K, 3) uint8: each detection's colour, its class's in the palette (boxes and masks)."""
    return PALETTE[np.asarray(classes, np.int64) % len(PALETTE)]


@lru_cache(maxsize=1)
def coco80_names() -> tuple[str, ...]:
    text = resources.files("mlxnet").joinpath("data/coco80.txt").read_text()
    return tuple(line for line in text.splitlines() if line)


def letterbox(image: np.ndarray, imgsz: int = 640) -> np.ndarray:
    """uint8 HWC -> uint8 (H', W', C) with H', W' multiples of 32 and max(H', W') <= imgsz."""
    if imgsz < STRIDE or imgsz % STRIDE:
        raise MlxnetError(f"imgsz must be a positive multiple of {STRIDE}, got {imgsz}")
    h, w = image.shape[:2]
    r = min(imgsz / h, imgsz / w)
    new_w, new_h = max(round(w * r), 1), max(round(h * r), 1)
    dw, dh = (imgsz - new_w) % STRIDE / 2, (imgsz - new_h) % STRIDE / 2
    top, bottom = round(dh - 0.1), round(dh + 0.1)
    left, right = round(dw - 0.1), round(dw + 0.1)
    resized = image if (new_w, new_h) == (w, h) else resize_bilinear(image, (new_w, new_h))
    out = np.full((new_h + top + bottom, new_w + left + right, image.shape[2]), PAD_VALUE, np.uint8)
    out[top:top + new_h, left:left + new_w] = resized
    return out


def letterbox_to(image: np.ndarray, imgsz: int, shape: tuple[int, int]) -> tuple[np.ndarray, RatioPad]:
    """uint8 HWC -> (uint8 (shape[0], shape[1], C), ratio_pad) as ``yolo val`` prepares an image of
    a rect batch whose letterbox shape is ``shape`` (H, W). ultralytics' dataset first resizes the
    long side to ``imgsz`` (each side ``min(ceil(side * r), imgsz)``, upscaling included), then its
    val LetterBox fits that into ``shape`` without scaling up, padding centred with 114.
    ``ratio_pad`` is ((gain_h, gain_w), (pad_x, pad_y)): input pixel = image pixel * gain + pad, as
    ultralytics' ``scale_boxes`` takes it (the two gains differ by the rounding of each side)."""
    h0, w0 = image.shape[:2]
    r = imgsz / max(h0, w0)
    h1, w1 = h0, w0
    if r != 1:
        w1, h1 = min(math.ceil(w0 * r), imgsz), min(math.ceil(h0 * r), imgsz)
    r2 = min(shape[0] / h1, shape[1] / w1, 1.0)  # val's LetterBox never scales up
    new_w, new_h = max(round(w1 * r2), 1), max(round(h1 * r2), 1)
    dw, dh = (shape[1] - new_w) / 2, (shape[0] - new_h) / 2
    top, bottom = round(dh - 0.1), round(dh + 0.1)
    left, right = round(dw - 0.1), round(dw + 0.1)
    # Two resizes where ultralytics makes two (the second is rare: the rect shape is padded past
    # every image of its batch), so the pixels are its pixels.
    resized = image if (w1, h1) == (w0, h0) else resize_bilinear(image, (w1, h1))
    if (new_w, new_h) != (w1, h1):
        resized = resize_bilinear(resized, (new_w, new_h))
    out = np.full((new_h + top + bottom, new_w + left + right, image.shape[2]), PAD_VALUE, np.uint8)
    out[top:top + new_h, left:left + new_w] = resized
    return out, ((h1 / h0 * r2, w1 / w0 * r2), (left, top))


def xywh2xyxy(b: np.ndarray) -> np.ndarray:
    half = b[:, 2:4] / 2
    return np.concatenate([b[:, :2] - half, b[:, :2] + half], axis=1)


def _check_thresholds(conf: float, iou: float) -> None:
    if not 0.0 <= conf <= 1.0 or not 0.0 <= iou <= 1.0:
        raise MlxnetError(f"conf and iou must be in [0, 1], got conf={conf}, iou={iou}")


def postprocess_batch(pred: mx.array, *, conf: float = 0.25, iou: float = 0.7, max_det: int = 300,
                      agnostic: bool = False, max_nms: int = MAX_NMS,
                      classes: Sequence[int] | None = None, images: int | None = None,
                      anchors: bool = False) -> list:
    """A batch's (B, A, 4 + nc) head output -> per image (K, 6) float32 [x1, y1, x2, y2, score,
    class], highest score first, in the network input's pixels (``anchors``: with the (K,)
    anchor index of each, where a segment or pose model's other outputs are read). ``classes``: keep only anchors
    whose best class is one of these, before the max_nms cut and NMS, as ultralytics does (an
    anchor whose best class is another is dropped, not given its best listed class).
    ``images``: only the first this many rows are images (the rest filled a fixed batch size):
    they are dropped on the host, where a slice on the device would be one more kernel for the
    GPU back end to compile before the first result.

    The device reduces the class scores to each anchor's best score and class; the boxes, those
    and nothing else come back to the host in one transfer for the whole batch (one sync, not
    one per image), where the threshold and NMS touch only the candidates."""
    _check_thresholds(conf, iou)
    pred = pred.astype(mx.float32)
    scores = pred[..., 4:]
    found = pred[..., :4], scores.max(axis=-1), scores.argmax(axis=-1).astype(mx.int32)
    mx.eval(*found)
    boxes_all, best_all, cls_all = (np.array(a) for a in found)
    wanted_classes = None if classes is None else np.asarray(classes, dtype=np.int64)
    count = pred.shape[0] if images is None else images
    found = _detections(boxes_all[:count], best_all[:count], cls_all[:count], conf, iou, max_det, agnostic, max_nms,
                        wanted_classes)
    return found if anchors else [det for det, _ in found]


def end2end_detections(rows: mx.array, *, conf: float = 0.25, classes: Sequence[int] | None = None,
                       anchors: mx.array | None = None) -> list:
    """An end-to-end head's (B, K, 6) best rows [x1, y1, x2, y2, score, class] -> per image those
    above ``conf`` (and of ``classes``), best first, as ultralytics' predictor keeps them with
    ``nms=False``: no suppression. Given the rows' ``anchors`` (B, K), each image's kept rows
    come with theirs."""
    _check_thresholds(conf, 0.5)
    rows = np.array(rows.astype(mx.float32))
    where = None if anchors is None else np.array(anchors)
    out = []
    for b, r in enumerate(rows):
        keep = r[:, 4] > conf
        if classes is not None:
            keep &= np.isin(r[:, 5].astype(np.int64), np.asarray(classes, dtype=np.int64))
        out.append(r[keep] if where is None else (r[keep], where[b][keep]))
    return out


def _candidates(xywh: np.ndarray, best: np.ndarray, cls: np.ndarray, conf: float, max_nms: int,
                classes: np.ndarray | None) -> np.ndarray:
    """One image's anchors (boxes, best score, best class) -> the anchors that go to NMS."""
    wanted = best > conf
    if classes is not None:
        wanted &= np.isin(cls, classes)
    cand = np.nonzero(wanted)[0]
    if cand.size > max_nms:
        cand = cand[np.argsort(-best[cand], kind="stable")[:max_nms]]
    # A box with a NaN or infinite coordinate (weights that overflow) is no detection: NMS's IoU
    # of it is NaN, and a NaN in --json output is not JSON.
    return cand[np.isfinite(xywh[cand]).all(axis=1)]


def _detections(xywh: np.ndarray, best: np.ndarray, cls: np.ndarray, conf: float, iou: float, max_det: int,
                agnostic: bool, max_nms: int, classes: np.ndarray | None) -> list[tuple[np.ndarray, np.ndarray]]:
    """A batch's anchors (B, A, ·) -> per image its detections (K, 6) and their anchors, the
    images' NMS run together (:func:`mlxnet.ops.nms_many`)."""
    picked = [_candidates(xywh[i], best[i], cls[i], conf, max_nms, classes) for i in range(len(xywh))]
    boxes = [xywh2xyxy(xywh[i][cand]) for i, cand in enumerate(picked)]
    scores = [best[i][cand] for i, cand in enumerate(picked)]
    labels = [cls[i][cand] for i, cand in enumerate(picked)]
    busy = [i for i, cand in enumerate(picked) if cand.size]
    kept = dict(zip(busy, ops.nms_many([(mx.array(boxes[i]), mx.array(scores[i]), None if agnostic else mx.array(labels[i]))
                                        for i in busy], iou_threshold=iou, max_det=max_det, max_wh=MAX_WH)))
    out = []
    for i, cand in enumerate(picked):
        if i not in kept:
            out.append((np.zeros((0, 6), np.float32), cand))
            continue
        keep = np.array(kept[i])
        rows = np.concatenate([boxes[i][keep], scores[i][keep, None], labels[i][keep, None].astype(np.float32)], axis=1)
        out.append((rows, cand[keep]))
    return out


def postprocess(pred: mx.array, *, conf: float = 0.25, iou: float = 0.7, max_det: int = 300,
                agnostic: bool = False, max_nms: int = MAX_NMS,
                classes: Sequence[int] | None = None) -> np.ndarray:
    """One image's (A, 4 + nc) head output -> its detections (see :func:`postprocess_batch`)."""
    return postprocess_batch(pred[None], conf=conf, iou=iou, max_det=max_det, agnostic=agnostic,
                             max_nms=max_nms, classes=classes)[0]


def letterbox_ratio_pad(input_hw: tuple[int, int], image_hw: tuple[int, int]) -> RatioPad:
    """The gains and padding of :func:`letterbox` (one scale, centred), from the two shapes."""
    (h1, w1), (h0, w0) = input_hw, image_hw
    gain = min(h1 / h0, w1 / w0)
    new_h, new_w = max(round(h0 * gain), 1), max(round(w0 * gain), 1)
    return (new_h / h0, new_w / w0), (round((w1 - new_w) / 2 - 0.1), round((h1 - new_h) / 2 - 0.1))


def scale_boxes(input_hw: tuple[int, int], boxes: np.ndarray, image_hw: tuple[int, int],
                ratio_pad: RatioPad | None = None) -> np.ndarray:
    """xyxy boxes on the letterboxed input -> on the original image (clipped to it).
    ``ratio_pad``: the letterbox's gains and padding where they are known (:func:`letterbox_to`);
    None: those of :func:`letterbox` from the shapes."""
    (gain_h, gain_w), (pad_x, pad_y) = ratio_pad or letterbox_ratio_pad(input_hw, image_hw)
    h0, w0 = image_hw
    out = boxes.astype(np.float32, copy=True)
    out[:, [0, 2]] = np.clip((out[:, [0, 2]] - pad_x) / gain_w, 0, w0)
    out[:, [1, 3]] = np.clip((out[:, [1, 3]] - pad_y) / gain_h, 0, h0)
    return out


@dataclass(frozen=True)
class Letterboxed:
    """One image ready for the network: its original (H, W), its letterboxed uint8 pixels and,
    for a letterbox to a given shape, its gains and padding (None: :func:`letterbox`'s)."""

    image_hw: tuple[int, int]
    pixels: np.ndarray
    ratio_pad: RatioPad | None = None

    def to_image(self, boxes: np.ndarray) -> np.ndarray:
        """xyxy boxes on the letterboxed input -> on the original image, clipped (:func:`scale_boxes`)."""
        return scale_boxes(self.pixels.shape[:2], boxes, self.image_hw, self.ratio_pad)

    def letterbox_ratio_pad(self) -> RatioPad:
        """The letterbox's gains and padding: the known ones, else :func:`letterbox`'s."""
        return self.ratio_pad or letterbox_ratio_pad(self.pixels.shape[:2], self.image_hw)

    def to_input(self, boxes: np.ndarray) -> np.ndarray:
        """xyxy boxes on the original image -> on the letterboxed input (the inverse of
        :meth:`to_image`, without its clipping)."""
        (gain_h, gain_w), (pad_x, pad_y) = self.letterbox_ratio_pad()
        return np.asarray(boxes, np.float64) * [gain_w, gain_h, gain_w, gain_h] + [pad_x, pad_y, pad_x, pad_y]


@dataclass
class Detections:
    """One image's detections: boxes (K, 4) xyxy in image pixels, scores (K,), classes (K,);
    a segment model's instance masks and a pose model's keypoints beside them."""

    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray
    names: tuple[str, ...]
    # segment models: K masks on the image, each within its box (a (K, H, W) bool array given is kept so)
    masks: InstanceMasks | np.ndarray | None = None
    keypoints: np.ndarray | None = None  # pose models: (K, P, 3) x, y, visibility (or (K, P, 2)), on the image

    def __post_init__(self) -> None:
        if isinstance(self.masks, np.ndarray):  # (K, H, W) bool masks, as other tools give them
            self.masks = InstanceMasks.from_dense(self.masks)

    def __len__(self) -> int:
        return len(self.scores)

    @property
    def labels(self) -> list[str]:
        return [self.names[c] for c in self.classes]

    def to_list(self) -> list[dict]:
        """JSON-ready rows: box [x1, y1, x2, y2], score, class id, class name; a segment model's
        mask outline as ``segments`` {x: [...], y: [...]} and a pose model's ``keypoints`` {x, y,
        visible}, in image pixels (the keys of ultralytics' ``Results.summary``)."""
        rows = [{"box": [round(float(v), 2) for v in box], "score": round(float(s), 4), "class": int(c),
                 "name": self.names[c]} for box, s, c in zip(self.boxes, self.scores, self.classes)]
        for row, outline in zip(rows, self.outlines() if self.masks is not None else []):
            xy = np.round(outline.astype(np.float64), 2)
            row["segments"] = {"x": xy[:, 0].tolist(), "y": xy[:, 1].tolist()}
        for row, points in zip(rows, self.keypoints if self.keypoints is not None else []):
            xy = np.round(points[:, :2].astype(np.float64), 2)
            row["keypoints"] = {"x": xy[:, 0].tolist(), "y": xy[:, 1].tolist()}
            if points.shape[1] > 2:
                row["keypoints"]["visible"] = np.round(points[:, 2].astype(np.float64), 4).tolist()
        return rows

    def outlines(self) -> list[np.ndarray]:
        """Each instance mask's outline, one polygon (P, 2) in image pixels (ultralytics' masks.xy)."""
        if self.masks is None:
            return []
        return [mask_outline(crop) + np.float32([left, top]) for crop, (top, left) in
                zip(self.masks.crops, self.masks.origins())]

    def to_dict(self) -> dict:
        return {"detections": self.to_list()}

    def render(self, image: np.ndarray) -> np.ndarray:
        """A copy of ``image`` with each box drawn and labelled "name score", one colour a class;
        instance masks blended in under them, keypoints (with COCO's skeleton for 17) over them."""
        if self.masks is not None and len(self.masks):
            image = self.masks.over(image, class_colours(self.classes), MASK_ALPHA)
        labels = [f"{name} {score:.2f}" for name, score in zip(self.labels, self.scores)]
        out = draw_boxes(image, self.boxes, labels, colour_ids=list(self.classes))
        if self.keypoints is not None and len(self.keypoints):
            out = draw_keypoints(out, self.keypoints, COCO_SKELETON if self.keypoints.shape[1] == 17 else ())
        return out

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for name in self.labels:
            counts[name] = counts.get(name, 0) + 1
        return ", ".join(f"{n} {name}" for name, n in counts.items()) or "nothing"
