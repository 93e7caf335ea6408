"""pad2d's GPU face: a copy kernel (custom_kernels/pad.kern) that folds each output pixel's row
and column back into the kept map itself, so it reads no index array and writes each element
once, moving a pixel's channels as 8- or 4-byte words where those tile its bytes. 'constant'
is MLX's own ``mx.pad`` (the definition), already one copy kernel."""
from __future__ import annotations

import mlx.core as mx
import numpy as np

from ...dtypes import FLOATS
from ..core.kernel_source import PortableKernel, as_words, int_params, launch_nhwc
from . import definition
from .definition import Pads, _check

# The mode number pad.kern reads in p[8].
KERNEL_MODES = {"reflect": 0, "symmetric": 1, "replicate": 2}

PAD = PortableKernel("pad.kern", "pad2d", ["x", "p"], ["out"])
BIAS_ACT_PAD = PortableKernel("pad.kern", "bias_act_pad2d", ["x", "bias", "residual", "skip", "p"], ["out"],
                              row_contiguous=False)


def pad2d(x: mx.array, pads: Pads, mode: str = "reflect", value: float | None = None) -> mx.array:
    pads = _check(x, pads, mode, value)
    top, bottom, left, right = pads
    if not any(pads):
        return x
    if mode == "constant":  # MLX's pad is already one copy kernel
        return definition.pad2d(x, pads, mode, value)
    h, w = x.shape[-3:-1]
    words = as_words(x)
    lead, c = x.shape[:-3], words.shape[-1]
    n = int(np.prod(lead)) if lead else 1
    oh, ow = h + top + bottom, w + left + right
    params = (n, h, w, c, oh, ow, top, left, KERNEL_MODES[mode])
    outs = launch_nhwc(PAD, [words], params, [("T", words.dtype)], (n, oh, ow, c), [(*lead, oh, ow, c)],
                       [words.dtype])
    # past the launch limits, the gather definition (which has none)
    return outs[0].view(x.dtype) if outs is not None else definition.pad2d(x, pads, mode, value)


def bias_act_pad2d(x: mx.array, bias: mx.array, residual: mx.array | None = None, skip: mx.array | None = None,
                   *, pads: Pads, mode: str = "reflect", activation: str | None = "relu") -> mx.array:
    """One pass: each output pixel computes its source pixel's epilogue, a thread for up to 8
    channels of it, so neither the unpadded map nor a copy of it is written."""
    arrays = [a for a in (x, bias, residual, skip) if a is not None]
    if mode != "constant" and min(pads) >= 0 and x.dtype in FLOATS and all(a.dtype == x.dtype for a in arrays):
        top, bottom, left, right = pads
        n, h, w, c = x.shape
        oh, ow = h + top + bottom, w + left + right
        absent = int_params((0,))  # an input the template leaves unread
        per_thread = next(v for v in (8, 4, 2, 1) if c % v == 0)
        template = [("T", x.dtype), ("V", per_thread), ("RELU", int(activation == "relu")),
                    ("RESIDUAL", int(residual is not None)), ("SKIP", int(skip is not None))]
        outs = launch_nhwc(BIAS_ACT_PAD, [x, bias, absent if residual is None else residual,
                                          absent if skip is None else skip],
                           (n, h, w, c, oh, ow, top, left, KERNEL_MODES[mode]), template,
                           (n, oh, ow, c // per_thread), [(n, oh, ow, c)], [x.dtype])
        if outs is not None:
            return outs[0]
    # a crop, 'constant', mixed dtypes, or past the launch limits: the definition
    return definition.bias_act_pad2d(x, bias, residual, skip, pads=pads, mode=mode, activation=activation)
