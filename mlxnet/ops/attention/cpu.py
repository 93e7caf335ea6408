"""scaled_dot_product_attention's CPU fast path: many queries against a few keys (SAM's image
positions attending to its 7 prompt tokens) as mlxnet's C++ primitive (:mod:`mlxnet._native`),
sixteen query rows per vector step; otherwise the definition, in bands of a leading axis
(windows, or heads) on every core (:mod:`..core.cpu_bands`).

A windowed ViT's attention is many small products: TinyViT's first attention stage is 676
(window, head) pairs of 49×64 by 64×49. MLX runs a batched matmul as one BLAS call per pair on
its stream's thread, where calls this small stay on one core, and its elementwise passes on one
core too; bands of the pairs on separate CPU streams run at once.
"""
from __future__ import annotations

import math

import mlx.core as mx

from ... import _native
from ..core.cpu_bands import band_count, in_bands
from .definition import scaled_dot_product_attention as _definition

_BAND_SCORES = 2**17  # attention scores per band at least (smaller: the split costs more)
# Where the primitive beats the banded products (scripts/bench/bench_ops.py, 2-core AVX-512):
# many queries against few keys, narrow heads.
_NATIVE_MAX_KEYS = 16
_NATIVE_MAX_WIDTH = 16
_NATIVE_MIN_QUERIES = 64


def _band_axis(lead: tuple[int, ...], bands: int) -> int | None:
    """The first leading axis long enough to split into ``bands`` parts."""
    return next((i for i, n in enumerate(lead) if n >= bands), None)


def _part(a: mx.array, lead: tuple[int, ...], axis: int, start: int, stop: int) -> mx.array:
    """``a``'s share of the band [start, stop) of leading axis ``axis`` (arrays broadcast along
    it, by size 1 or by lacking it, are shared whole)."""
    own = axis - (len(lead) - (a.ndim - 2))  # a's leading axes are right-aligned with ``lead``
    if own < 0 or a.shape[own] != lead[axis]:
        return a
    index = [slice(None)] * a.ndim
    index[own] = slice(start, stop)
    return a[tuple(index)]


def scaled_dot_product_attention(q: mx.array, k: mx.array, v: mx.array, bias: mx.array | None = None,
                                 *, scale: float, dropout_p: float = 0.0,
                                 key: mx.array | None = None) -> mx.array:
    native = _native.on_cpu()
    if (native is not None and bias is None and not dropout_p and k.shape[-2] <= _NATIVE_MAX_KEYS
            and q.shape[-1] <= _NATIVE_MAX_WIDTH and q.shape[-2] >= _NATIVE_MIN_QUERIES):
        f32 = [a.astype(mx.float32) for a in (q, k, v)]
        return native.attention(*f32, scale).astype(v.dtype)
    lead = tuple(mx.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2],
                                     () if bias is None else bias.shape[:-2]))
    bands = 1 if dropout_p else band_count(math.prod(lead) * q.shape[-2] * k.shape[-2], _BAND_SCORES)
    axis = _band_axis(lead, bands) if bands > 1 else None
    if axis is None:
        return _definition(q, k, v, bias, scale=scale, dropout_p=dropout_p, key=key)

    def band(start: int, stop: int) -> mx.array:
        parts = [_part(a, lead, axis, start, stop) for a in (q, k, v)]
        b = None if bias is None else _part(bias, lead, axis, start, stop)
        return _definition(*parts, b, scale=scale)
    return in_bands(band, lead[axis], bands, axis)
