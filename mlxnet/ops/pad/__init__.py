"""2-D padding of NHWC maps, as PyTorch's ``F.pad`` pads the last two axes of NCHW ones:
'reflect', 'replicate' and 'constant' (PyTorch's), and 'symmetric' (numpy's). Negative pads
crop as F.pad's do: in 'constant' the map itself; in the other modes the padded map, so a pad
reads the whole input, pixels that the other side's crop removes included, and a crop of the
whole axis leaves the pad's pixels (replicate: the edge pixel next to the crop, repeated). The
pads' limits are PyTorch's, on the input's size (reflect less than it, symmetric at most it).

The definition is one gather with a precomputed index (padding and crop together); the GPU face
is a copy kernel (custom_kernels/pad.kern) that folds each output pixel's row and column back
into the input itself, so it reads no index array and writes each element once. Padding
only moves bytes, so the kernel copies a pixel's channels as 8- or 4-byte words where those
tile a pixel's bytes: a thread then moves 8 bytes, not one element, for float32 maps with an
even channel count and float16 ones with a multiple of 4. 'constant' is MLX's own ``mx.pad``
of the cropped map on every face.

``bias_act_pad2d`` is a convolution's epilogue (bias, residual, ReLU, then a skip) written
straight into such a padded map: its GPU kernel computes each output element from its source
pixel, reading every input through its strides, so the unpadded map is never written and a skip
that is another padded map's interior is read in place.
"""
from __future__ import annotations

import mlx.core as mx

from ..core.registry import register
from . import check, definition, kernel


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


def _epilogue_example() -> tuple[tuple, dict]:
    shape = (2, 6, 9, 5)
    return ((mx.random.normal(shape), mx.random.normal((5,)), mx.random.normal(shape), mx.random.normal(shape)),
            {"pads": (1, 2, 2, 1), "mode": "reflect"})


def _epilogue_edges() -> list[tuple[tuple, dict]]:
    x = mx.random.normal((1, 3, 4, 2))
    return [((x, mx.array([0.5, -1.0])), {"pads": (1, 1, 1, 1), "mode": "replicate"}),
            ((x, mx.array([0.5, -1.0]), None, x * 2), {"pads": (2, 0, 1, 3), "mode": "symmetric",
                                                          "activation": None}),
            ((x, mx.array([0.5, -1.0]), x), {"pads": (0, 0, 0, 0)}),
            ((x, mx.array([0.5, -1.0])), {"pads": (1, -1, 0, 2), "mode": "reflect"}),
            ((x, mx.array([0.5, -1.0])), {"pads": (1, 1, 1, 1), "mode": "constant"}),
            ((mx.zeros((0, 3, 3, 2)), mx.ones((2,))), {"pads": (1, 1, 1, 1)})]


# A convolution's epilogue (bias, residual, ReLU, a block's skip) written straight into the
# reflect-padded map the next convolution reads: LaMa's FFC blocks, where the pad was a pass
# of its own after every epilogue.
bias_act_pad2d = register("bias_act_pad2d", kernel=kernel.bias_act_pad2d, check=check.bias_act_pad2d,
                          sources=(kernel.BIAS_ACT_PAD,), example=_epilogue_example,
                          edge_examples=_epilogue_edges)(definition.bias_act_pad2d)

__all__ = ["bias_act_pad2d", "pad2d"]
