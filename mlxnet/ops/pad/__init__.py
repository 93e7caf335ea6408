"""2-D padding of NHWC maps, as PyTorch's ``F.pad`` pads the last two axes of NCHW ones:
'reflect', 'replicate' and 'constant' (PyTorch's), and 'symmetric' (numpy's). Negative pads
crop: the crop comes first, and the padding (with its limits) applies to what is kept.

The definition is one gather with a precomputed index (crop and padding together); the GPU face
is a copy kernel (custom_kernels/pad.kern) that folds each output pixel's row and column back
into the kept map itself, so it reads no index array and writes each element once. Padding
only moves bytes, so the kernel copies a pixel's channels as 8- or 4-byte words where those
tile a pixel's bytes: a thread then moves 8 bytes, not one element, for float32 maps with an
even channel count and float16 ones with a multiple of 4. 'constant' is MLX's own ``mx.pad``
of the cropped map on every face.
"""
from __future__ import annotations

import mlx.core as mx

from ..core.registry import register
from . import definition, kernel


def _example() -> tuple[tuple, dict]:
    return (mx.random.normal((2, 9, 11, 3)),), {"pads": (3, 2, 0, 4), "mode": "reflect"}


def _edge_examples() -> list[tuple[tuple, dict]]:
    return [((mx.array([[[1.0], [2.0]], [[3.0], [4.0]]]),), {"pads": (1, 0, 1, 1), "mode": "symmetric"}),
            ((mx.random.normal((3, 4, 2)),), {"pads": (2, 1, 1, 1), "mode": "reflect"}),
            ((mx.random.normal((2, 3, 5, 3)),), {"pads": (-1, 3, 2, -2), "mode": "replicate"}),
            ((mx.random.normal((1, 3, 4, 1)),), {"pads": (1, 1, -1, -2), "mode": "reflect"}),
            ((mx.zeros((0, 3, 3, 2)),), {"pads": (1, 1, 1, 1), "mode": "reflect"}),
            ((mx.zeros((0, 3, 3, 2)),), {"pads": (2, -1, 4, 0), "mode": "replicate"})]


pad2d = register("pad2d", kernel=kernel.pad2d, sources=(kernel.PAD,), example=_example,
                 edge_examples=_edge_examples)(definition.pad2d)

__all__ = ["pad2d"]
