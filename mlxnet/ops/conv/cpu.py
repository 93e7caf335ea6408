"""conv2d's CPU fast path, which picks a formulation by shape because MLX's CPU convolution is
im2col through a scalar strided copy plus one GEMM:

- 1×1 convs: one GEMM (per channel part, for a concatenation that is never built:
  :func:`pointwise_conv_of_concat`, which lives here);
- depthwise convs: fused shifted multiply-adds, in bands of rows on every core;
- few output channels: one GEMM to every tap's product, then the shifted maps summed
  (:mod:`.tap_gemm`);
- stride-1 3×3 on larger maps: one GEMM per tap on row ranges of the padded image (no copy),
  accumulated by the GEMMs themselves;
- strided convs and small maps: mlxnet's C++ im2col on every core, then one GEMM;
- small channel counts (float32, C_out a multiple of 16): mlxnet's C++ direct convolution,
  bias and SiLU fused;
- anything else: ``mx.conv2d``; very large inputs run in bands of output rows.

Whichever formulation runs, the gradient of a float32 ungrouped conv is GEMMs on mlxnet's
primitives (:mod:`.cpu_grad`), not autodiff through the formulation.

The thresholds and the measurements behind each rule: docs/performance-notes.md.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Sequence

import mlx.core as mx

from ... import _native
from ...device import backend, is_tracing
from ...errors import MlxnetError
from ..activations import bias_act, silu
from ..core.cpu_bands import band_count, in_bands
from ..core.registry import REGISTRY
from . import cpu_grad
from .check import Pair, _check_activation, _out_size, _pair
from .definition import epilogue
from .tap_gemm import _taps_then_shift


def _conv2d(*args: Any, **params: Any) -> mx.array:
    """conv2d as every caller gets it, through the registry's dispatcher (its check, then the
    face for the back end): this module holds the CPU face the package registers, so it reaches
    the registered op through the registry, not by importing its package."""
    return REGISTRY["conv2d"].dispatch(*args, **params)


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


_DEPTHWISE_BAND = 2**17  # output elements per band at least (smaller bands: the split costs more)


def _depthwise_in_bands(xp: mx.array, weight: mx.array, bias: mx.array | None, kernel: Pair, stride: Pair,
                        dilation: Pair, out: Pair) -> mx.array:
    """:func:`_depthwise` on the padded input ``xp``, plus the bias, in bands of output rows on
    every core (:mod:`..core.cpu_bands`): MLX runs the fused multiply-adds on one thread, a
    scalar loop over strided taps (256 channels at 256²: 89 ms alone, 52 ms on two cores)."""
    (kh, _), (sh, _), (dh, _), (oh, ow) = kernel, stride, dilation, out
    span = dh * (kh - 1) + 1

    def rows(start: int, stop: int) -> mx.array:
        band = xp[:, start * sh:(stop - 1) * sh + span]
        y = _depthwise(kernel, stride, dilation, (stop - start, ow))(band, weight)
        return y if bias is None else y + bias
    bands = band_count(xp.shape[0] * oh * ow * xp.shape[-1], _DEPTHWISE_BAND)
    return in_bands(rows, oh, bands, axis=1)


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
    if not (_direct_conv_tuned() and x.dtype == weight.dtype == mx.float32 and groups == 1 and c_out % 16 == 0
            and padding[0] < kh and padding[1] < kw):
        return False
    return activation == "silu" or c * c_out <= _DIRECT_CHANNELS


@lru_cache(maxsize=None)
def _direct_conv_tuned() -> bool:
    """Whether this CPU runs the direct conv as tuned: its register tiles are written for AVX-512
    (up to 8 pixels × 4 vectors of 16 floats in 32 registers) and for AVX2 (6 pixels × 2 vectors
    of 8 floats in 16 registers). Elsewhere (older x86, other processors) the GEMM
    formulations and ``mx.conv2d`` run these convs."""
    return _native.instruction_set() in ("x86-64-v3", "x86-64-v4")


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
    share N, H, W; the weight's input channels follow the parts' order. On the CPU its gradient
    is a GEMM per part too (:mod:`.cpu_grad`)."""
    c_in = weight.shape[-1]
    if weight.shape[1:3] != (1, 1) or sum(x.shape[-1] for x in xs) != c_in or len({x.shape[:3] for x in xs}) != 1:
        raise MlxnetError(f"pointwise conv: weight {tuple(weight.shape)} does not fit parts of shapes "
                          f"{[tuple(x.shape) for x in xs]}")
    _check_activation(activation)
    if backend() != "cpu":
        return _conv2d(mx.concatenate(list(xs), axis=-1) if len(xs) > 1 else xs[0], weight, bias,
                       activation=activation)
    if activation is None and all(cpu_grad.fits(x, weight, 1) for x in xs):
        return cpu_grad.pointwise_with_gemm_gradient(
            lambda parts, w, b: _pointwise_parts(parts, w, b, None), xs, weight, bias)
    return _pointwise_parts(xs, weight, bias, activation)


def _pointwise_parts(xs: Sequence[mx.array], weight: mx.array, bias: mx.array | None,
                     activation: str | None) -> mx.array:
    """:func:`pointwise_conv_of_concat` on the CPU: the direct conv, or one GEMM per part."""
    c_out, c_in = weight.shape[0], weight.shape[-1]
    native = _native.on_cpu()
    if (native is not None and len(xs) <= native.max_parts and all(x.dtype == mx.float32 for x in xs)
            and _direct_fits(xs[0], weight, 1, (0, 0), activation)):
        return native.direct_conv2d(list(xs), weight, bias, (1, 1), (0, 0), (1, 1), activation == "silu")
    if activation == "silu":
        return silu(_pointwise_parts(xs, weight, None, None), bias)
    w = weight.reshape(c_out, c_in)
    y, start = None, 0
    for x in xs:
        c = x.shape[-1]
        rows, taps = x.reshape(-1, c), w[:, start:start + c].T
        y = rows @ taps if y is None else mx.addmm(y, rows, taps)
        start += c
    y = y.reshape(*xs[0].shape[:3], c_out)
    return y if bias is None else y + bias


# MLX's CPU convolution (and the im2col path) unfold the whole input before one GEMM: a 7×7
# conv on a 2048² image would need 52 GB. Above this many unfolded bytes, convs run in row bands.
UNFOLD_BUDGET = 256 * 2**20


def conv2d(x: mx.array, weight: mx.array, bias: mx.array | None = None, residual: mx.array | None = None, *,
           stride: int | Pair = 1, padding: int | Pair = 0, dilation: int | Pair = 1,
           groups: int = 1, activation: str | None = None) -> mx.array:
    """The CPU fast path: in bands of output rows when the unfolded input would be large,
    each band by :func:`_conv2d_cpu_band`; a residual or ReLU after the conv and its bias."""
    if residual is not None or activation == "relu":
        y = conv2d(x, weight, None, stride=stride, padding=padding, dilation=dilation, groups=groups)
        if activation == "silu":
            return epilogue(y, bias, residual, activation)
        # bias, residual and ReLU in one pass on every core (MLX's own ops: a pass each, one core)
        return bias_act(y, bias if bias is not None else mx.zeros((y.shape[-1],), y.dtype), residual,
                        activation=activation)
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    if activation is None and cpu_grad.fits(x, weight, groups):
        def forward(x: mx.array, weight: mx.array, bias: mx.array | None) -> mx.array:
            return _conv2d_in_bands(x, weight, bias, stride, padding, dilation, groups, None)
        def stride_one(x: mx.array, weight: mx.array, padding: Pair) -> mx.array:
            return _conv2d_in_bands(x, weight, None, (1, 1), padding, dilation, 1, None)
        return cpu_grad.with_gemm_gradient(forward, x, weight, bias, stride, padding, dilation, stride_one)
    return _conv2d_in_bands(x, weight, bias, stride, padding, dilation, groups, activation)


def _conv2d_in_bands(x: mx.array, weight: mx.array, bias: mx.array | None, stride: Pair, padding: Pair,
                     dilation: Pair, groups: int, activation: str | None) -> mx.array:
    """:func:`_conv2d_cpu_band` on the whole input, or on bands of output rows where the
    unfolded input would be large."""
    n, _, _, c = x.shape
    kh, kw = weight.shape[1:3]
    span_h = dilation[0] * (kh - 1) + 1
    oh, ow = _out_size(x, weight, stride, padding, dilation)
    row_bytes = n * ow * kh * kw * c * x.dtype.size
    if oh * row_bytes <= UNFOLD_BUDGET or oh < 2:
        return _conv2d_cpu_band(x, weight, bias, stride=stride, padding=padding, dilation=dilation,
                                groups=groups, activation=activation)
    rows = max(1, UNFOLD_BUDGET // row_bytes)
    bands = []
    h = x.shape[1]
    for r in range(0, oh, rows):
        # The band's input rows, in the unpadded input's coordinates; the zero rows of the padding
        # are added to the first and last bands only (a padded copy of the whole input would be
        # as large as the input: 1 GiB for LaMa's first downsampling of a 2048² image).
        lo = r * stride[0] - padding[0]
        hi = (min(r + rows, oh) - 1) * stride[0] + span_h - padding[0]
        band = x[:, max(lo, 0):min(hi, h)]
        if lo < 0 or hi > h:
            band = mx.pad(band, [(0, 0), (max(-lo, 0), max(hi - h, 0)), (0, 0), (0, 0)])
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
        return silu(_conv2d(x, weight, stride=stride, padding=padding, dilation=dilation, groups=groups), bias)
    if (kh, kw) == (1, 1) and groups == 1 and padding == (0, 0):
        return _pointwise_parts([x[:, ::stride[0], ::stride[1], :] if stride != (1, 1) else x], weight, bias, None)
    elif groups == c == c_out and c_in_g == 1:
        xp = mx.pad(x, [(0, 0), (padding[0], padding[0]), (padding[1], padding[1]), (0, 0)])
        return _depthwise_in_bands(xp, weight, bias, (kh, kw), stride, dilation, (oh, ow))
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
