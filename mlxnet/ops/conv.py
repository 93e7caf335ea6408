"""2-D convolution (NHWC input, OHWI weight): the definition is ``mx.conv2d``; the CPU fast
path picks a formulation by shape, because MLX's CPU convolution is im2col through a scalar
strided copy plus one GEMM:

- 1×1 convs: one GEMM (per channel part, for a concatenation that is never built);
- depthwise convs: fused shifted multiply-adds;
- few output channels: one GEMM to every tap's product, then the shifted maps summed;
- stride-1 3×3 on larger maps: one GEMM per tap on row ranges of the padded image (no copy),
  accumulated by the GEMMs themselves;
- strided convs and small maps: mlxnet's C++ im2col on every core, then one GEMM;
- small channel counts (float32, C_out a multiple of 16): mlxnet's C++ direct convolution,
  bias and SiLU fused;
- anything else: ``mx.conv2d``; very large inputs run in bands of output rows.

On GPUs the op runs MLX's own convolution; on CUDA, stride-1 3×3 convs of 40–56 channels
and float32 stride-2 ones from 32 on large maps run on pairs of columns packed into twice the
channels (cuDNN picks slow kernels for these), and float32 convs to 1–3 channels from many
run as the taps' GEMM and shifted sums above. The thresholds and the measurements behind
each rule:
docs/performance-notes.md.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import mlx.core as mx
import numpy as np

from .. import _native
from ..device import backend, is_tracing
from ..errors import MlxnetError
from .args import as_tuple, shape_of
from .activations import silu
from .registry import register

Pair = tuple[int, int]


def _pair(v: int | tuple[int, ...], what: str = "stride, padding and dilation") -> Pair:
    return as_tuple(v, 2, what, "conv2d")  # type: ignore[return-value]


@lru_cache(maxsize=None)
def _depthwise(kernel: Pair, stride: Pair, dilation: Pair, out: Pair):
    """A compiled sum over kernel taps of strided slices × per-channel weights (cached per geometry,
    so mx.compile traces each once)."""
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = kernel, stride, dilation, out

    def run(xp: mx.array, w: mx.array) -> mx.array:
        acc = None
        for i in range(kh):
            for j in range(kw):
                tap = xp[:, i * dh: i * dh + sh * (oh - 1) + 1: sh, j * dw: j * dw + sw * (ow - 1) + 1: sw, :]
                term = tap * w[:, i, j, 0]
                acc = term if acc is None else acc + term
        return acc
    return mx.compile(run)


def _check_groups(x: mx.array, weight: mx.array, groups: int) -> None:
    c, (c_out, c_in_g) = x.shape[-1], (weight.shape[0], weight.shape[-1])
    if c_in_g * groups != c or c_out % groups:
        raise MlxnetError(f"conv2d: weight {tuple(weight.shape)} with groups={groups} does not fit "
                          f"an input of {c} channels")


def _check_activation(activation: str | None) -> None:
    if activation not in (None, "silu"):
        raise MlxnetError(f"conv2d: activation must be None or 'silu', got {activation!r}")


def _builtin(x: mx.array, weight: mx.array, bias: mx.array | None = None, *, stride: int | Pair = 1,
             padding: int | Pair = 0, dilation: int | Pair = 1, groups: int = 1,
             activation: str | None = None) -> mx.array:
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    if _pairs_help(x, weight, stride, padding, dilation, groups):
        y = column_pair_conv3x3(x, weight)
    elif _strided_pairs_help(x, weight, stride, padding, dilation, groups):
        y = column_pair_conv3x3_s2(x, weight)
    elif _taps_help(x, weight, stride, padding, dilation, groups):
        xp = mx.pad(x, [(0, 0), (padding[0], padding[0]), (padding[1], padding[1]), (0, 0)])
        y = _taps_then_shift(xp, weight, dilation, _out_size(x, weight, stride, padding, dilation))
    else:
        y = mx.conv2d(x, weight, stride=stride, padding=padding, dilation=dilation, groups=groups)
    if activation == "silu":
        return silu(y, bias)
    return y if bias is None else y + bias


# Channel counts whose stride-1 3×3 convs cuDNN runs slowly on CUDA and that run faster as
# column-pair convs, on maps of at least this many output pixels (N·H·W), below which the
# weight's rearrangement costs more than it saves (measured; docs/performance-notes.md).
PAIRED_CHANNELS = frozenset({40, 48, 56})
MIN_PAIRED_PIXELS = 150_000


def _column_pairs_fit(x: mx.array, weight: mx.array, stride: Pair, padding: Pair, dilation: Pair,
                      groups: int) -> bool:
    """What both column-pair forms need: CUDA, a dense 3×3 conv padded by 1 of an even-width map,
    with at least MIN_PAIRED_PIXELS output pixels."""
    oh, ow = _out_size(x, weight, stride, padding, dilation)
    return (backend() == "cuda" and groups == 1 and tuple(weight.shape[1:3]) == (3, 3) and padding == (1, 1)
            and dilation == (1, 1) and x.shape[2] % 2 == 0 and x.shape[0] * oh * ow >= MIN_PAIRED_PIXELS)


def _pairs_help(x: mx.array, weight: mx.array, stride: Pair, padding: Pair, dilation: Pair, groups: int) -> bool:
    return (stride == (1, 1) and weight.shape[0] in PAIRED_CHANNELS and weight.shape[-1] in PAIRED_CHANNELS
            and _column_pairs_fit(x, weight, stride, padding, dilation, groups))


# Input channel counts whose stride-2 3×3 convs cuDNN runs slowly on CUDA in float32 (an indexed
# kernel far below its usual rate: YOLOv8s's second conv) and that run faster on column pairs, on
# maps of at least MIN_PAIRED_PIXELS output pixels (measured; docs/performance-notes.md).
STRIDED_PAIR_CHANNELS = frozenset({32})


def _strided_pairs_help(x: mx.array, weight: mx.array, stride: Pair, padding: Pair, dilation: Pair,
                        groups: int) -> bool:
    return (stride == (2, 2) and x.dtype == weight.dtype == mx.float32 and weight.shape[-1] in STRIDED_PAIR_CHANNELS
            and _column_pairs_fit(x, weight, stride, padding, dilation, groups))


# float32 convs to at most this many output channels from at least MIN_TAPS_CHANNELS run faster
# on CUDA as one GEMM to every tap's product and the shifted products summed (cuDNN's implicit
# GEMM wastes most of a tile on so few outputs); the taps' products are capped at
# MAX_TAPS_BYTES (measured; docs/performance-notes.md).
MAX_TAPS_OUT = 3
MIN_TAPS_CHANNELS = 64
MAX_TAPS_BYTES = 2 << 30


def _taps_help(x: mx.array, weight: mx.array, stride: Pair, padding: Pair, dilation: Pair, groups: int) -> bool:
    c_out, kh, kw, c = weight.shape
    n, h, w, _ = x.shape
    taps_bytes = n * (h + 2 * padding[0]) * (w + 2 * padding[1]) * kh * kw * c_out * 4
    return (backend() == "cuda" and x.dtype == weight.dtype == mx.float32 and groups == 1
            and stride == (1, 1) and kh * kw > 1 and c_out <= MAX_TAPS_OUT and c >= MIN_TAPS_CHANNELS
            and taps_bytes <= MAX_TAPS_BYTES)


def _out_size(x: mx.array, weight: mx.array, stride: Pair, padding: Pair, dilation: Pair) -> Pair:
    return tuple((x.shape[1 + a] + 2 * padding[a] - dilation[a] * (weight.shape[1 + a] - 1) - 1) // stride[a] + 1
                 for a in (0, 1))  # type: ignore[return-value]


@lru_cache(maxsize=16)
def _pair_gather(o: int, c: int) -> tuple[mx.array, mx.array]:
    """Where each element of the (2·o, 3, 3, 2·c) column-pair weight comes from in the flat
    (o, 3, 3, c) weight, and which elements lie inside the kernel (the rest are zeros). Output
    column 2j+t and packed input column j+J-1 (J = 0, 1, 2), part s, meet at kernel column
    2(J-1) + s - t + 1 where that lies in 0..2; elsewhere the pair is outside the kernel."""
    t, oo, row, J, s, cc = np.meshgrid(*(np.arange(k) for k in (2, o, 3, 3, 2, c)), indexing="ij")
    col = 2 * (J - 1) + s - t + 1
    inside = (col >= 0) & (col <= 2)
    index = ((oo * 3 + row) * 3 + np.clip(col, 0, 2)) * c + cc
    return mx.array(index.reshape(-1).astype(np.int32)), mx.array(inside.reshape(-1))


def column_pair_conv3x3(x: mx.array, weight: mx.array) -> mx.array:
    """A stride-1, padding-1 3×3 conv of an NHWC map of even width, run on pairs of columns:
    (N, H, W, C) is read as (N, H, W/2, 2C) (a free reshape), and the conv becomes a 3×3 conv of
    2C to 2·C_out channels whose weight places each kernel column where its pair part lands
    (zeros elsewhere). Twice the multiply-adds, at channel counts cuDNN runs well."""
    n, h, w, c = x.shape
    o = weight.shape[0]
    index, inside = _pair_gather(o, c)
    packed = mx.where(inside, mx.take(weight.reshape(-1), index), 0).reshape(2 * o, 3, 3, 2 * c)
    y = mx.conv2d(x.reshape(n, h, w // 2, 2 * c), packed, padding=(1, 1))
    return y.reshape(n, h, w, o)


def column_pair_conv3x3_s2(x: mx.array, weight: mx.array) -> mx.array:
    """A stride-2, padding-1 3×3 conv of an NHWC map of even width, on pairs of columns: output
    column j reads input columns 2j-1, 2j and 2j+1, the second half of pair j-1 and all of pair
    j. So (N, H, W, C) read as (N, H, W/2, 2C) (a free reshape) meets a 3×2 kernel of 2C
    channels at stride (2, 1), padded by one pair on the left only, whose first column is zero
    over the first half of its pair: 4/3 of the multiply-adds, at a channel count cuDNN runs well."""
    n, h, w, c = x.shape
    o = weight.shape[0]
    packed = mx.pad(weight, [(0, 0), (0, 0), (1, 0), (0, 0)]).reshape(o, 3, 2, 2 * c)
    return mx.conv_general(x.reshape(n, h, w // 2, 2 * c), packed, stride=(2, 1), padding=([1, 1], [1, 0]))


@lru_cache(maxsize=None)
def _sum_of(count: int):
    """One fused pass adding ``count`` same-shaped (possibly strided) arrays."""
    return mx.compile(lambda *terms: sum(terms[1:], terms[0]))


def _fused_sum(terms: list[mx.array]) -> mx.array:
    # Groups of ≤ 8: MLX's compiler splits deeper chains anyway (max_compile_depth).
    while len(terms) > 1:
        terms = [_sum_of(len(g))(*g) if len(g) > 1 else g[0] for g in (terms[k:k + 8] for k in range(0, len(terms), 8))]
    return terms[0]


def _taps_then_shift(xp: mx.array, weight: mx.array, dilation: Pair, out: Pair) -> mx.array:
    """Stride-1 conv as xp @ W for every tap at once, then the taps' shifted maps summed, each
    kernel row in one fused pass (fewer passes over memory than one add per tap)."""
    n, hp, wp, c = xp.shape
    c_out, kh, kw, _ = weight.shape
    z = (xp.reshape(-1, c) @ weight.transpose(3, 1, 2, 0).reshape(c, -1)).reshape(n, hp, wp, kh, kw, c_out)
    (dh, dw), (oh, ow) = dilation, out
    rows = [_fused_sum([z[:, i * dh: i * dh + oh, j * dw: j * dw + ow, i, j, :] for j in range(kw)])
            for i in range(kh)]
    return _fused_sum(rows)


def _shifted_gemms(xp: mx.array, weight: mx.array, bias: mx.array | None, dilation: Pair,
                   out: Pair) -> mx.array:
    """Stride-1 conv without im2col: on the padded image flattened to rows, the input of tap
    (i, j) for output row r is row r + i·dh·Wp + j·dw, so each tap is one GEMM of a contiguous
    row range (a view, no copy), accumulated into the previous taps' product by the GEMM itself
    (addmm, beta = 1: no separate pass over the taps' products). The rows that fall in the
    padding columns are cropped by a strided view, read once by the bias add (or one copy).
    (Strided convs split into phases this way measured slower than mx.conv2d's im2col.)"""
    n, hp, wp, c = xp.shape
    c_out, kh, kw, _ = weight.shape
    (dh, dw), (oh, ow) = dilation, out
    rows = xp.reshape(-1, c)
    m = n * hp * wp - ((kh - 1) * dh * wp + (kw - 1) * dw)
    taps = weight.transpose(1, 2, 3, 0)  # (kh, kw, c, c_out)
    y = None
    for i in range(kh):
        for j in range(kw):
            a = rows[i * dh * wp + j * dw: i * dh * wp + j * dw + m]
            y = a @ taps[i, j] if y is None else mx.addmm(y, a, taps[i, j])
    y = mx.as_strided(y, (n, oh, ow, c_out), (hp * wp * c_out, wp * c_out, c_out, 1))
    return mx.contiguous(y) if bias is None else y + bias


_DIRECT_CHANNELS = 80 * 80  # c_in·c_out up to which the direct conv beats a GEMM formulation


def _direct_fits(x: mx.array, weight: mx.array, groups: int, padding: Pair, activation: str | None) -> bool:
    """Whether a CPU conv takes the direct conv: every one it can run that is narrow
    (c_in·c_out ≤ 80²) or ends in a SiLU, which it applies while the output tile is in cache
    (the GEMM formulations need a second pass over the output for it). Measured on whole
    networks, not on single convs: between direct convs, a lone OpenBLAS GEMM leaves its
    threads spinning on the cores and slows the direct convs that follow
    (docs/performance-notes.md)."""
    c_out, kh, kw, c = weight.shape
    if not (x.dtype == weight.dtype == mx.float32 and groups == 1 and c_out % 16 == 0
            and padding[0] < kh and padding[1] < kw):
        return False
    return activation == "silu" or c * c_out <= _DIRECT_CHANNELS


_IM2COL_PIXELS = 2500  # stride-1 maps up to this many output pixels take the im2col path


def _im2col_gemm(native, x: mx.array, weight: mx.array, bias: mx.array | None, stride: Pair,
                 padding: Pair, dilation: Pair) -> mx.array:
    """The patch matrix from the CPU primitive (OHWI order: kernel row, column, channel), one GEMM."""
    c_out = weight.shape[0]
    cols = native.im2col(x, tuple(weight.shape[1:3]), stride, padding, dilation)
    n, oh, ow, k = cols.shape
    y = (cols.reshape(-1, k) @ weight.reshape(c_out, k).T).reshape(n, oh, ow, c_out)
    return y if bias is None else y + bias


def pointwise_conv_of_concat(xs: Sequence[mx.array], weight: mx.array, bias: mx.array | None = None, *,
                             activation: str | None = None) -> mx.array:
    """1×1 conv (stride 1, OHWI weight) of ``mx.concatenate(xs, axis=-1)``, then ``activation``
    (None or ``"silu"``). On the CPU without building the concatenation: with the CPU
    primitives, their direct conv reading the parts in place; else one GEMM per part, each
    accumulating into the last (addmm). On GPUs one copy builds the concatenation and one conv
    reads it: a GEMM per part would make a pass over the whole output per part. The parts must
    share N, H, W; the weight's input channels follow the parts' order."""
    c_out, c_in = weight.shape[0], weight.shape[-1]
    if weight.shape[1:3] != (1, 1) or sum(x.shape[-1] for x in xs) != c_in or len({x.shape[:3] for x in xs}) != 1:
        raise MlxnetError(f"pointwise conv: weight {tuple(weight.shape)} does not fit parts of shapes "
                          f"{[tuple(x.shape) for x in xs]}")
    _check_activation(activation)
    if backend() != "cpu":
        return conv2d(mx.concatenate(list(xs), axis=-1) if len(xs) > 1 else xs[0], weight, bias,
                      activation=activation)
    native = _native.on_cpu()
    if (native is not None and len(xs) <= native.max_parts and all(x.dtype == mx.float32 for x in xs)
            and _direct_fits(xs[0], weight, 1, (0, 0), activation)):
        return native.direct_conv2d(list(xs), weight, bias, (1, 1), (0, 0), (1, 1), activation == "silu")
    if activation == "silu":
        return silu(pointwise_conv_of_concat(xs, weight), bias)
    w = weight.reshape(c_out, c_in)
    y, start = None, 0
    for x in xs:
        c = x.shape[-1]
        rows, taps = x.reshape(-1, c), w[:, start:start + c].T
        y = rows @ taps if y is None else mx.addmm(y, rows, taps)
        start += c
    y = y.reshape(*xs[0].shape[:3], c_out)
    return y if bias is None else y + bias


def _example() -> tuple[tuple, dict]:
    x = mx.random.normal((2, 9, 11, 8))
    return (x, mx.random.normal((8, 3, 3, 1)), mx.random.normal((8,))), {"padding": 1, "groups": 8}


# MLX's CPU convolution (and the im2col path) unfold the whole input before one GEMM: a 7×7
# conv on a 2048² image would need 52 GB. Above this many unfolded bytes, convs run in row bands.
UNFOLD_BUDGET = 256 * 2**20


def _conv2d_cpu(x: mx.array, weight: mx.array, bias: mx.array | None = None, *,
                stride: int | Pair = 1, padding: int | Pair = 0, dilation: int | Pair = 1,
                groups: int = 1, activation: str | None = None) -> mx.array:
    """The CPU fast path: in bands of output rows when the unfolded input would be large,
    each band by :func:`_conv2d_cpu_band`."""
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    n, _, _, c = x.shape
    kh, kw = weight.shape[1:3]
    span_h = dilation[0] * (kh - 1) + 1
    oh, ow = _out_size(x, weight, stride, padding, dilation)
    row_bytes = n * ow * kh * kw * c * x.dtype.size
    if oh * row_bytes <= UNFOLD_BUDGET or oh < 2:
        return _conv2d_cpu_band(x, weight, bias, stride=stride, padding=padding, dilation=dilation,
                                groups=groups, activation=activation)
    if padding[0]:
        x = mx.pad(x, [(0, 0), padding[:1] * 2, (0, 0), (0, 0)])
    rows = max(1, UNFOLD_BUDGET // row_bytes)
    bands = []
    for r in range(0, oh, rows):
        band = x[:, r * stride[0]:(min(r + rows, oh) - 1) * stride[0] + span_h]
        bands.append(_conv2d_cpu_band(band, weight, bias, stride=stride, padding=(0, padding[1]),
                                      dilation=dilation, groups=groups, activation=activation))
        # One at a time: MLX allocates an op's unfold buffer when it schedules the op and keeps
        # several ops in flight, so lazily built bands would all hold theirs at once. (Not in a
        # compiled forward's trace, which cannot evaluate: there the bands are scheduled together.)
        if not is_tracing():
            mx.eval(bands[-1])
    return mx.concatenate(bands, axis=1)


def _conv2d_cpu_band(x: mx.array, weight: mx.array, bias: mx.array | None = None, *,
                     stride: Pair, padding: Pair, dilation: Pair, groups: int = 1,
                     activation: str | None = None) -> mx.array:
    """mlxnet's direct conv, im2col, or a GEMM formulation by shape."""
    n, _, _, c = x.shape
    c_out, kh, kw, c_in_g = weight.shape
    native = _native.on_cpu()
    oh, ow = _out_size(x, weight, stride, padding, dilation)
    if native is not None and _direct_fits(x, weight, groups, padding, activation):
        return native.direct_conv2d(x, weight, bias, stride, padding, dilation, activation == "silu")
    if activation == "silu":
        return silu(conv2d(x, weight, stride=stride, padding=padding, dilation=dilation, groups=groups), bias)
    if (kh, kw) == (1, 1) and groups == 1 and padding == (0, 0):
        return pointwise_conv_of_concat([x[:, ::stride[0], ::stride[1], :] if stride != (1, 1) else x], weight, bias)
    elif groups == c == c_out and c_in_g == 1:
        xp = mx.pad(x, [(0, 0), (padding[0], padding[0]), (padding[1], padding[1]), (0, 0)])
        y = _depthwise((kh, kw), stride, dilation, (oh, ow))(xp, weight)
    elif groups == 1 and stride == (1, 1) and (kh, kw) != (1, 1) and 4 * c_out <= c:
        xp = mx.pad(x, [(0, 0), (padding[0], padding[0]), (padding[1], padding[1]), (0, 0)])
        y = _taps_then_shift(xp, weight, dilation, (oh, ow))
    elif native is not None and groups == 1 and kh * kw > 1 and kh * kw * c > 32 and (stride != (1, 1) or n * oh * ow <= _IM2COL_PIXELS):
        return _im2col_gemm(native, x, weight, bias, stride, padding, dilation)
    elif groups == 1 and stride == (1, 1) and 1 < kh * kw <= 9 and c >= 8 and n * oh * ow >= 2048:
        pads = [(0, 0), (padding[0], padding[0]), (padding[1], padding[1]), (0, 0)]
        xp = mx.pad(x, pads) if padding != (0, 0) else x
        return _shifted_gemms(xp, weight, bias, dilation, (oh, ow))
    else:
        y = mx.conv2d(x, weight, stride=stride, padding=padding, dilation=dilation, groups=groups)
    return y if bias is None else y + bias


PADDING_MODES = ("same", "valid")


def _conv2d_check(x: mx.array, weight: mx.array, bias: mx.array | None = None, *,
                  stride: int | Pair = 1, padding: int | Pair | str = 0, dilation: int | Pair = 1,
                  groups: int = 1, activation: str | None = None) -> tuple:
    """PyTorch's conv2d rules, once for every face: NHWC x and OHWI weight, ints or pairs
    (a 1-tuple repeats) with stride, dilation ≥ 1 and padding ≥ 0 or "same" / "valid", a
    (C_out,) bias, an output of at least one pixel. "same" with an even dilated kernel pads
    one more pixel after than before, as PyTorch does: that pixel is added to x here."""
    if not (isinstance(x, mx.array) and isinstance(weight, mx.array) and x.ndim == 4 and weight.ndim == 4):
        raise MlxnetError(f"conv2d: expected NHWC x and OHWI weight of 4 dimensions, got "
                          f"{shape_of(x)} and {shape_of(weight)}")
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        raise MlxnetError(f"conv2d: groups must be a positive int, got {groups!r}")
    _check_groups(x, weight, groups)
    _check_activation(activation)
    if bias is not None and (not isinstance(bias, mx.array) or bias.shape != weight.shape[:1]):
        raise MlxnetError(f"conv2d: bias must have shape ({weight.shape[0]},), got {shape_of(bias)}")
    stride, dilation = _pair(stride, "stride"), _pair(dilation, "dilation")
    if min(stride) < 1 or min(dilation) < 1:
        raise MlxnetError(f"conv2d: stride and dilation must be >= 1, got stride={stride}, dilation={dilation}")
    if isinstance(padding, str):
        if padding not in PADDING_MODES:
            raise MlxnetError(f"conv2d: padding must be an int, a pair or one of 'same', 'valid'; got {padding!r}")
        if padding == "same" and stride != (1, 1):
            raise MlxnetError(f"conv2d: padding='same' needs stride 1, got stride={stride}")
        spans = [dilation[a] * (weight.shape[1 + a] - 1) for a in (0, 1)]
        extra = [span % 2 if padding == "same" else 0 for span in spans]
        padding = (0, 0) if padding == "valid" else (spans[0] // 2, spans[1] // 2)
        if any(extra):
            x = mx.pad(x, [(0, 0), (0, extra[0]), (0, extra[1]), (0, 0)])
    padding = _pair(padding, "padding")
    if min(padding) < 0:
        raise MlxnetError(f"conv2d: padding must be >= 0, got {padding}")
    out = _out_size(x, weight, stride, padding, dilation)
    if min(out) < 1:
        raise MlxnetError(f"conv2d: a {x.shape[1]}×{x.shape[2]} input padded by {padding} is smaller than "
                          f"the dilated kernel {tuple(weight.shape[1:3])} (dilation {dilation})")
    args = (x, weight) if bias is None else (x, weight, bias)
    return args, dict(stride=stride, padding=padding, dilation=dilation, groups=groups, activation=activation)


@register("conv2d", cpu=_conv2d_cpu, kernel=_builtin, check=_conv2d_check, batched=4,
          example=_example)
def conv2d(x: mx.array, weight: mx.array, bias: mx.array | None = None, *,
           stride: int | Pair = 1, padding: int | Pair | str = 0, dilation: int | Pair = 1,
           groups: int = 1, activation: str | None = None) -> mx.array:
    """Conv2d on NHWC input (or one HWC sample) with an OHWI weight (``mx.conv2d`` semantics,
    plus bias; PyTorch's argument rules, ``padding="same"`` / ``"valid"`` included), then
    ``activation`` (None or ``"silu"``) applied to conv + bias."""
    _check_groups(x, weight, groups)
    _check_activation(activation)
    y = mx.conv2d(x, weight, stride=_pair(stride), padding=_pair(padding), dilation=_pair(dilation),
                  groups=groups)
    y = y if bias is None else y + bias
    return silu(y) if activation == "silu" else y
