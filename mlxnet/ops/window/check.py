"""The window ops' argument checks: one-line errors naming what does not fit."""
from __future__ import annotations

import mlx.core as mx

from ...errors import MlxnetError
from ..core.args import shape_of
from .definition import grid_of


def _window(name: str, window: object) -> int:
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise MlxnetError(f"{name}: window must be a positive int, got {window!r}")
    return window


def window_partition(x: mx.array, window: int) -> tuple:
    if not isinstance(x, mx.array) or x.ndim != 4:
        raise MlxnetError(f"window_partition: expected an NHWC map of 4 dimensions, got {shape_of(x)}")
    return (x, _window("window_partition", window)), {}


def window_merge(windows: mx.array, window: int, height: int, width: int) -> tuple:
    window = _window("window_merge", window)
    if not isinstance(windows, mx.array) or windows.ndim != 3:
        raise MlxnetError(f"window_merge: expected (windows, window², C) tiles of 3 dimensions, "
                          f"got {shape_of(windows)}")
    for name, v in (("height", height), ("width", width)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise MlxnetError(f"window_merge: {name} must be a positive int, got {v!r}")
    nh, nw = grid_of(height, width, window)
    if windows.shape[1] != window * window or windows.shape[0] % (nh * nw):
        raise MlxnetError(f"window_merge: tiles {tuple(windows.shape)} are not {window}×{window} windows of "
                          f"{height}×{width} maps ({nh}×{nw} windows each)")
    return (windows, window, height, width), {}
