"""The building blocks of ultralytics' YOLO detectors, NHWC: Conv (BN + SiLU), the CSP blocks
of YOLOv8 (C2f) and YOLO11 / YOLO26 (C3k2, C3k as C3, C2PSA with its attention), SPPF, and the
Detect head in its three forms (YOLOv8's, YOLO11's depthwise class branch, YOLO26's direct
distances with a one-to-one head). Parameter names are ultralytics' (``cv1.conv.weight``...), so
checkpoints load key for key. :mod:`.yolo_arch` assembles them into networks.
"""
from __future__ import annotations

import math
from typing import Sequence

import mlx.core as mx
import mlx.nn as nn

from mlxnet import ops
from mlxnet.errors import MlxnetError
from mlxnet.nn import Conv2d, batch_norm_act, fuse_conv_bn

STRIDES = (8, 16, 32)
BN_EPS = 1e-3  # ultralytics' initialize_weights sets every BatchNorm2d's eps to 1e-3
REG_MAX = 16  # DFL bins per box side
class Conv(nn.Module):
    """Conv2d (no bias, 'same' padding) + BatchNorm + SiLU; ``fold_bn`` keeps a biased conv only."""

    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1, act: bool = True, fold_bn: bool = False,
                 g: int = 1) -> None:
        super().__init__()
        self.conv = Conv2d(c1, c2, k, s, padding=k // 2, groups=g, bias=fold_bn)
        if not fold_bn:
            self.bn = nn.BatchNorm(c2, eps=BN_EPS)
        self.act = act

    def __call__(self, x: mx.array | Sequence[mx.array]) -> mx.array:
        """A list ``x`` is the channel concatenation of its parts (a 1x1 conv only), computed
        without building it."""
        conv, bias = self.conv, self.conv.get("bias")  # only a folded conv has a bias
        # Folded: conv, bias and SiLU are one op. Else the SiLU follows the BatchNorm.
        activation = "silu" if self.act and "bn" not in self else None
        if isinstance(x, (list, tuple)):
            x = ops.pointwise_conv_of_concat(x, conv.weight, bias, activation=activation)
        else:
            x = ops.conv2d(x, conv.weight, bias, stride=conv.stride, padding=conv.padding, groups=conv.groups,
                           activation=activation)
        if "bn" in self:
            return batch_norm_act(self.bn, x, "silu" if self.act else None)
        return x

    def fuse(self) -> None:
        """Fold the BatchNorm into the conv in place (torch's fuse_conv_bn_weights arithmetic, as
        ultralytics' predictor does), so fused outputs match ultralytics' fused model."""
        if "bn" in self:
            self.conv = fuse_conv_bn(self.conv, self.bn)
            del self["bn"]


class Bottleneck(nn.Module):
    """Two Convs (kernels ``k``, hidden channels ``c2 · e``), with a residual connection when
    ``shortcut`` (and shapes agree)."""

    def __init__(self, c1: int, c2: int, shortcut: bool = True, fold_bn: bool = False,
                 k: tuple[int, int] = (3, 3), e: float = 1.0) -> None:
        super().__init__()
        hidden = int(c2 * e)
        self.cv1 = Conv(c1, hidden, k[0], fold_bn=fold_bn)
        self.cv2 = Conv(hidden, c2, k[1], fold_bn=fold_bn)
        self.add = shortcut and c1 == c2

    def __call__(self, x: mx.array) -> mx.array:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Module):
    """CSP bottleneck, 'faster' variant: split cv1's output in two, chain n bottlenecks on the
    second half, and fuse every intermediate (2 + n halves) with a 1x1 conv."""

    def __init__(self, c1: int, c2: int, n: int = 1, shortcut: bool = False, fold_bn: bool = False,
                 e: float = 0.5) -> None:
        super().__init__()
        self.c = int(c2 * e)
        self.cv1 = Conv(c1, 2 * self.c, 1, fold_bn=fold_bn)
        self.cv2 = Conv((2 + n) * self.c, c2, 1, fold_bn=fold_bn)
        self.m = [Bottleneck(self.c, self.c, shortcut, fold_bn=fold_bn) for _ in range(n)]

    def __call__(self, x: mx.array | Sequence[mx.array]) -> mx.array:
        """``x``: a map, or the parts of the neck's concatenation (see :meth:`Conv.__call__`)."""
        a = self.cv1(x)
        parts, last = [a], a[..., self.c:]  # cv2 reads both halves of cv1's output: keep it whole
        for block in self.m:
            last = block(last)
            parts.append(last)
        return self.cv2(parts)


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast: 5x5 max pools chained three times (one fused op here).
    YOLO26's variant leaves cv1 without its SiLU (``act``) and adds the input back
    (``shortcut``)."""

    def __init__(self, c1: int, c2: int, fold_bn: bool = False, act: bool = True, shortcut: bool = False) -> None:
        super().__init__()
        c_ = c1 // 2
        self.cv1 = Conv(c1, c_, 1, act=act, fold_bn=fold_bn)
        self.cv2 = Conv(4 * c_, c2, 1, fold_bn=fold_bn)
        self.add = shortcut and c1 == c2

    def __call__(self, x: mx.array) -> mx.array:
        y = self.cv1(x)
        y = self.cv2([y, *ops.sppf_pool(y)])
        return x + y if self.add else y


class Upsample(nn.Module):
    """Nearest-neighbour x2 (NHWC)."""

    def __call__(self, x: mx.array) -> mx.array:
        n, h, w, c = x.shape
        return mx.broadcast_to(x[:, :, None, :, None, :], (n, h, 2, w, 2, c)).reshape(n, 2 * h, 2 * w, c)


class Concat(nn.Module):
    """A channel-concatenation row of the ultralytics layer list. It holds no weights and never
    runs: the forward hands its parts to the next C2f, whose 1×1 conv reads them in place."""


class DFL(nn.Module):
    """Distribution focal loss decoding's weights: the values the 16 bins of each box side
    stand for, as a 1x1 conv. :func:`mlxnet.ops.dfl_decode` takes the softmax expectation of
    them. They are 0..15, set here and never learned (ultralytics builds the conv with
    ``requires_grad_(False)``); checkpoints store them all the same."""

    # Random initialisation keeps it: bins drawn at random decode boxes whose sides have any
    # sign, so their right edge may lie left of their left edge (mlxnet.weights.random_weights).
    fixed_parameters = ("conv.weight",)

    def __init__(self, bins: int = REG_MAX) -> None:
        super().__init__()
        self.conv = Conv2d(bins, 1, 1, bias=False)
        self.conv.weight = mx.arange(bins, dtype=mx.float32).reshape(1, 1, 1, bins)

    def bin_values(self) -> mx.array:
        return self.conv.weight.reshape(-1)


class Detect(nn.Module):
    """Decoupled head: per level a box branch (cv2, 4 x ``reg_max`` distance logits) and a class
    branch (cv3).

    YOLO11 and later (``legacy=False``) build the class branch from depthwise + pointwise convs;
    YOLO26 predicts each side's distance directly (``reg_max=1``, no DFL) and carries a second,
    one-to-one head (``end2end``: ``one2one_cv2``, ``one2one_cv3``) trained to need no NMS.

    Returns (N, A, 4 + nc) in float32: xywh boxes in input pixels, then class probabilities,
    anchors ordered level by level, row-major within a level (ultralytics' (N, 4 + nc, A),
    transposed to NLC), from the one-to-many head (ultralytics' default, ``nms=None``).
    """

    def __init__(self, nc: int, ch: Sequence[int], fold_bn: bool = False, reg_max: int = REG_MAX,
                 legacy: bool = True, end2end: bool = False) -> None:
        super().__init__()
        self.nc, self.reg_max = nc, reg_max
        c2, c3 = max(16, ch[0] // 4, reg_max * 4), max(ch[0], min(nc, 100))

        def box_branch(x: int) -> list:
            return [Conv(x, c2, 3, fold_bn=fold_bn), Conv(c2, c2, 3, fold_bn=fold_bn), Conv2d(c2, 4 * reg_max, 1)]

        def cls_branch(x: int) -> list:
            if legacy:
                return [Conv(x, c3, 3, fold_bn=fold_bn), Conv(c3, c3, 3, fold_bn=fold_bn), Conv2d(c3, nc, 1)]
            return [[Conv(x, x, 3, g=x, fold_bn=fold_bn), Conv(x, c3, 1, fold_bn=fold_bn)],
                    [Conv(c3, c3, 3, g=c3, fold_bn=fold_bn), Conv(c3, c3, 1, fold_bn=fold_bn)],
                    Conv2d(c3, nc, 1)]
        self.cv2 = [box_branch(x) for x in ch]
        self.cv3 = [cls_branch(x) for x in ch]
        if end2end:
            self.one2one_cv2 = [box_branch(x) for x in ch]
            self.one2one_cv3 = [cls_branch(x) for x in ch]
        if reg_max > 1:
            self.dfl = DFL(reg_max)

    def __call__(self, feats: Sequence[mx.array], one2one: bool = False) -> mx.array:
        """The decoded (N, A, 4 + nc) of the one-to-many head, or of the one-to-one head."""
        maps = [m for level in self.branches(feats, one2one=one2one) for m in level]
        if self.reg_max > 1:
            return ops.dfl_decode(self.dfl.bin_values(), *maps, strides=STRIDES)
        return direct_decode(maps, STRIDES)

    def branches(self, feats: Sequence[mx.array], one2one: bool = False) -> list[tuple[mx.array, mx.array]]:
        """Per level: the box branch's logits (N, H, W, 4·reg_max) and the class branch's
        logits, of the one-to-many head or (``one2one``) the one-to-one head."""
        boxes, classes = (self.one2one_cv2, self.one2one_cv3) if one2one else (self.cv2, self.cv3)
        return [(_chain(box_branch, x), _chain(cls_branch, x))
                for x, box_branch, cls_branch in zip(feats, boxes, classes)]

    def raw(self, feats: Sequence[mx.array]) -> mx.array:
        """The undecoded outputs training reads: (N, A, 4·16 + nc), each anchor's box-bin logits
        then its class logits, anchors in :meth:`__call__`'s order."""
        rows = [mx.concatenate([b, s], axis=-1).reshape(b.shape[0], b.shape[1] * b.shape[2], -1)
                for b, s in self.branches(feats)]
        return mx.concatenate(rows, axis=1)


def _chain(layers: Sequence, x: mx.array) -> mx.array:
    """Apply ``layers`` in order; a nested list is a sub-chain (ultralytics' nested Sequential)."""
    for layer in layers:
        x = _chain(layer, x) if isinstance(layer, list) else layer(x)
    return x


def direct_decode(maps: Sequence[mx.array], strides: Sequence[int], xywh: bool = True) -> mx.array:
    """Decode a head that predicts each side's distance directly (YOLO26, ``reg_max=1``):
    ``maps`` level by level the distances (N, H, W, 4) and class logits (N, H, W, nc). Returns
    (N, A, 4 + nc) float32: xywh (or xyxy) in input pixels, then class probabilities."""
    n = maps[0].shape[0]
    p, st = _anchor_points(maps[0::2], strides)
    d = mx.concatenate([b.reshape(n, -1, 4) for b in maps[0::2]], axis=1).astype(mx.float32)
    logits = mx.concatenate([c.reshape(n, -1, c.shape[-1]) for c in maps[1::2]], axis=1).astype(mx.float32)
    lo, hi = p - d[..., :2], p + d[..., 2:]
    box = mx.concatenate([(lo + hi) / 2, hi - lo] if xywh else [lo, hi], axis=-1) * st
    return mx.concatenate([box, mx.sigmoid(logits)], axis=-1)


def _check_input(x: mx.array) -> None:
    if x.ndim != 4 or x.shape[-1] != 3 or x.shape[1] % 32 or x.shape[2] % 32:
        raise MlxnetError(f"YOLO expects (N, H, W, 3) with H and W multiples of 32, got shape {x.shape}")


def _make_divisible(x: float, divisor: int = 8) -> int:
    return math.ceil(x / divisor) * divisor


# --- the blocks YOLO11 and YOLO26 add to YOLOv8's ---------------------------------------------

class C3(nn.Module):
    """CSP bottleneck with three convs: two 1x1 branches, bottlenecks on the first, fused by cv3."""

    def __init__(self, c1: int, c2: int, n: int = 1, shortcut: bool = True, e: float = 0.5, k: int = 3,
                 fold_bn: bool = False) -> None:
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = Conv(c1, c_, 1, fold_bn=fold_bn)
        self.cv2 = Conv(c1, c_, 1, fold_bn=fold_bn)
        self.cv3 = Conv(2 * c_, c2, 1, fold_bn=fold_bn)
        self.m = [Bottleneck(c_, c_, shortcut, fold_bn=fold_bn, k=(k, k)) for _ in range(n)]

    def __call__(self, x: mx.array) -> mx.array:
        return self.cv3([_chain(self.m, self.cv1(x)), self.cv2(x)])


class Attention(nn.Module):
    """Multi-head self-attention over a map's positions, keys half a head wide, plus a depthwise
    3x3 positional term on the values."""

    def __init__(self, dim: int, num_heads: int, attn_ratio: float = 0.5, fold_bn: bool = False) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.key_dim = int(self.head_dim * attn_ratio)
        self.qkv = Conv(dim, dim + 2 * self.key_dim * num_heads, 1, act=False, fold_bn=fold_bn)
        self.proj = Conv(dim, dim, 1, act=False, fold_bn=fold_bn)
        self.pe = Conv(dim, dim, 3, g=dim, act=False, fold_bn=fold_bn)

    def __call__(self, x: mx.array) -> mx.array:
        n, h, w, c = x.shape
        kd = self.key_dim
        # Channels are grouped per head: [q (kd), k (kd), v (head_dim)] for each head in turn.
        qkv = self.qkv(x).reshape(n, h * w, self.num_heads, 2 * kd + self.head_dim).transpose(0, 2, 1, 3)
        q, k, v = qkv[..., :kd], qkv[..., kd:2 * kd], qkv[..., 2 * kd:]
        out = ops.scaled_dot_product_attention(q, k, v, scale=kd ** -0.5)
        merge = lambda t: t.transpose(0, 2, 1, 3).reshape(n, h, w, c)  # noqa: E731
        return self.proj(merge(out) + self.pe(merge(v)))


class PSABlock(nn.Module):
    """Attention then a 2x feed-forward of 1x1 convs, each added to its input."""

    def __init__(self, c: int, attn_ratio: float = 0.5, num_heads: int = 4, fold_bn: bool = False) -> None:
        super().__init__()
        self.attn = Attention(c, num_heads, attn_ratio, fold_bn=fold_bn)
        self.ffn = [Conv(c, 2 * c, 1, fold_bn=fold_bn), Conv(2 * c, c, 1, act=False, fold_bn=fold_bn)]

    def __call__(self, x: mx.array) -> mx.array:
        x = x + self.attn(x)
        return x + _chain(self.ffn, x)


class C2PSA(nn.Module):
    """Split a 1x1 conv's output in two, run PSA blocks on the second half, fuse both halves."""

    def __init__(self, c1: int, c2: int, n: int = 1, e: float = 0.5, fold_bn: bool = False) -> None:
        super().__init__()
        if c1 != c2:
            raise MlxnetError(f"C2PSA keeps its width: got {c1} channels in, {c2} out")
        self.c = int(c1 * e)
        self.cv1 = Conv(c1, 2 * self.c, 1, fold_bn=fold_bn)
        self.cv2 = Conv(2 * self.c, c1, 1, fold_bn=fold_bn)
        self.m = [PSABlock(self.c, 0.5, max(self.c // 64, 1), fold_bn=fold_bn) for _ in range(n)]

    def __call__(self, x: mx.array) -> mx.array:
        y = self.cv1(x)
        return self.cv2([y[..., :self.c], _chain(self.m, y[..., self.c:])])


class C3k2(C2f):
    """C2f whose blocks are plain bottlenecks (half-width), C3k blocks (``c3k``), or a bottleneck
    followed by a PSA block (``attn``, YOLO26's last neck stage)."""

    def __init__(self, c1: int, c2: int, n: int = 1, c3k: bool = False, e: float = 0.5, attn: bool = False,
                 shortcut: bool = True, fold_bn: bool = False) -> None:
        super().__init__(c1, c2, n, shortcut, fold_bn=fold_bn, e=e)
        c = self.c
        if attn:
            self.m = [[Bottleneck(c, c, shortcut, fold_bn=fold_bn, e=0.5),
                       PSABlock(c, 0.5, max(c // 64, 1), fold_bn=fold_bn)] for _ in range(n)]
        elif c3k:
            self.m = [C3(c, c, 2, shortcut, fold_bn=fold_bn) for _ in range(n)]
        else:
            self.m = [Bottleneck(c, c, shortcut, fold_bn=fold_bn, e=0.5) for _ in range(n)]

    def __call__(self, x: mx.array | Sequence[mx.array]) -> mx.array:
        a = self.cv1(x)
        parts, last = [a], a[..., self.c:]
        for block in self.m:
            last = _chain(block, last) if isinstance(block, list) else block(last)
            parts.append(last)
        return self.cv2(parts)


# --- the heads of the segment and pose tasks ----------------------------------------------------

def _upsample(x: mx.array, factor: int) -> mx.array:
    """Nearest-neighbour upsampling by an integer ``factor`` (NHWC)."""
    n, h, w, c = x.shape
    return mx.broadcast_to(x[:, :, None, :, None, :], (n, h, factor, w, factor, c)).reshape(n, h * factor, w * factor, c)


class Proto(nn.Module):
    """Mask prototypes at stride 4: a 3x3 conv, a learned x2 upsampling (transposed conv), a
    3x3 conv, a 1x1 conv to ``c2`` prototype maps. YOLO26's form (``ch`` given) first adds the
    coarser levels, each through a 1x1 conv and nearest upsampling, to the stride-8 map and
    fuses them with a 3x3 conv; its semantic branch (``semseg``) only trains."""

    def __init__(self, c1: int, c_: int = 256, c2: int = 32, fold_bn: bool = False,
                 ch: Sequence[int] | None = None, nc: int = 80) -> None:
        super().__init__()
        from mlxnet.nn import ConvTranspose2d

        if ch is not None:  # YOLO26: its inner width is c_ throughout
            self.feat_refine = [Conv(x, ch[0], 1, fold_bn=fold_bn) for x in ch[1:]]
            self.feat_fuse = Conv(ch[0], c_, 3, fold_bn=fold_bn)
            self.semseg = [Conv(ch[0], c_, 3, fold_bn=fold_bn), Conv(c_, c_, 3, fold_bn=fold_bn), Conv2d(c_, nc, 1)]
            c1 = c_
        self.cv1 = Conv(c1, c_, 3, fold_bn=fold_bn)
        self.upsample = ConvTranspose2d(c_, c_, 2, 2, 0, bias=True)
        self.cv2 = Conv(c_, c_, 3, fold_bn=fold_bn)
        self.cv3 = Conv(c_, c2, 1, fold_bn=fold_bn)

    def __call__(self, feats: Sequence[mx.array]) -> mx.array:
        x = feats[0]
        if "feat_fuse" in self:
            for i, refine in enumerate(self.feat_refine):
                x = x + _upsample(refine(feats[i + 1]), 2 ** (i + 1))
            x = self.feat_fuse(x)
        return self.cv3(self.cv2(self.upsample(self.cv1(x))))


class Segment(Detect):
    """Detect plus per-anchor mask coefficients (cv4, ``nm`` each) and the prototypes they weigh
    (:class:`Proto`); YOLO26's form (``proto26``) builds its prototypes from every level."""

    def __init__(self, nc: int, ch: Sequence[int], nm: int = 32, npr: int = 256, fold_bn: bool = False,
                 reg_max: int = REG_MAX, legacy: bool = True, end2end: bool = False, proto26: bool = False) -> None:
        super().__init__(nc, ch, fold_bn, reg_max, legacy, end2end)
        self.nm = nm
        self.proto = Proto(ch[0], npr, nm, fold_bn, ch=ch if proto26 else None, nc=nc)
        c4 = max(ch[0] // 4, nm)
        branch = lambda x: [Conv(x, c4, 3, fold_bn=fold_bn), Conv(c4, c4, 3, fold_bn=fold_bn), Conv2d(c4, nm, 1)]  # noqa: E731
        self.cv4 = [branch(x) for x in ch]
        if end2end:
            self.one2one_cv4 = [branch(x) for x in ch]

    def extras(self, feats: Sequence[mx.array], one2one: bool = False) -> dict[str, mx.array]:
        """The mask coefficients (N, A, nm) and the prototypes (N, H/4, W/4, nm)."""
        heads = self.one2one_cv4 if one2one else self.cv4
        n = feats[0].shape[0]
        coeffs = [_chain(h, x).reshape(n, -1, self.nm) for h, x in zip(heads, feats)]
        return {"mask_coefficients": mx.concatenate(coeffs, axis=1), "protos": self.proto(feats)}


class Pose(Detect):
    """Detect plus per-anchor keypoints (cv4): ``kpt_shape`` (K, 2 or 3) offsets from the anchor
    in units of twice the stride, and a visibility logit. YOLO26's form (``pose26``) splits cv4
    into a shared trunk, ``cv4_kpts`` and a training-only ``cv4_sigma`` (its RealNVP flow model
    also only trains)."""

    def __init__(self, nc: int, ch: Sequence[int], kpt_shape: Sequence[int] = (17, 3), fold_bn: bool = False,
                 reg_max: int = REG_MAX, legacy: bool = True, end2end: bool = False, pose26: bool = False) -> None:
        super().__init__(nc, ch, fold_bn, reg_max, legacy, end2end)
        self.kpt_shape = tuple(int(k) for k in kpt_shape)
        self.pose26 = pose26
        nk = self.kpt_shape[0] * self.kpt_shape[1]
        if pose26:
            c4 = max(ch[0] // 4, self.kpt_shape[0] * (self.kpt_shape[1] + 2))
            trunk = lambda x: [Conv(x, c4, 3, fold_bn=fold_bn), Conv(c4, c4, 3, fold_bn=fold_bn)]  # noqa: E731
            heads = {"cv4": lambda x: trunk(x), "cv4_kpts": lambda x: Conv2d(c4, nk, 1),
                     "cv4_sigma": lambda x: Conv2d(c4, 2 * self.kpt_shape[0], 1)}
        else:
            c4 = max(ch[0] // 4, nk)
            heads = {"cv4": lambda x: [Conv(x, c4, 3, fold_bn=fold_bn), Conv(c4, c4, 3, fold_bn=fold_bn),
                                       Conv2d(c4, nk, 1)]}
        for name, make in heads.items():
            setattr(self, name, [make(x) for x in ch])
            if end2end:
                setattr(self, f"one2one_{name}", [make(x) for x in ch])

    def extras(self, feats: Sequence[mx.array], one2one: bool = False) -> dict[str, mx.array]:
        """The raw keypoint outputs (N, A, K·dims), before :meth:`decode_keypoints`."""
        prefix = "one2one_" if one2one else ""
        trunk, kpts = getattr(self, prefix + "cv4"), self.get(prefix + "cv4_kpts")
        n, nk = feats[0].shape[0], self.kpt_shape[0] * self.kpt_shape[1]
        rows = []
        for i, x in enumerate(feats):
            y = _chain(trunk[i], x)
            rows.append((kpts[i](y) if kpts is not None else y).reshape(n, -1, nk))
        return {"keypoints": mx.concatenate(rows, axis=1)}

    def decode_keypoints(self, raw: mx.array, feats: Sequence[mx.array]) -> mx.array:
        """(N, A, K·dims) raw -> keypoints in input pixels: x = (2·dx + anchor_x − 0.5)·stride
        (anchor at the cell's centre; YOLO26: (dx + anchor_x)·stride), visibility through a
        sigmoid."""
        k, dims = self.kpt_shape
        n, a = raw.shape[:2]
        y = raw.astype(mx.float32).reshape(n, a, k, dims)
        points, stride = _anchor_points(feats, STRIDES)
        offset = y[..., :2] if self.pose26 else y[..., :2] * 2.0 - 0.5
        xy = (offset + points[:, None, :]) * stride[:, None, :]
        parts = [xy, mx.sigmoid(y[..., 2:3])] if dims == 3 else [xy]
        return mx.concatenate(parts, axis=-1).reshape(n, a, k * dims)


def _anchor_points(feats: Sequence[mx.array], strides: Sequence[int]) -> tuple[mx.array, mx.array]:
    """Every anchor's centre in grid units (A, 2) and its stride (A, 1), level by level."""
    points, scale = [], []
    for x, s in zip(feats, strides):
        h, w = x.shape[1:3]
        ys, xs = mx.meshgrid(mx.arange(h, dtype=mx.float32) + 0.5, mx.arange(w, dtype=mx.float32) + 0.5, indexing="ij")
        points.append(mx.stack([xs.reshape(-1), ys.reshape(-1)], axis=-1))
        scale.append(mx.full((h * w, 1), float(s)))
    return mx.concatenate(points), mx.concatenate(scale)
