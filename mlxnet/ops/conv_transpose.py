"""Transposed convolutions: ``conv_transpose1d`` (NLC) and ``conv_transpose2d`` (NHWC).

PyTorch semantics and output sizes (``(in-1)*stride - 2*padding + dilation*(k-1) +
output_padding + 1``); weights in MLX layout ``(C_out, *kernel, C_in/groups)`` (convert PyTorch's
``(C_in, C_out/groups, *kernel)`` with ``from_torch_layout(w, "conv_transpose2d", groups)``).
CPU: the shifted-gemm reference (:mod:`.conv_transpose_ref`). GPU (:mod:`.conv_transpose_gpu`):
the gather kernel or MLX's built-in by shape class; backward through ordinary convolutions
(groups == 1) or autodiff of the decomposition.
"""
from __future__ import annotations

from typing import Any

import mlx.core as mx

from . import conv_transpose_gpu as gpu
from .conv_transpose_ref import IntOrTuple, as_2d, decomposed_nhwc, plan
from .registry import register


def _run(nd: int, impl: Any, x: mx.array, weight: mx.array, bias: mx.array | None,
         stride: IntOrTuple, padding: IntOrTuple, output_padding: IntOrTuple,
         dilation: IntOrTuple, groups: int) -> mx.array:
    p = plan(x, weight, bias, nd, stride, padding, output_padding, dilation, groups)
    x2, w2, p2 = as_2d(x, weight, p)
    y = impl(x2, w2, bias, p2)
    return y[:, 0] if nd == 1 else y


def _vjp(nd: int, primals: list, cotangent: Any, outputs: Any, *, bias: mx.array | None = None,
         stride: IntOrTuple = 1, padding: IntOrTuple = 0, output_padding: IntOrTuple = 0,
         dilation: IntOrTuple = 1, groups: int = 1) -> tuple:
    """Backward for the kernel path; one cotangent per array among the positional arguments."""
    x, weight, *rest = primals
    bias = rest[0] if rest and rest[0] is not None else bias
    dy = cotangent[0] if isinstance(cotangent, (list, tuple)) else cotangent
    p = plan(x, weight, bias, nd, stride, padding, output_padding, dilation, groups)
    x2, w2, p2 = as_2d(x, weight, p)
    grads = gpu.vjp_nhwc(x2, w2, bias, p2, dy[:, None] if nd == 1 else dy)
    if nd == 1:
        grads = (grads[0][:, 0], grads[1][:, 0], *grads[2:])
    return tuple(g for g, a in zip(grads, primals) if isinstance(a, mx.array))


def _kernel2d(x, weight, bias=None, *, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
    return _run(2, gpu.forward_nhwc, x, weight, bias, stride, padding, output_padding, dilation, groups)


def _kernel1d(x, weight, bias=None, *, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
    return _run(1, gpu.forward_nhwc, x, weight, bias, stride, padding, output_padding, dilation, groups)


def _vjp2d(primals, cotangent, outputs, **params):
    return _vjp(2, primals, cotangent, outputs, **params)


def _vjp1d(primals, cotangent, outputs, **params):
    return _vjp(1, primals, cotangent, outputs, **params)


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


def _check(nd: int, x: mx.array, weight: mx.array, bias: mx.array | None = None, **params: Any) -> tuple:
    # plan() is the one argument check; the faces call it again only for the geometry.
    plan(x, weight, bias, nd, **{"stride": 1, "padding": 0, "output_padding": 0, "dilation": 1,
                                 "groups": 1, **params})
    return ((x, weight) if bias is None else (x, weight, bias)), params


@register("conv_transpose2d", kernel=_kernel2d, kernel_vjp=_vjp2d, sources=(gpu.GATHER,),
          check=lambda *a, **k: _check(2, *a, **k), batched=4, example=_example2d, edge_examples=lambda: _edges(2))
def conv_transpose2d(x: mx.array, weight: mx.array, bias: mx.array | None = None, *,
                     stride: IntOrTuple = 1, padding: IntOrTuple = 0, output_padding: IntOrTuple = 0,
                     dilation: IntOrTuple = 1, groups: int = 1) -> mx.array:
    """Transposed 2-D convolution, NHWC, weight (C_out, KH, KW, C_in/groups); PyTorch semantics."""
    return _run(2, decomposed_nhwc, x, weight, bias, stride, padding, output_padding, dilation, groups)


@register("conv_transpose1d", kernel=_kernel1d, kernel_vjp=_vjp1d, sources=(gpu.GATHER,),
          check=lambda *a, **k: _check(1, *a, **k), batched=3, example=_example1d, edge_examples=lambda: _edges(1))
def conv_transpose1d(x: mx.array, weight: mx.array, bias: mx.array | None = None, *,
                     stride: IntOrTuple = 1, padding: IntOrTuple = 0, output_padding: IntOrTuple = 0,
                     dilation: IntOrTuple = 1, groups: int = 1) -> mx.array:
    """Transposed 1-D convolution, NLC, weight (C_out, K, C_in/groups); PyTorch semantics."""
    return _run(1, decomposed_nhwc, x, weight, bias, stride, padding, output_padding, dilation, groups)
