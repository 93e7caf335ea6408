"""One builder for ultralytics' YOLO detectors: the network from the architecture a checkpoint
carries (the model yaml an ultralytics ``.pt`` stores), or from a family's own (YOLOv8, YOLO11,
YOLO26), at any scale n-x.

An architecture is ultralytics' list of rows ``[from, repeats, module, args]`` with its
``scales`` (depth, width, max channels): the builder reads it as ultralytics' parser does
(repeats scaled by depth, channels by width and capped, C3k2's C3k blocks for m/l/x, the
legacy class branch for families before YOLO11, the un-activated SPPF of YOLO26), so a
checkpoint's keys (``model.23.cv3.0.0.0.conv.weight``) are the network's parameter names.

    net = build(ARCHITECTURES["yolo11"], scale="s", nc=80)
    y = net(x)   # (N, A, 4 + nc): xywh in input pixels, class probabilities (before NMS)
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import mlx.core as mx
import mlx.nn as nn
import yaml

from mlxnet.errors import MlxnetError
from mlxnet.nn import compiled_for_inference, handoff
from mlxnet.weights.fold import fold_conv_bn
from mlxnet.weights.layout import from_torch_layout

from .yolo_blocks import (STRIDES, C2PSA, C2f, C3, C3k2, Concat, Conv, Detect, Pose, Segment, SPPF, Upsample,
                          _check_input, _make_divisible, direct_decode)

# A compiled forward runs the first rows (a chain: each reads only the one before) in stages
# with these bounds (to the stride-4 block), handed off one by one, then the rest of the
# network, when the first stage's device time covers the host building the rest: from
# STAGED_MIN_WORK input pixels (N·H·W) × the stem's width² (YOLOv8s at batch 8 on 640², m at 4).
# Measured on an H100 (docs/performance-notes.md).
BACKBONE_STAGES = (0, 3)
STAGED_MIN_WORK = 2 * 640 * 640 * 64 ** 2


# --- the families' own architectures (ultralytics' yaml files, their facts) -------------------

_YOLOV8 = """
scales: {n: [0.33, 0.25, 1024], s: [0.33, 0.50, 1024], m: [0.67, 0.75, 768], l: [1.00, 1.00, 512],
         x: [1.00, 1.25, 512]}
backbone:
  - [-1, 1, Conv, [64, 3, 2]]
  - [-1, 1, Conv, [128, 3, 2]]
  - [-1, 3, C2f, [128, True]]
  - [-1, 1, Conv, [256, 3, 2]]
  - [-1, 6, C2f, [256, True]]
  - [-1, 1, Conv, [512, 3, 2]]
  - [-1, 6, C2f, [512, True]]
  - [-1, 1, Conv, [1024, 3, 2]]
  - [-1, 3, C2f, [1024, True]]
  - [-1, 1, SPPF, [1024, 5]]
head:
  - [-1, 1, nn.Upsample, [None, 2, nearest]]
  - [[-1, 6], 1, Concat, [1]]
  - [-1, 3, C2f, [512]]
  - [-1, 1, nn.Upsample, [None, 2, nearest]]
  - [[-1, 4], 1, Concat, [1]]
  - [-1, 3, C2f, [256]]
  - [-1, 1, Conv, [256, 3, 2]]
  - [[-1, 12], 1, Concat, [1]]
  - [-1, 3, C2f, [512]]
  - [-1, 1, Conv, [512, 3, 2]]
  - [[-1, 9], 1, Concat, [1]]
  - [-1, 3, C2f, [1024]]
  - [[15, 18, 21], 1, Detect, [nc]]
"""

_YOLO11_BACKBONE = """
  - [-1, 1, Conv, [64, 3, 2]]
  - [-1, 1, Conv, [128, 3, 2]]
  - [-1, 2, C3k2, [256, False, 0.25]]
  - [-1, 1, Conv, [256, 3, 2]]
  - [-1, 2, C3k2, [512, False, 0.25]]
  - [-1, 1, Conv, [512, 3, 2]]
  - [-1, 2, C3k2, [512, True]]
  - [-1, 1, Conv, [1024, 3, 2]]
  - [-1, 2, C3k2, [1024, True]]
"""

_YOLO11 = """
scales: {n: [0.50, 0.25, 1024], s: [0.50, 0.50, 1024], m: [0.50, 1.00, 512], l: [1.00, 1.00, 512],
         x: [1.00, 1.50, 512]}
backbone:""" + _YOLO11_BACKBONE + """
  - [-1, 1, SPPF, [1024, 5]]
  - [-1, 2, C2PSA, [1024]]
head:
  - [-1, 1, nn.Upsample, [None, 2, nearest]]
  - [[-1, 6], 1, Concat, [1]]
  - [-1, 2, C3k2, [512, False]]
  - [-1, 1, nn.Upsample, [None, 2, nearest]]
  - [[-1, 4], 1, Concat, [1]]
  - [-1, 2, C3k2, [256, False]]
  - [-1, 1, Conv, [256, 3, 2]]
  - [[-1, 13], 1, Concat, [1]]
  - [-1, 2, C3k2, [512, False]]
  - [-1, 1, Conv, [512, 3, 2]]
  - [[-1, 10], 1, Concat, [1]]
  - [-1, 2, C3k2, [1024, True]]
  - [[16, 19, 22], 1, Detect, [nc]]
"""

_YOLO26 = """
end2end: true
reg_max: 1
scales: {n: [0.50, 0.25, 1024], s: [0.50, 0.50, 1024], m: [0.50, 1.00, 512], l: [1.00, 1.00, 512],
         x: [1.00, 1.50, 512]}
backbone:""" + _YOLO11_BACKBONE + """
  - [-1, 1, SPPF, [1024, 5, 3, True]]
  - [-1, 2, C2PSA, [1024]]
head:
  - [-1, 1, nn.Upsample, [None, 2, nearest]]
  - [[-1, 6], 1, Concat, [1]]
  - [-1, 2, C3k2, [512, True]]
  - [-1, 1, nn.Upsample, [None, 2, nearest]]
  - [[-1, 4], 1, Concat, [1]]
  - [-1, 2, C3k2, [256, True]]
  - [-1, 1, Conv, [256, 3, 2]]
  - [[-1, 13], 1, Concat, [1]]
  - [-1, 2, C3k2, [512, True]]
  - [-1, 1, Conv, [512, 3, 2]]
  - [[-1, 10], 1, Concat, [1]]
  - [-1, 1, C3k2, [1024, True, 0.5, True]]
  - [[16, 19, 22], 1, Detect, [nc]]
"""

ARCHITECTURES: dict[str, dict[str, Any]] = {
    name: {"nc": 80, **yaml.safe_load(text)} for name, text in
    (("yolov8", _YOLOV8), ("yolo11", _YOLO11), ("yolo26", _YOLO26))
}


TASKS = {"detect": "", "segment": "-seg", "pose": "-pose"}  # a task's suffix on the model ids
COCO_KEYPOINTS = (17, 3)  # ultralytics' pose models: COCO's 17 keypoints, x, y and visibility


def task_architecture(family: str, task: str, kpt_shape: Sequence[int] = COCO_KEYPOINTS) -> dict[str, Any]:
    """A family's architecture for ``task``: ultralytics' ``<family>-seg.yaml`` /
    ``<family>-pose.yaml`` differ from the detection yaml in the last row only (Segment with 32
    masks from a 256-wide prototype branch; Pose with ``kpt_shape``; YOLO26 their ``26`` forms)."""
    if task not in TASKS:
        raise MlxnetError(f"unknown task {task!r}: expected one of {', '.join(TASKS)}")
    arch = dict(ARCHITECTURES[family])
    if task == "detect":
        return arch
    head = [list(r) for r in arch["head"]]
    kind = {"segment": "Segment", "pose": "Pose"}[task] + ("26" if family == "yolo26" else "")
    head[-1] = [head[-1][0], 1, kind, ["nc", 32, 256] if task == "segment" else ["nc", "kpt_shape"]]
    arch["head"] = head
    if task == "pose":
        arch["kpt_shape"] = [int(v) for v in kpt_shape]
    return arch


# --- the builder -----------------------------------------------------------------------------

HEADS = ("Detect", "Segment", "Segment26", "Pose", "Pose26")  # the last row: the task's head


class Parts(list):
    """A Concat row's output: its parts, concatenated along channels only where a reader needs
    the whole map (a C2f or C3k2 reads them in place through its first 1x1 conv)."""


_READS_PARTS = (C2f, C3)


class YOLONet(nn.Module):
    """A detector built from an ultralytics architecture; parameters in ``model`` (the rows).
    Input (N, H, W, 3) RGB in [0, 1], H and W multiples of 32."""

    def __init__(self, arch: dict[str, Any], scale: str | None = None, nc: int | None = None,
                 fold_bn: bool = False, family: str | None = None) -> None:
        super().__init__()
        self.family = family  # the model id's family (yolov8, yolo11, yolo26) when built as one
        # Underscored: MLX leaves these out of the parameter tree.
        self._arch = arch
        self.nc = int(nc if nc is not None else arch.get("nc", 80))
        self.model, self._sources, self.scale = _build(arch, scale, self.nc, fold_bn)
        self.eval()

    @property
    def head(self) -> Detect:
        return self.model[-1]

    @property
    def task(self) -> str:
        """detect, segment or pose: what the head adds to the boxes."""
        return "segment" if isinstance(self.head, Segment) else "pose" if isinstance(self.head, Pose) else "detect"

    def task_outputs(self, x: mx.array, one2one: bool = False) -> dict[str, mx.array]:
        """Everything the head gives: ``detections`` (N, A, 4 + nc) as :meth:`__call__`, and for a
        segment model ``mask_coefficients`` (N, A, nm) and ``protos`` (N, H/4, W/4, nm), for a
        pose model ``keypoints`` (N, A, K·dims) in input pixels (visibility as a probability)."""
        feats = self.features(x)
        out = {"detections": self.head(feats, one2one=one2one)}
        if self.task != "detect":
            out.update(self.head.extras(feats, one2one=one2one))
        if self.task == "pose":
            out["keypoints"] = self.head.decode_keypoints(out["keypoints"], feats)
        return out

    def features(self, x: mx.array) -> list[mx.array]:
        """The maps the head reads (strides 8, 16, 32)."""
        _check_input(x)
        return self._features_from(x, 0)

    def __call__(self, x: mx.array) -> mx.array:
        """(N, A, 4 + nc): xywh boxes in input pixels and class probabilities, before NMS (the
        one-to-many head: ultralytics' default).

        Compiled, a large forward runs in stages (mlxnet.nn.compiled): the first rows are started
        on the device (handoff) while the host builds the rest of the network. A small one,
        whose kernels take about as long on the device as the host takes to launch them, gains
        nothing from that and runs as one graph."""
        _check_input(x)
        if x.shape[0] * x.shape[1] * x.shape[2] * self.model[0].conv.weight.shape[0] ** 2 < STAGED_MIN_WORK:
            return self._whole(x)
        for lo, hi in zip(BACKBONE_STAGES, BACKBONE_STAGES[1:]):
            x = handoff(self._layers(x, lo, hi))
        return self._rest(x)

    @compiled_for_inference
    def _whole(self, x: mx.array) -> mx.array:
        return self.head(self._features_from(x, 0))

    @compiled_for_inference(reads=lambda self, lo, hi: self.model[lo:hi])
    def _layers(self, x: mx.array, lo: int, hi: int) -> mx.array:
        for layer in self.model[lo:hi]:  # rows of the opening chain
            x = layer(x)
        return x

    @compiled_for_inference(reads=lambda self: self.model[BACKBONE_STAGES[-1]:])
    def _rest(self, x: mx.array) -> mx.array:
        return self.head(self._features_from(x, BACKBONE_STAGES[-1]))

    def _features_from(self, x: mx.array, lo: int) -> list[mx.array]:
        """Rows ``lo`` on, ``x`` being row ``lo - 1``'s output (rows before ``lo`` are a chain):
        the head's input maps. A Concat row's parts reach a C2f / C3k2 unconcatenated (their
        first 1x1 conv reads them in place)."""
        outputs: list[Any] = [None] * lo
        for i in range(lo, len(self.model) - 1):
            layer, source = self.model[i], self._sources[i]
            if i == lo:
                y = layer(x)
            elif isinstance(layer, Concat):
                y = Parts(p for s in source for p in _as_parts(outputs[s]))
            else:
                y = outputs[source]
                if isinstance(y, Parts) and not isinstance(layer, _READS_PARTS):
                    y = mx.concatenate(y, axis=-1)
                y = layer(y)
            outputs.append(y)
        return [outputs[s] for s in self._sources[-1]]

    def head_outputs(self, x: mx.array, one2one: bool = False) -> list[tuple[mx.array, mx.array]]:
        """Per level the head's raw box and class logits (NHWC)."""
        return self.head.branches(self.features(x), one2one=one2one)

    def end2end(self, x: mx.array, max_det: int = 300) -> mx.array:
        """An end-to-end model's NMS-free detections (ultralytics' ``nms=False``): the one-to-one
        head's best ``max_det`` (anchor, class) pairs, (N, K, 6): xyxy in input pixels, score,
        class, best first. The anchors are first cut to the K with the best class score, as
        ultralytics does."""
        if not hasattr(self.head, "one2one_cv2"):
            raise MlxnetError("this model has no one-to-one head (only YOLO26-style end-to-end models do)")
        maps = [m for level in self.head_outputs(x, one2one=True) for m in level]
        decoded = direct_decode(maps, STRIDES, xywh=False)
        return best_pairs(decoded[..., :4], decoded[..., 4:], max_det)[0]

    def train_outputs(self, x: mx.array) -> mx.array:
        return self.head.raw(self.features(x))

    def fuse(self) -> "YOLONet":
        """Fold every BatchNorm into its conv (inference only)."""
        for _, module in self.named_modules():
            if isinstance(module, Conv):
                module.fuse()
        return self

    def fused_parameters(self, arrays: dict[str, mx.array]) -> dict[str, mx.array]:
        """``arrays`` (flat parameters and BatchNorm statistics of this network, unfused) as the
        flat parameters of its fused form: what :meth:`fuse` gives with them loaded, without
        building a network (a trainer validates every epoch's weights this way)."""
        fused = dict(arrays)
        for name, module in self.named_modules():
            if isinstance(module, Conv) and "bn" in module:
                conv, bn = f"{name}.conv.", f"{name}.bn."
                stats = [fused.pop(bn + k) for k in ("weight", "bias", "running_mean", "running_var")]
                fused[conv + "weight"], fused[conv + "bias"] = fold_conv_bn(
                    fused[conv + "weight"], fused.pop(conv + "bias", None), *stats, module.bn.eps)
        return fused


def best_pairs(boxes: mx.array, scores: mx.array, max_det: int) -> tuple[mx.array, mx.array]:
    """An end-to-end head's best ``max_det`` (anchor, class) pairs from its xyxy boxes (N, A, 4)
    and class scores (N, A, nc): rows (N, K, 6) [x1, y1, x2, y2, score, class], best first, and
    each row's anchor (N, K). The anchors are first cut to the K with the best class score."""
    n, anchors, nc = scores.shape
    k = min(max_det, anchors)
    best = mx.argsort(-scores.max(axis=-1), axis=-1)[:, :k]                       # (N, K) anchors
    scores = mx.take_along_axis(scores, best[..., None], axis=1).reshape(n, k * nc)
    order = mx.argsort(-scores, axis=-1)[:, :k]                                    # (N, K) pairs
    anchor = mx.take_along_axis(best, order // nc, axis=1)
    picked = mx.take_along_axis(boxes, anchor[..., None], axis=1)
    top = mx.take_along_axis(scores, order, axis=1)
    rows = mx.concatenate([picked, top[..., None], (order % nc).astype(mx.float32)[..., None]], axis=-1)
    return rows, anchor


def _as_parts(y: Any) -> list[mx.array]:
    return list(y) if isinstance(y, Parts) else [y]


def build(arch: dict[str, Any], scale: str | None = None, nc: int | None = None, fold_bn: bool = False) -> YOLONet:
    """The network of ``arch`` (an ultralytics model yaml as a dict) at ``scale``."""
    return YOLONet(arch, scale, nc, fold_bn)


def _build(arch: dict[str, Any], scale: str | None, nc: int, fold_bn: bool) -> tuple[list, list, str | None]:
    scales = arch.get("scales") or {}
    scale = scale or arch.get("scale") or (next(iter(scales)) if scales else None)
    if scales:
        if scale not in scales:
            raise MlxnetError(f"unknown scale {scale!r}: the architecture has {', '.join(scales)}")
        depth, width, max_channels = scales[scale]
    else:
        depth, width, max_channels = arch.get("depth_multiple", 1.0), arch.get("width_multiple", 1.0), math.inf
    reg_max, end2end = int(arch.get("reg_max", 16)), bool(arch.get("end2end", False))
    rows = list(arch.get("backbone", [])) + list(arch.get("head", []))
    legacy = not any(row[2] == "C3k2" for row in rows)  # ultralytics: YOLO11's blocks mean the new head
    channels: list[int] = []
    layers, sources = [], []

    def width_of(c: int) -> int:
        return _make_divisible(min(c, max_channels) * width, 8)

    for i, row in enumerate(rows):
        try:
            source, repeats, kind, args = row
        except (TypeError, ValueError):
            raise MlxnetError(f"architecture row {i}: expected [from, repeats, module, args], got {row!r}") from None
        source = [s if s >= 0 else i + s for s in source] if isinstance(source, list) else (
            source if source >= 0 else i + source)
        c_in = channels[source] if isinstance(source, int) and i > 0 else 3
        n = max(round(repeats * depth), 1) if repeats > 1 else repeats
        f = fold_bn
        if kind == "Conv":
            c2 = width_of(args[0])
            k, s = (args + [1, 1])[1:3]
            layer = Conv(c_in, c2, k, s, fold_bn=f)
        elif kind == "C2f":
            c2 = width_of(args[0])
            layer = C2f(c_in, c2, n, bool(args[1]) if len(args) > 1 else False, fold_bn=f,
                        e=args[2] if len(args) > 2 else 0.5)
        elif kind == "C3k2":
            c2 = width_of(args[0])
            c3k = bool(args[1]) if len(args) > 1 else False
            if scale in ("m", "l", "x"):
                c3k = True
            layer = C3k2(c_in, c2, n, c3k, args[2] if len(args) > 2 else 0.5,
                         bool(args[3]) if len(args) > 3 else False, fold_bn=f)
        elif kind == "SPPF":
            c2 = width_of(args[0])
            if (args + [5])[1] != 5 or (len(args) > 2 and args[2] != 3):
                raise MlxnetError(f"architecture row {i}: SPPF with kernel {args[1]} / {args[2:3]} pools is not "
                                  "supported (5x5, 3 pools)")
            # Rows of three arguments or fewer predate YOLO26's un-activated cv1.
            layer = SPPF(c_in, c2, fold_bn=f, act=len(args) <= 2, shortcut=bool(args[3]) if len(args) > 3 else False)
        elif kind == "C2PSA":
            c2 = width_of(args[0])
            layer = C2PSA(c_in, c2, n, args[1] if len(args) > 1 else 0.5, fold_bn=f)
        elif kind == "nn.Upsample":
            if args[1:2] != [2] or (len(args) > 2 and args[2] != "nearest"):
                raise MlxnetError(f"architecture row {i}: only nearest x2 upsampling is supported, got {args}")
            c2, layer = c_in, Upsample()
        elif kind == "Concat":
            c2, layer = sum(channels[s] for s in source), Concat()
        elif kind in HEADS:
            if i != len(rows) - 1:
                raise MlxnetError(f"architecture row {i}: {kind} must be the last row")
            ch, common = [channels[s] for s in source], {"fold_bn": f, "reg_max": reg_max, "legacy": legacy,
                                                          "end2end": end2end}
            if kind.startswith("Segment"):
                nm, npr = (list(args) + [32, 256])[1:3]
                layer = Segment(nc, ch, int(nm), width_of(npr), proto26=kind == "Segment26", **common)
            elif kind.startswith("Pose"):
                kpt = args[1] if len(args) > 1 and not isinstance(args[1], str) else arch.get("kpt_shape", [17, 3])
                layer = Pose(nc, ch, kpt, pose26=kind == "Pose26", **common)
            else:
                layer = Detect(nc, ch, **common)
            c2 = 0
        else:
            raise MlxnetError(f"architecture row {i}: module {kind!r} is not one mlxnet builds "
                              f"(Conv, C2f, C3k2, SPPF, C2PSA, nn.Upsample, Concat, {', '.join(HEADS)})")
        if repeats > 1 and kind not in ("C2f", "C3k2", "C2PSA"):
            raise MlxnetError(f"architecture row {i}: {kind} repeated {repeats} times is not supported")
        layers.append(layer)
        sources.append(source)
        channels.append(c2)
    if not layers or not isinstance(layers[-1], Detect):
        raise MlxnetError(f"the architecture has no head ({', '.join(HEADS)}) as its last row")
    return layers, sources, scale


def torch_state_to_mlx(state: dict[str, Any]) -> dict[str, mx.array]:
    """An ultralytics state dict (PyTorch layouts) as this network's parameters: conv weights
    OIHW -> OHWI (the prototypes' transposed conv IOHW -> OHWI), BatchNorm step counters and
    YOLO26-pose's training-only flow model dropped."""
    out = {}
    for key, value in state.items():
        if key.endswith("num_batches_tracked") or ".flow_model." in key:
            continue
        out[key] = from_torch_layout(mx.array(value), layout_of(key, tuple(value.shape)))
    return out


def layout_of(key: str, shape: tuple[int, ...]) -> str:
    """The PyTorch layout of an ultralytics YOLO tensor."""
    if len(shape) != 4:
        return "plain"
    return "conv_transpose2d" if key.endswith("proto.upsample.weight") else "conv2d"
