"""2-D real FFTs over the H and W axes of NHWC maps (LaMa's FourierUnit).

For the small maps LaMa transforms (the image / 8) the DFT as dense matrices beats ``mx.fft``:
MLX's CPU FFT runs on one core, and on GPUs each of its 1-D passes sits behind a transposing
copy of the complex map. The DFT here is two GEMMs per direction whose operands are plain
reshapes of NHWC (the DFT matrix multiplies from the left, so W and then H are contracted in
place), and one elementwise pass that combines the real and imaginary parts. Larger maps use
``mx.fft``: the GEMMs' cost grows with H + W per element, the FFT's with log(H·W).
"""
from __future__ import annotations

import math
from functools import lru_cache

import mlx.core as mx
import numpy as np

from ..errors import MlxnetError

_MAX_DFT = 128  # largest side transformed by the GEMMs
_NORMS = ("backward", "ortho", "forward")


def _check_norm(norm: str) -> None:
    if norm not in _NORMS:
        raise MlxnetError(f"fft: norm must be one of {', '.join(_NORMS)}, got {norm!r}")


def _scales(norm: str, h: int, w: int) -> tuple[float, float, float, float]:
    """(forward H, forward W, inverse H, inverse W) scale factors of ``norm``."""
    if norm == "ortho":
        return 1 / math.sqrt(h), 1 / math.sqrt(w), 1 / math.sqrt(h), 1 / math.sqrt(w)
    return (1.0, 1.0, 1 / h, 1 / w) if norm == "backward" else (1 / h, 1 / w, 1.0, 1.0)


@lru_cache(maxsize=16)
def _matrices(h: int, w: int, norm: str) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """(rfft along W, DFT along H, inverse DFT along H, c2r along W), float32.

    A complex value is a (re, im) pair t; the W-side matrices index it as k·2 + t, so that a
    (…, K, 2, C) map is their (…, 2K, C) operand. The H-side matrices are real: rows (t', u)
    stack cos over ∓sin, and the complex product is finished by :func:`_combine`.
    """
    sh, sw, ih, iw = _scales(norm, h, w)
    k = w // 2 + 1
    wk = 2 * np.pi * np.outer(np.arange(k), np.arange(w)) / w  # (k, w)
    # rfft along W, rows (k, t): Re = Σ x cos, Im = −Σ x sin
    along_w = np.stack([np.cos(wk), -np.sin(wk)], 1).reshape(2 * k, w) * sw
    hu = 2 * np.pi * np.outer(np.arange(h), np.arange(h)) / h
    c, s = np.cos(hu), np.sin(hu)
    along_h = np.concatenate([c, -s]) * sh  # e^{−iθ}: rows (cos, −sin)
    inv_h = np.concatenate([c, s]) * ih     # e^{+iθ}: rows (cos, sin)
    # c2r along W, (w, (k, t)): DC and Nyquist once, the others twice (Hermitian halves);
    # their imaginary parts meet sin 0 = sin πw = 0, i.e. are ignored, as pocketfft does
    twice = np.where((np.arange(k) == 0) | ((w % 2 == 0) & (np.arange(k) == w // 2)), 1.0, 2.0)[:, None]
    inv_w = np.stack([twice * np.cos(wk), -twice * np.sin(wk)], 1).reshape(2 * k, w).T * iw
    return tuple(mx.array(m.astype(np.float32)) for m in (along_w, along_h, inv_h, inv_w))


def _combine(q: mx.array, pair_axis: int) -> mx.array:
    """Finish a complex product along H from the GEMM's two real halves.

    ``q`` is (N, 2, …) with a (re, im) pair axis at ``pair_axis`` of ``q[:, 0]``: half 0 is cos·z, half 1 is ∓sin·z
    (sign folded into the matrix), so the product is half 0 + (−1, +1)·(half 1 with re and
    im swapped): (a + ib)(c ∓ is) = (ac ± bs) + i(bc ∓ as).
    """
    sign = mx.array([-1.0, 1.0]).reshape((2,) + (1,) * (q.ndim - 2 - pair_axis))
    idx = [slice(None)] * (q.ndim - 1)
    idx[pair_axis] = slice(None, None, -1)
    return q[:, 0] + sign * q[:, 1][tuple(idx)]


def _use_dft(h: int, w: int) -> bool:
    return max(h, w) <= _MAX_DFT


def rfft2(x: mx.array, norm: str = "backward") -> mx.array:
    """``mx.fft.rfft2(x, axes=(1, 2), norm=norm)`` of a real (N, H, W, C) map, in complex64."""
    _check_norm(norm)
    n, h, w, c = x.shape
    x = x.astype(mx.float32)
    if not _use_dft(h, w):
        # MLX returns the layout of its last 1-D pass (a strided view of NHWC). Made row-
        # contiguous here, so a view of its dtype (LaMa reads it as float pairs) shares the
        # buffer: a view of a strided array is copied, on CUDA through host-visible memory.
        return mx.contiguous(mx.fft.rfft2(x, axes=(1, 2), norm=norm))
    along_w, along_h, _, _ = _matrices(h, w, norm)
    k = w // 2 + 1
    p = along_w @ x.reshape(n * h, w, c)                                  # (N·H, K·2, C)
    q = (along_h @ p.reshape(n, h, 2 * k * c)).reshape(n, 2, h, k, 2, c)  # rows (t', u)
    # combined with the pair axis last (the complex64 layout); made contiguous for the view
    pairs = _combine(mx.swapaxes(q, -1, -2), pair_axis=4)                 # (N, H, K, C, 2)
    return mx.view(mx.contiguous(pairs), mx.complex64).reshape(n, h, k, c)


def irfft2(f: mx.array, s: tuple[int, int], norm: str = "backward") -> mx.array:
    """``mx.fft.irfft2(f, s=s, axes=(1, 2), norm=norm)`` of a complex (N, H, W//2+1, C) map."""
    _check_norm(norm)
    n, h, k, c = f.shape
    w = s[1]
    if s[0] != h or k != w // 2 + 1:
        raise MlxnetError(f"irfft2: a spectrum of {h}×{k} does not give an {s[0]}×{w} map")
    f = f.astype(mx.complex64)
    if not _use_dft(h, w):
        return mx.fft.irfft2(f, s=s, axes=(1, 2), norm=norm)
    _, _, inv_h, inv_w = _matrices(h, w, norm)
    pairs = mx.view(mx.contiguous(f), mx.float32)                           # (N, H, K, C·2)
    r = (inv_h @ pairs.reshape(n, h, k * c * 2)).reshape(n, 2, h, k, c, 2)  # rows (t', u)
    z = mx.contiguous(_combine(mx.swapaxes(r, -1, -2), pair_axis=3))        # (N, H, K, 2, C)
    return (inv_w @ z.reshape(n * h, 2 * k, c)).reshape(n, h, w, c)
