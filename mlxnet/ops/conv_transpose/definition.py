"""Transposed convolution's definition: the fast MLX-composed reference (the plan:
:mod:`.plan`).

Why not ``mx.conv_transpose2d``: on CPU MLX runs it as an input-dilated convolution through its
scalar loop, two orders of magnitude slower than this.

The reference is a *shifted-gemm* decomposition. Along one axis, tap ``k`` lands at output offset
``k*dilation = a*stride + r``: it feeds output phase ``r`` (positions ``m*stride + r``) from input
position ``m - a``. So output phase (rh, rw) is a sum, over the taps of that phase, of
``input shifted by (ah, aw) @ W[kh, kw]``. With the input zero-padded and flattened to pixel rows,
every shifted input is a contiguous row slice (a view, no im2col copy) and the sum accumulates in
place through ``addmm`` (BLAS beta=1). The stride² phase images are then written once, strided,
into the output. Total gemm work equals the direct method; extra memory traffic is one padded
copy of the input and one write of the output. Every step is an MLX op, so autodiff and
``mx.compile`` work, and the same code runs on the GPU.
"""
from __future__ import annotations

from typing import Any, Sequence

import mlx.core as mx

from ...device import is_tracing
from .plan import IntOrTuple, Plan, TransposedAxis, as_2d, plan


def _run(nd: int, impl: Any, x: mx.array, weight: mx.array, bias: mx.array | None,
         stride: IntOrTuple, padding: IntOrTuple, output_padding: IntOrTuple,
         dilation: IntOrTuple, groups: int) -> mx.array:
    """Plan the call (every argument checked), then run ``impl`` on it as a 2-D NHWC problem."""
    p = plan(x, weight, bias, nd, stride, padding, output_padding, dilation, groups)
    x2, w2, p2 = as_2d(x, weight, p)
    y = impl(x2, w2, bias, p2)
    return y[:, 0] if nd == 1 else y


def _pad_or_crop(x: mx.array, spec: Sequence[tuple[int, int]]) -> mx.array:
    """Pad (positive) or crop (negative) axes 1.. of x, in one copy at most."""
    index = (slice(None),) + tuple(slice(max(-lo, 0), x.shape[1 + i] - max(-hi, 0))
                                   for i, (lo, hi) in enumerate(spec))
    x = x[index]
    pads = [(0, 0)] + [(max(lo, 0), max(hi, 0)) for lo, hi in spec] + [(0, 0)] * (x.ndim - 1 - len(spec))
    return mx.pad(x, pads) if any(lo or hi for lo, hi in pads) else x


def decomposed_nhwc(x: mx.array, weight: mx.array, bias: mx.array | None, p: Plan) -> mx.array:
    """Transposed convolution of 4-D NHWC ``x`` by the shifted-gemm decomposition (module doc)."""
    ah, aw = p.axes
    n, c_in, c_out = x.shape[0], p.c_in, p.c_out
    kh_n, kw_n = weight.shape[1:3]
    weight = weight.astype(x.dtype)
    # One input channel per group (depthwise-like): the products are broadcasts, cheaper than
    # batches of K=1 gemms. Then groups fold into the channel axis (G = 1, Cg = C_out).
    broadcast = c_in == p.groups
    g = 1 if broadcast else p.groups
    cg = c_out // g
    mult = c_out // p.groups
    # Rows of the flattened padded input; one spare row when shifted slices overrun the last one.
    rows_h = ah.span + (1 if aw.shifts > 1 else 0)
    xg = x.reshape(n, ah.size, aw.size, g, c_in // g).transpose(0, 3, 1, 2, 4)
    xp = _pad_or_crop(xg, ((0, 0), (ah.pad_lo, rows_h - ah.pad_lo - ah.size),
                           (aw.pad_lo, aw.span - aw.pad_lo - aw.size)))
    xf = xp.reshape(n, g, rows_h * aw.span, c_in // g)
    rows = ah.count * aw.span  # output rows per phase, incl. (shifts_w - 1) junk columns per row

    if broadcast:  # (KH, KW, C_in, mult): product x[..., c, None] * w[c, :]
        wt = weight.reshape(p.groups, mult, kh_n, kw_n).transpose(2, 3, 0, 1)
        acc0 = None if bias is None else bias.astype(x.dtype).reshape(c_in, mult)
    else:  # (KH, KW, G, C_in/G, C_out/G)
        wt = weight.reshape(g, cg, kh_n, kw_n, c_in // g).transpose(2, 3, 0, 4, 1)
        acc0 = None if bias is None else bias.astype(x.dtype).reshape(g, 1, cg)

    def accumulate(acc: mx.array | None, xa: mx.array, wk: mx.array) -> mx.array:
        if broadcast:
            y = xa[..., None] * wk
            return y if acc is None else acc + y
        return xa @ wk if acc is None else mx.addmm(acc, xa, wk)

    taps = [(kh, kw, ah.tap(kh), aw.tap(kw)) for kh in range(kh_n) for kw in range(kw_n)]
    phases: dict[tuple[int, int], mx.array] = {}
    if ah.shifts == aw.shifts == 1 and not broadcast:
        # Every tap reads the unshifted input: one gemm for all taps (better for few channels).
        w_all = wt.transpose(2, 3, 0, 1, 4).reshape(g, c_in // g, kh_n * kw_n * cg)
        if (kh_n, kw_n) == (ah.stride, aw.stride) and ah.dilation == aw.dilation == 1:
            # Non-overlapping patches (kernel == stride): tap (kh, kw) is phase (kh, kw), so
            # the interleave is one transposing pass, which also adds the bias.
            y = (xf[:, :, :rows] @ w_all).reshape(n, g, ah.count, aw.span, kh_n, kw_n, cg)
            y = y.transpose(0, 2, 4, 3, 5, 1, 6)
            y = mx.contiguous(y) if acc0 is None else y + acc0.reshape(g, cg)
            return _crop(y.reshape(n, ah.count * kh_n, aw.span * kw_n, c_out), ah, aw)
        b_all = None if acc0 is None else mx.tile(acc0, (1, 1, kh_n * kw_n))
        y = accumulate(b_all, xf[:, :, :rows], w_all).reshape(n, g, rows, kh_n * kw_n, cg)
        for i, (_, _, (_, rh), (_, rw)) in enumerate(taps):
            phases[rh, rw] = y[:, :, :, i]
    else:
        for kh, kw, (sh, rh), (sw, rw) in taps:
            start = (ah.shifts - 1 - sh) * aw.span + (aw.shifts - 1 - sw)
            phases[rh, rw] = accumulate(phases.get((rh, rw), acc0), xf[:, :, start:start + rows],
                                        wt[kh, kw])

    # Interleave: out[n, m, rh, j, rw, :] = phase(rh, rw)[n, m, j], each phase written once, in
    # place (slice_update donation). Phases without taps keep the fill: bias or zero (the bias
    # is already in the computed phases, so a zero fill suffices when all have taps).
    shape = (n, ah.count, ah.stride, aw.span, aw.stride, g, cg)
    if bias is None or len(phases) == ah.stride * aw.stride:
        out = mx.zeros(shape, x.dtype)
    else:
        out = mx.broadcast_to(bias.astype(x.dtype).reshape(g, cg), shape)
    # A large output is filled one phase at a time, each evaluated before the next is built: MLX
    # schedules a graph's independent branches together, so lazily all stride² phases would be
    # held at once beside the output (at LaMa's last upsampling of a 2048² image, 1 GiB more).
    # Not inside a compiled forward's trace, which cannot evaluate.
    one_at_a_time = out.nbytes >= PHASED_BYTES and not is_tracing()
    while phases:
        (rh, rw), ph = phases.popitem()
        out[:, :, rh, :, rw] = ph.reshape(n, g, ah.count, aw.span, cg).transpose(0, 2, 3, 1, 4)
        del ph
        if one_at_a_time:
            mx.eval(out)
    return _crop(out.reshape(n, ah.count * ah.stride, aw.span * aw.stride, c_out), ah, aw)


# Outputs from this size on are filled a phase at a time (see decomposed_nhwc).
PHASED_BYTES = 256 * 2**20


def _crop(full: mx.array, ah: TransposedAxis, aw: TransposedAxis) -> mx.array:
    """The output window of the phase grid (a view; no copy when nothing is cut)."""
    if (full.shape[1], full.shape[2]) == (ah.out, aw.out):
        return full
    return full[:, ah.crop:ah.crop + ah.out, aw.crop:aw.crop + aw.out]


def conv_transpose2d(x: mx.array, weight: mx.array, bias: mx.array | None = None, *,
                     stride: IntOrTuple = 1, padding: IntOrTuple = 0, output_padding: IntOrTuple = 0,
                     dilation: IntOrTuple = 1, groups: int = 1) -> mx.array:
    """Transposed 2-D convolution, NHWC, weight (C_out, KH, KW, C_in/groups); PyTorch semantics."""
    return _run(2, decomposed_nhwc, x, weight, bias, stride, padding, output_padding, dilation, groups)


def conv_transpose1d(x: mx.array, weight: mx.array, bias: mx.array | None = None, *,
                     stride: IntOrTuple = 1, padding: IntOrTuple = 0, output_padding: IntOrTuple = 0,
                     dilation: IntOrTuple = 1, groups: int = 1) -> mx.array:
    """Transposed 1-D convolution, NLC, weight (C_out, K, C_in/groups); PyTorch semantics."""
    return _run(1, decomposed_nhwc, x, weight, bias, stride, padding, output_padding, dilation, groups)
