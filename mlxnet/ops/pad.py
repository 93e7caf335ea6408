"""Reflect and symmetric padding of NHWC maps (PyTorch's 'reflect', numpy's 'symmetric')."""
from __future__ import annotations

from functools import lru_cache

import mlx.core as mx
import numpy as np

from ..errors import MlxnetError
from .registry import register

MODES = ("reflect", "symmetric")


@lru_cache(maxsize=64)
def _pad_index(h: int, w: int, top: int, bottom: int, left: int, right: int, mode: str) -> mx.array:
    """Flat source index of every pixel of the padded (h + top + bottom, w + left + right) map."""
    def axis(size: int, lo: int, hi: int) -> np.ndarray:
        i = np.arange(-lo, size + hi)
        if mode == "reflect":  # edge not repeated
            i = np.abs(i)
            return np.where(i >= size, 2 * (size - 1) - i, i)
        i = np.where(i < 0, -i - 1, i)  # symmetric: edge repeated
        return np.where(i >= size, 2 * size - 1 - i, i)

    index = axis(h, top, bottom)[:, None] * w + axis(w, left, right)[None, :]
    return mx.array(index.ravel().astype(np.int32))


def _example() -> tuple[tuple, dict]:
    return (mx.random.normal((2, 9, 11, 3)),), {"pads": (3, 2, 0, 4), "mode": "reflect"}


@register("pad2d", example=_example)
def pad2d(x: mx.array, pads: tuple[int, int, int, int], mode: str = "reflect") -> mx.array:
    """Pad the H, W axes of NHWC (or HWC) ``x`` by ``pads = (top, bottom, left, right)`` as one
    gather, so the padded map is the only new buffer."""
    if mode not in MODES:
        raise MlxnetError(f"pad2d: unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    top, bottom, left, right = pads
    if not (top or bottom or left or right):
        return x
    h, w = x.shape[-3:-1]
    edge = 1 if mode == "reflect" else 0  # reflect does not repeat the edge, so it reaches one less
    if min(pads) < 0 or max(top, bottom) > h - edge or max(left, right) > w - edge:
        raise MlxnetError(f"pad2d: a {h}×{w} feature map is too small to {mode}-pad by {tuple(pads)} "
                          "(top, bottom, left, right)")
    index = _pad_index(h, w, top, bottom, left, right, mode)
    lead, c = x.shape[:-3], x.shape[-1]
    flat = mx.take(x.reshape(*lead, h * w, c), index, axis=-2)
    return flat.reshape(*lead, h + top + bottom, w + left + right, c)
