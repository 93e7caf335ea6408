"""Transposed convolutions: ``conv_transpose1d`` (NLC) and ``conv_transpose2d`` (NHWC).

PyTorch semantics and output sizes (``(in-1)*stride - 2*padding + dilation*(k-1) +
output_padding + 1``); weights in MLX layout ``(C_out, *kernel, C_in/groups)`` (convert PyTorch's
``(C_in, C_out/groups, *kernel)`` with ``from_torch_layout(w, "conv_transpose2d", groups)``).
Definition and CPU: the shifted-gemm decomposition (:mod:`.definition`). GPU (:mod:`.kernel`):
the gather kernel or MLX's built-in by shape class; backward through ordinary convolutions
(groups == 1) or autodiff of the decomposition. Every face starts from the plan (:mod:`.plan`).
"""
from __future__ import annotations

import mlx.core as mx

from ..core.registry import register
from . import check, definition, kernel


def _example2d() -> tuple[tuple, dict]:
    k = mx.random.split(mx.random.key(7), 3)
    x = mx.random.normal((2, 7, 6, 8), key=k[0])
    w = mx.random.normal((12, 3, 2, 4), key=k[1]) * 0.3
    b = mx.random.normal((12,), key=k[2])
    return (x, w, b), {"stride": (2, 3), "padding": (1, 0), "output_padding": (1, 2), "groups": 2}


def _example1d() -> tuple[tuple, dict]:
    k = mx.random.split(mx.random.key(8), 3)
    x = mx.random.normal((2, 9, 6), key=k[0])
    w = mx.random.normal((6, 3, 2), key=k[1]) * 0.3
    b = mx.random.normal((6,), key=k[2])
    return (x, w, b), {"stride": 2, "padding": 1, "output_padding": 1, "dilation": 2, "groups": 3}


def _edges(nd: int) -> list[tuple[tuple, dict]]:
    """Under 8 elements in every input, with and without bias; an empty batch."""
    spatial = (1,) * nd
    x, w, b = mx.array([0.5, -1.0]).reshape(1, *spatial, 2), mx.array([2.0, 3.0]).reshape(2, *spatial, 1), \
        mx.array([0.25, 0.0])
    return [((x, w, b), {"stride": 2, "groups": 2}), ((x, w), {"groups": 2}),
            ((mx.zeros((0, *(3,) * nd, 2)), w, b), {"groups": 2})]


conv_transpose2d = register(
    "conv_transpose2d", kernel=kernel.conv_transpose2d, kernel_vjp=kernel.conv_transpose2d_vjp,
    sources=(kernel.GATHER,), check=check.conv_transpose2d, batched=4, example=_example2d,
    edge_examples=lambda: _edges(2))(definition.conv_transpose2d)
conv_transpose1d = register(
    "conv_transpose1d", kernel=kernel.conv_transpose1d, kernel_vjp=kernel.conv_transpose1d_vjp,
    sources=(kernel.GATHER,), check=check.conv_transpose1d, batched=3, example=_example1d,
    edge_examples=lambda: _edges(1))(definition.conv_transpose1d)

__all__ = ["conv_transpose1d", "conv_transpose2d"]
