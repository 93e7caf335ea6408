"""The window ops' GPU faces: one copy kernel each (custom_kernels/window.kern), moving a
pixel's channels as 8- or 4-byte words where they tile its bytes (as pad2d does)."""
from __future__ import annotations

import mlx.core as mx

from ..core.kernel_source import PortableKernel, as_words, launch_nhwc
from . import definition
from .definition import grid_of

PARTITION = PortableKernel("window.kern", "window_partition", ["x", "p"], ["out"])
MERGE = PortableKernel("window.kern", "window_merge", ["windows", "p"], ["out"])


def window_partition(x: mx.array, window: int) -> mx.array:
    b, h, w, c = x.shape
    nh, nw = grid_of(h, w, window)
    words = as_words(x)
    cw = words.shape[-1]
    outs = launch_nhwc(PARTITION, [words], (b, h, w, cw, window, nh, nw), [("T", words.dtype)],
                       (b, nh * window, nw * window, cw), [(b * nh * nw, window * window, cw)], [words.dtype])
    # past the launch limits, the definition (which has none)
    return outs[0].view(x.dtype) if outs is not None else definition.window_partition(x, window)


def window_merge(windows: mx.array, window: int, height: int, width: int) -> mx.array:
    nh, nw = grid_of(height, width, window)
    b = windows.shape[0] // (nh * nw)
    words = as_words(windows)
    cw = words.shape[-1]
    outs = launch_nhwc(MERGE, [words], (b, height, width, cw, window, nh, nw), [("T", words.dtype)],
                       (b, height, width, cw), [(b, height, width, cw)], [words.dtype])
    return outs[0].view(windows.dtype) if outs is not None else definition.window_merge(windows, window, height, width)
