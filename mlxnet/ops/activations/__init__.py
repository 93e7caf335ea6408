"""Activations: SiLU, sigmoid, GELU (erf and tanh forms), softmax, and bias_act (a
convolution's bias, residual and ReLU in one pass).

Definitions (:mod:`.definition`) use MLX's own ``sigmoid`` / ``erf`` / ``exp`` in float32. The
CPU fast paths (:mod:`.cpu`) compute exp from + − × only, because MLX's Linux CPU back end
evaluates exp one scalar at a time (a ViT's softmax runs over millions of scores); in float32,
SiLU, sigmoid, GELU and softmax run that polynomial as mlxnet's C++ primitives where they are built
(:mod:`mlxnet._native`), the compiled MLX passes elsewhere. On GPUs
(:mod:`.kernel`) each activation is its definition compiled (``FUSED`` in the registry) and
softmax is MLX's fused ``mx.softmax``, already the fastest there.
"""
from __future__ import annotations

import mlx.core as mx

from ..core.registry import FUSED, register
from . import check, cpu, definition, kernel


def _example() -> tuple[tuple, dict]:
    return (mx.random.normal((2, 9, 7, 33)) * 4,), {}


def _edge_examples() -> list[tuple[tuple, dict]]:
    return [((mx.array(1.5),), {}), ((mx.array([-3.0, 0.0, 2.0]),), {}), ((mx.zeros((0, 3)),), {})]


def _softmax_example() -> tuple[tuple, dict]:
    return (mx.random.normal((3, 5, 37)) * 4,), {}


# On GPUs each activation is its definition compiled: one fused kernel on its own and, inside
# a compiled forward, part of the kernel of the bias add or normalisation before it (a custom
# kernel here measured slower: it ends every fusion, one extra pass per activation).
silu = register("silu", cpu=cpu.silu, kernel=FUSED, example=_example,
                edge_examples=_edge_examples)(definition.silu)
sigmoid = register("sigmoid", cpu=cpu.sigmoid, kernel=FUSED, example=_example,
                   edge_examples=_edge_examples)(definition.sigmoid)
gelu = register("gelu", cpu=cpu.gelu, kernel=kernel.gelu, check=check.gelu, example=_example,
                edge_examples=_edge_examples)(definition.gelu)
softmax = register("softmax", cpu=cpu.softmax, kernel=kernel.softmax, check=check.softmax,
                   example=_softmax_example)(definition.softmax)



def _bias_act_example() -> tuple[tuple, dict]:
    return (mx.random.normal((2, 5, 7, 12)), mx.random.normal((12,)), mx.random.normal((2, 5, 7, 12))), {}


def _bias_act_edges() -> list[tuple[tuple, dict]]:
    return [((mx.random.normal((2, 6, 16)), mx.random.normal((16,))), {}),
            ((mx.array([-1.0, 2.0]), mx.array([0.5, 0.5]), mx.array([1.0, -4.0])), {"activation": None}),
            ((mx.zeros((0, 3)), mx.ones((3,))), {})]


# A convolution's epilogue (bias, residual, ReLU) in one pass: a portable kernel on GPUs (conv2d's
# CUDA face sends it the small maps, the batch-1 layers of a CNN, where it beats MLX's fused
# kernel), a C++ primitive on the CPU (conv2d's CPU face sends it every ReLU or residual epilogue).
bias_act = register("bias_act", cpu=cpu.bias_act, kernel=kernel.bias_act, check=check.bias_act,
                    sources=(kernel.BIAS_ACT_RESIDUAL,), example=_bias_act_example,
                    edge_examples=_bias_act_edges)(definition.bias_act)

__all__ = ["bias_act", "gelu", "sigmoid", "silu", "softmax"]
