"""Normalisation ops: layer_norm (over the last axis, channels in NHWC); on the CPU a C++
primitive (:mod:`.cpu`), on GPUs MLX's fused layer norm (:mod:`.kernel`). batch_norm_train
(training-mode BatchNorm with an optional SiLU): on the CPU a C++ primitive, on GPUs portable
kernels, three passes forward and three back (:mod:`.kernel`); each keeps only the input and
the statistics for the backward, as does the lean face they fall back to (:mod:`.lean`)."""
from __future__ import annotations

import mlx.core as mx

from ..core.registry import DEFINITION_VJP, register
from . import check, cpu, definition, kernel


def _example() -> tuple[tuple, dict]:
    x = mx.random.normal((2, 5, 7, 96))
    return (x, mx.random.normal((96,)), mx.random.normal((96,))), {"eps": 1e-6}


def _edges() -> list[tuple[tuple, dict]]:
    tiny = mx.array([[1.0, -2.0, 0.5]])
    return [((tiny, mx.ones((3,)), mx.zeros((3,))), {}), ((tiny,), {}),
            ((mx.zeros((0, 3)), mx.ones((3,)), mx.zeros((3,))), {})]


# MLX 0.32's CUDA layer norm has wrong gradients for some widths (docs/performance-notes.md,
# "Known MLX defects"): its forward, with the definition's gradient.
layer_norm = register("layer_norm", cpu=cpu.layer_norm, kernel=kernel.layer_norm, kernel_vjp=DEFINITION_VJP,
                      check=check.layer_norm, example=_example, edge_examples=_edges)(definition.layer_norm)



def _bn_example() -> tuple[tuple, dict]:
    return (mx.random.normal((2, 6, 5, 16)) * 3 + 1, mx.random.uniform(0.5, 1.5, (16,)), mx.random.normal((16,))), \
        {"eps": 1e-3, "activation": "silu"}


def _bn_edges() -> list[tuple[tuple, dict]]:
    tiny = mx.array([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0]])
    return [((tiny, mx.ones((3,)), mx.zeros((3,))), {}), ((tiny, mx.ones((3,)), mx.zeros((3,))), {"activation": "silu"}),
            ((tiny, mx.ones((3,)), mx.zeros((3,)), mx.array([0.5, -1.0, 2.0]), mx.ones((3,))), {"momentum": 0.03})]


batch_norm_train = register("batch_norm_train", cpu=cpu.batch_norm_train, kernel=kernel.batch_norm_train,
                            kernel_vjp=kernel.batch_norm_train_vjp, sources=kernel.BATCH_NORM_KERNELS,
                            check=check.batch_norm_train, example=_bn_example,
                            edge_examples=_bn_edges)(definition.batch_norm_train)

__all__ = ["layer_norm", "batch_norm_train"]
