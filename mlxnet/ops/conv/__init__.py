"""2-D convolution (NHWC input, OHWI weight): the definition is ``mx.conv2d``; the CPU fast
path (:mod:`.cpu`) picks a GEMM formulation or mlxnet's C++ primitives by shape, because MLX's
CPU convolution is im2col through a scalar strided copy plus one GEMM; on GPUs
(:mod:`.kernel`) the op runs MLX's own convolution, with column-pair and tap-GEMM forms where
cuDNN picks slow kernels; on CUDA it hands depthwise convs to ``depthwise_conv2d`` (groups =
channels, a portable kernel) and small maps' epilogues (residual, ReLU) to ``bias_act``.
``pointwise_conv_of_concat`` (a 1×1 conv of a concatenation that is never built on the CPU) is
no registered op: it lives with the CPU face and calls ``conv2d`` elsewhere. The thresholds and
the measurements behind each rule: docs/performance-notes.md.
"""
from __future__ import annotations

import mlx.core as mx

from ..core.registry import register
from . import check, cpu, definition, kernel
from .cpu import pointwise_conv_of_concat


def _example() -> tuple[tuple, dict]:
    x = mx.random.normal((2, 9, 11, 8))
    return (x, mx.random.normal((8, 3, 3, 1)), mx.random.normal((8,))), {"padding": 1, "groups": 8}


def _depthwise_example() -> tuple[tuple, dict]:
    x = mx.random.normal((2, 9, 11, 8))
    return (x, mx.random.normal((8, 3, 3, 1)), mx.random.normal((8,))), {"padding": 1}


def _depthwise_edges() -> list[tuple[tuple, dict]]:
    return [((mx.random.normal((1, 7, 10, 5)), mx.random.normal((5, 3, 3, 1))), {"stride": 2, "padding": 1}),
            ((mx.random.normal((1, 2, 2, 1)), mx.random.normal((1, 3, 3, 1)), mx.random.normal((1,))), {"padding": 1}),
            ((mx.random.normal((2, 12, 13, 16)), mx.random.normal((16, 5, 5, 1))), {"padding": 2}),
            ((mx.random.normal((1, 15, 9, 4)), mx.random.normal((4, 7, 7, 1))), {"stride": 2, "padding": 3}),
            ((mx.zeros((0, 4, 4, 3)), mx.random.normal((3, 3, 3, 1))), {"padding": 1})]


conv2d = register("conv2d", cpu=cpu.conv2d, kernel=kernel.conv2d, check=check.conv2d, batched=4,
                  example=_example)(definition.conv2d)

depthwise_conv2d = register("depthwise_conv2d", kernel=kernel.depthwise_conv2d, sources=(kernel.DEPTHWISE,),
                            check=check.depthwise_conv2d, batched=4, example=_depthwise_example,
                            edge_examples=_depthwise_edges)(definition.depthwise_conv2d)

__all__ = ["conv2d", "depthwise_conv2d", "pointwise_conv_of_concat"]
