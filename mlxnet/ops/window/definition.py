"""The window ops' definitions: padding, reshapes and a transpose."""
from __future__ import annotations

import mlx.core as mx


def grid_of(height: int, width: int, window: int) -> tuple[int, int]:
    """Windows down and across a height × width map padded to whole windows."""
    return -(-height // window), -(-width // window)


def window_partition(x: mx.array, window: int) -> mx.array:
    """(B, H, W, C) → (B·NH·NW, window², C): the map zero-padded at the bottom and right to whole
    windows, cut into window × window tiles in row-major order, each tile's pixels row-major."""
    b, h, w, c = x.shape
    nh, nw = grid_of(h, w, window)
    if (nh * window, nw * window) != (h, w):
        x = mx.pad(x, [(0, 0), (0, nh * window - h), (0, nw * window - w), (0, 0)])
    x = x.reshape(b, nh, window, nw, window, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b * nh * nw, window * window, c)


def window_merge(windows: mx.array, window: int, height: int, width: int) -> mx.array:
    """window_partition's inverse: (B·NH·NW, window², C) tiles → the (B, height, width, C) map,
    the padding cropped."""
    n, _, c = windows.shape
    nh, nw = grid_of(height, width, window)
    b = n // (nh * nw)
    x = windows.reshape(b, nh, nw, window, window, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, nh * window, nw * window, c)[:, :height, :width]
