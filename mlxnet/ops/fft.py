"""2-D real FFTs over the H and W axes of NHWC maps (LaMa's FourierUnit).

MLX's CPU FFT runs on one core. For the small maps LaMa transforms (the image / 8), the DFT as
dense matrices is cheaper on the CPU: one GEMM per axis, with the real and imaginary parts as
a 2×2 block structure (|error| ~5e-7 of the largest value). Larger maps, and GPUs, use
``mx.fft``.
"""
from __future__ import annotations

import math
from functools import lru_cache

import mlx.core as mx
import numpy as np

from ..device import backend
from ..errors import MlxnetError

_MAX_DFT = 128  # the GEMMs' cost grows with H + W per element, the FFT's with log(H·W)
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
    """DFT matrices. Complex values are (re, im) pairs t; a row or column index (i, t) is
    i·2 + t, so the GEMM operands below are plain reshapes of the data."""
    sh, sw, ih, iw = _scales(norm, h, w)
    k = w // 2 + 1
    wk = 2 * np.pi * np.outer(np.arange(k), np.arange(w)) / w  # (k, w)
    # rfft along W: rows (k, t): Re = Σ x cos, Im = −Σ x sin
    along_w = np.stack([np.cos(wk), -np.sin(wk)], 1).reshape(2 * k, w) * sw
    hu = 2 * np.pi * np.outer(np.arange(h), np.arange(h)) / h
    c, s = np.cos(hu), np.sin(hu)
    # complex DFT along H, rows (u, t') by columns (t, h): e^{−iθ}(a + ib) = (a c + b s) + i(b c − a s)
    along_h = np.stack([np.concatenate([c, s], 1), np.concatenate([-s, c], 1)], 1).reshape(2 * h, 2 * h) * sh
    # inverse along H, rows (h, t') by columns (u, t): e^{iθ}(a + ib) = (a c − b s) + i(a s + b c)
    inv_h = np.stack([np.stack([c, -s], 2), np.stack([s, c], 2)], 1).reshape(2 * h, 2 * h) * ih
    # c2r along W, (w, (k, t)): DC and Nyquist once, the others twice (Hermitian halves);
    # their imaginary parts meet sin 0 = sin πw = 0, i.e. are ignored, as pocketfft does
    twice = np.where((np.arange(k) == 0) | ((w % 2 == 0) & (np.arange(k) == w // 2)), 1.0, 2.0)[:, None]
    inv_w = np.stack([twice * np.cos(wk), -twice * np.sin(wk)], 1).reshape(2 * k, w).T * iw
    return tuple(mx.array(m.astype(np.float32)) for m in (along_w, along_h, inv_h, inv_w))


def _use_dft(h: int, w: int) -> bool:
    return backend() == "cpu" and max(h, w) <= _MAX_DFT


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
    out = []
    for image in x:
        r = (along_w @ image.transpose(1, 0, 2).reshape(w, h * c)).reshape(k, 2 * h, c)  # (k, (t, h), c)
        y = (along_h @ r).reshape(k, h, 2, c)  # (k, u, t, c)
        out.append(mx.view(mx.contiguous(y.transpose(1, 0, 3, 2)), mx.complex64).reshape(h, k, c))
    return out[0][None] if n == 1 else mx.stack(out)


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
    out = []
    for spectrum in f:
        p = mx.view(spectrum, mx.float32).reshape(h, k, c, 2).transpose(1, 0, 3, 2).reshape(k, 2 * h, c)
        z = (inv_h @ p).reshape(k, h, 2, c).transpose(1, 0, 2, 3).reshape(h, 2 * k, c)  # (h, (k, t), c)
        out.append(inv_w @ z)
    return out[0][None] if n == 1 else mx.stack(out)
