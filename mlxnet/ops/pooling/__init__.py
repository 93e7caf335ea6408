"""Pooling: max / avg pooling in 1d (NLC) and 2d (NHWC), max-unpooling, adaptive max / avg
pooling (NHWC), and YOLOv8's SPPF (three chained 5x5 max pools in one op).

PyTorch semantics throughout, its argument spellings included: an int, a pair or a 1-tuple
for both axes; ``stride`` None or ``()`` for ``kernel_size``. Each op's geometry function
checks a call before any face runs, so every face refuses the same calls, with one-line
MlxnetErrors (tests/test_pooling_torch.py draws calls against torch, and
tests/test_pooling_rules.py sweeps the geometry rules). ``padding`` is at most half the
kernel size (PyTorch checks the undilated size, also for dilated max pooling; an empty batch
is fine); with ``ceil_mode`` the last window may run past the padded input but must start
inside the input or the left padding; avg's divisor counts the padding
(``count_include_pad``) but never ceil-mode overhang, unless ``divisor_override`` replaces
it. Max pooling picks PyTorch's input (the first maximum in window scan order, or the last
NaN: NaN propagates) and its ``indices`` are ``h * W + w`` within each input plane, as int32
(PyTorch: int64). 1d ops run the 2d code on (N, 1, L, C). Adaptive windows of output
(oh, ow): start = floor(i*H/oh), end = ceil((i+1)*H/oh); they may differ in size and overlap
when oh does not divide H; ``output_size`` is an int, or a pair whose None entries keep the
input's size.

The files: :mod:`.geometry` (the argument rules and windows every face computes from),
:mod:`.definition` (MLX-composed window reductions), :mod:`.kernel` (the GPU faces) on the
kernels' launchers (:mod:`.launchers`; custom_kernels/pool.kern, pool_adaptive.kern).
"""
from __future__ import annotations

from typing import Any

import mlx.core as mx

from ..core.registry import register
from . import definition, kernel, launchers


def _example_2d() -> mx.array:
    return mx.random.normal((2, 9, 11, 6), key=mx.random.key(7))


def _example_1d() -> mx.array:
    return mx.random.normal((2, 13, 5), key=mx.random.key(8))


def _pool_edges(ndim: int, **kwargs: Any) -> list[tuple[tuple, dict]]:
    """Under 8 elements (with and without indices), and an empty batch (PyTorch takes it)."""
    shape = (1, 2, 3, 1) if ndim == 2 else (1, 5, 1)
    tiny = mx.arange(6, dtype=mx.float32)[: 6 if ndim == 2 else 5].reshape(shape)
    cases = [((tiny,), kwargs), ((mx.zeros((0,) + shape[1:]),), kwargs)]
    if "return_indices" in kwargs:
        cases.append(((tiny,), {**kwargs, "return_indices": not kwargs["return_indices"]}))
    return cases


def _avg_edges() -> list[tuple[tuple, dict]]:
    # A divisor_override too, so the compile checks render the override path of both kernels.
    return (_pool_edges(2, kernel_size=2, padding=1, ceil_mode=True)
            + _pool_edges(2, kernel_size=(2,), stride=(), padding=(1,), divisor_override=3))


def _unpool_example() -> tuple[tuple, dict]:
    x = mx.random.normal((2, 8, 11, 6), key=mx.random.key(9))
    y, indices = definition.max_pool2d(x, 2, return_indices=True)
    return (y, indices), dict(kernel_size=2, output_size=(9, 11))


def _unpool_edges() -> list[tuple[tuple, dict]]:
    tiny, indices = mx.array([1.0, -2.0]).reshape(1, 1, 2, 1), mx.array([0, 3]).reshape(1, 1, 2, 1)
    empty = mx.zeros((0, 1, 2, 1))
    return [((tiny, indices), dict(kernel_size=2)),
            ((empty, empty.astype(mx.int32)), dict(kernel_size=2))]


def _adaptive_example() -> mx.array:
    return mx.random.normal((2, 10, 7, 5), key=mx.random.key(11))


def _adaptive_edges(**kwargs: Any) -> list[tuple[tuple, dict]]:
    """Under 8 elements, and an empty batch (PyTorch takes it)."""
    tiny = mx.array([1.0, -1.0, 3.0, 0.5, 2.0, -4.0]).reshape(1, 2, 3, 1)
    return [((tiny,), kwargs), ((mx.zeros((0, 2, 3, 1)),), kwargs)]


max_pool2d = register(
    "max_pool2d", batched=4, kernel=kernel.max_pool2d, kernel_vjp=kernel.max_pool2d_vjp,
    sources=(launchers.MAX,),
    example=lambda: ((_example_2d(),), dict(kernel_size=(3, 2), stride=(2, 1), padding=1,
                                            dilation=(1, 2), ceil_mode=True)),
    edge_examples=lambda: _pool_edges(2, kernel_size=2, padding=1, return_indices=False),
)(definition.max_pool2d)

max_pool1d = register(
    "max_pool1d", batched=3, kernel=kernel.max_pool1d, kernel_vjp=kernel.max_pool1d_vjp,
    sources=(launchers.MAX_INDICES,),
    example=lambda: ((_example_1d(),), dict(kernel_size=3, stride=2, padding=1, dilation=2,
                                            ceil_mode=True, return_indices=True)),
    edge_examples=lambda: _pool_edges(1, kernel_size=2, dilation=2, return_indices=True),
)(definition.max_pool1d)

avg_pool2d = register(
    "avg_pool2d", batched=4, kernel=kernel.avg_pool2d, kernel_vjp=kernel.avg_pool2d_vjp,
    sources=(launchers.AVG,),
    example=lambda: ((_example_2d(),), dict(kernel_size=3, stride=2, padding=1,
                                            ceil_mode=True, count_include_pad=False)),
    edge_examples=_avg_edges,
)(definition.avg_pool2d)

avg_pool1d = register(
    "avg_pool1d", batched=3, kernel=kernel.avg_pool1d, kernel_vjp=kernel.avg_pool1d_vjp,
    sources=(launchers.AVG,),
    example=lambda: ((_example_1d(),), dict(kernel_size=4, stride=3, padding=2, ceil_mode=True)),
    edge_examples=lambda: _pool_edges(1, kernel_size=3, count_include_pad=False),
)(definition.avg_pool1d)

max_unpool2d = register(
    "max_unpool2d", batched=4, per_sample=2, kernel=kernel.max_unpool2d,
    kernel_vjp=kernel.max_unpool2d_vjp, sources=(launchers.UNPOOL,), example=_unpool_example,
    edge_examples=_unpool_edges,
)(definition.max_unpool2d)

adaptive_avg_pool2d = register(
    "adaptive_avg_pool2d", batched=4, kernel=kernel.adaptive_avg_pool2d,
    kernel_vjp=kernel.adaptive_avg_pool2d_vjp, sources=(launchers.ADAPTIVE_AVG,),
    example=lambda: ((_adaptive_example(),), dict(output_size=(3, 4))),
    edge_examples=lambda: _adaptive_edges(output_size=1),
)(definition.adaptive_avg_pool2d)

adaptive_max_pool2d = register(
    "adaptive_max_pool2d", batched=4, kernel=kernel.adaptive_max_pool2d,
    kernel_vjp=kernel.adaptive_max_pool2d_vjp, sources=(launchers.ADAPTIVE_MAX_INDICES,),
    example=lambda: ((_adaptive_example(),), dict(output_size=(4, None), return_indices=True)),
    edge_examples=lambda: [((_adaptive_example(),), dict(output_size=(3, 2)))]
    + _adaptive_edges(output_size=(1, 2)) + _adaptive_edges(output_size=2, return_indices=True),
)(definition.adaptive_max_pool2d)

sppf_pool = register(
    "sppf_pool", batched=4, kernel=kernel.sppf_pool, kernel_vjp=kernel.sppf_pool_vjp,
    sources=(launchers.SPPF,),
    example=lambda: ((mx.random.normal((2, 8, 9, 6), key=mx.random.key(12)),), {}),
    edge_examples=lambda: [((mx.array([[[[1.0], [2.0]]]]),), {}), ((mx.zeros((0, 2, 2, 1)),), {})],
)(definition.sppf_pool)

__all__ = ["adaptive_avg_pool2d", "adaptive_max_pool2d", "avg_pool1d", "avg_pool2d",
           "max_pool1d", "max_pool2d", "max_unpool2d", "sppf_pool"]
