"""Reflect and symmetric padding of NHWC maps (PyTorch's 'reflect', numpy's 'symmetric').

The definition is one gather with a precomputed index; the GPU face is a copy kernel
(custom_kernels/pad.kern) that mirrors each output pixel's row and column itself, so it reads
no index array and writes each element once. Padding only moves bytes, so the kernel copies a
pixel's channels as 8- or 4-byte words where those tile a pixel's bytes: a thread then moves
8 bytes, not one element, for float32 maps with an even channel count and float16 ones with
a multiple of 4.
"""
from __future__ import annotations

from functools import lru_cache

import mlx.core as mx
import numpy as np

from ..errors import MlxnetError
from .kernel_source import PortableKernel, launch_nhwc
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


PAD = PortableKernel("pad.kern", "pad2d", ["x", "p"], ["out"])


def _kernel(x: mx.array, pads: tuple[int, int, int, int], mode: str = "reflect") -> mx.array:
    top, bottom, left, right = _check(x, pads, mode)
    if not (top or bottom or left or right):
        return x
    h, w = x.shape[-3:-1]
    words = _as_words(x)
    lead, c = x.shape[:-3], words.shape[-1]
    n = int(np.prod(lead)) if lead else 1
    oh, ow = h + top + bottom, w + left + right
    outs = launch_nhwc(PAD, [words], (n, h, w, c, oh, ow, top, left, int(mode == "symmetric")),
                       [("T", words.dtype)], (n, oh, ow, c), [(*lead, oh, ow, c)], [words.dtype])
    # past the launch limits, the gather definition (which has none)
    return outs[0].view(x.dtype) if outs is not None else pad2d.__wrapped__(x, pads, mode)


def _as_words(x: mx.array) -> mx.array:
    """``x``'s bytes with each pixel's channels as 8- or 4-byte words where those tile them
    (a view), else ``x`` itself."""
    row = x.shape[-1] * x.dtype.size
    word = next((d for d in (mx.uint64, mx.uint32) if row % d.size == 0), None)
    return x if word is None or x.size == 0 else x.view(word)


def _check(x: mx.array, pads: tuple[int, int, int, int], mode: str) -> tuple[int, int, int, int]:
    if mode not in MODES:
        raise MlxnetError(f"pad2d: unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    top, bottom, left, right = pads
    if not (top or bottom or left or right):
        return pads
    h, w = x.shape[-3:-1]
    edge = 1 if mode == "reflect" else 0  # reflect does not repeat the edge, so it reaches one less
    if min(pads) < 0 or max(top, bottom) > h - edge or max(left, right) > w - edge:
        raise MlxnetError(f"pad2d: a {h}×{w} feature map is too small to {mode}-pad by {tuple(pads)} "
                          "(top, bottom, left, right)")
    return pads


def _example() -> tuple[tuple, dict]:
    return (mx.random.normal((2, 9, 11, 3)),), {"pads": (3, 2, 0, 4), "mode": "reflect"}


def _edge_examples() -> list[tuple[tuple, dict]]:
    return [((mx.array([[[1.0], [2.0]], [[3.0], [4.0]]]),), {"pads": (1, 0, 1, 1), "mode": "symmetric"}),
            ((mx.random.normal((3, 4, 2)),), {"pads": (2, 1, 1, 1), "mode": "reflect"}),
            ((mx.zeros((0, 3, 3, 2)),), {"pads": (1, 1, 1, 1), "mode": "reflect"})]


@register("pad2d", kernel=_kernel, sources=(PAD,), example=_example, edge_examples=_edge_examples)
def pad2d(x: mx.array, pads: tuple[int, int, int, int], mode: str = "reflect") -> mx.array:
    """Pad the H, W axes of NHWC (or HWC) ``x`` by ``pads = (top, bottom, left, right)``; the
    definition is one gather, so the padded map is the only new buffer."""
    top, bottom, left, right = _check(x, pads, mode)
    if not (top or bottom or left or right):
        return x
    h, w = x.shape[-3:-1]
    index = _pad_index(h, w, top, bottom, left, right, mode)
    lead, c = x.shape[:-3], x.shape[-1]
    flat = mx.take(x.reshape(*lead, h * w, c), index, axis=-2)
    return flat.reshape(*lead, h + top + bottom, w + left + right, c)
