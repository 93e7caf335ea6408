"""A stride-1 conv as one GEMM to every tap's product, then the taps' shifted products summed:
a formulation both the CPU face (few output channels) and the CUDA face (float32 convs to 1–3
channels) take."""
from __future__ import annotations

from functools import lru_cache

import mlx.core as mx

from .check import Pair


@lru_cache(maxsize=None)
def _sum_of(count: int):
    """One fused pass adding ``count`` same-shaped (possibly strided) arrays."""
    return mx.compile(lambda *terms: sum(terms[1:], terms[0]))


def _fused_sum(terms: list[mx.array]) -> mx.array:
    # Groups of ≤ 8: MLX's compiler splits deeper chains anyway (max_compile_depth).
    while len(terms) > 1:
        terms = [_sum_of(len(g))(*g) if len(g) > 1 else g[0] for g in (terms[k:k + 8] for k in range(0, len(terms), 8))]
    return terms[0]


def _taps_then_shift(xp: mx.array, weight: mx.array, dilation: Pair, out: Pair) -> mx.array:
    """Stride-1 conv as xp @ W for every tap at once, then the taps' shifted maps summed, each
    kernel row in one fused pass (fewer passes over memory than one add per tap)."""
    n, hp, wp, c = xp.shape
    c_out, kh, kw, _ = weight.shape
    z = (xp.reshape(-1, c) @ weight.transpose(3, 1, 2, 0).reshape(c, -1)).reshape(n, hp, wp, kh, kw, c_out)
    (dh, dw), (oh, ow) = dilation, out
    rows = [_fused_sum([z[:, i * dh: i * dh + oh, j * dw: j * dw + ow, i, j, :] for j in range(kw)])
            for i in range(kh)]
    return _fused_sum(rows)
