"""2-D real FFTs over the H and W axes of NHWC maps (LaMa's FourierUnit).

Spectra come in two layouts. :func:`rfft2` / :func:`irfft2` take and give complex64
(N, H, W//2+1, C), as ``mx.fft`` does. :func:`rfft2_planar` / :func:`irfft2_planar` take and give
float32 (N, H, W//2+1, 2, C): the real plane of each frequency, then its imaginary plane.

For the small maps LaMa transforms (the image / 8) the planar transforms are the DFT as dense
matrices, two GEMMs per direction and no other pass: each matrix multiplies from the left, so
it contracts H (or W) of NHWC in place, and the (re, im) pair index sits next to the contracted
axis, so the complex arithmetic is part of the GEMM. ``mx.fft`` on GPUs puts a transposing copy
of the complex map before each of its 1-D passes, and on the CPU runs on one core. Larger maps
use ``mx.fft``: the GEMMs' cost grows with H + W per element, the FFT's with log(H·W).
"""
from __future__ import annotations

import math
from functools import lru_cache

import mlx.core as mx
import numpy as np

from ...errors import MlxnetError

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


def _pairs(re: np.ndarray, im: np.ndarray, *, pair_first_out: bool, pair_first_in: bool) -> np.ndarray:
    """The real matrix of the complex matrix re + i·im acting on (re, im) pairs.

    ``re``/``im`` are (rows, cols); output rows are indexed (row, pair) or, if pair_first_out,
    (pair, row); input columns likewise (col, pair) or (pair, col).
    """
    m = np.stack([np.stack([re, -im], 1), np.stack([im, re], 1)], 1)  # (rows, out pair, in pair, cols)
    m = m.transpose(1 if pair_first_out else 0, 0 if pair_first_out else 1,
                    2 if pair_first_in else 3, 3 if pair_first_in else 2)
    return m.reshape(2 * re.shape[0], 2 * re.shape[1])


@lru_cache(maxsize=16)
def _matrices(h: int, w: int, norm: str) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """(forward along H, forward along W, inverse along W, inverse along H), float32.

    Forward: H first on the real map, rows (u, pair) → an (N, H, 2, W, C) complex map whose
    (pair, w) index the W matrix contracts, giving rows (k, pair): (N, H, K, 2, C).
    Inverse: W first, contracting (k, pair) to rows (pair, w), complex; then H contracts
    (u, pair) and keeps the real part: the real part commutes with the sums, so it can come last.
    """
    sh, sw, ih, iw = _scales(norm, h, w)
    k = w // 2 + 1
    hu = 2 * np.pi * np.outer(np.arange(h), np.arange(h)) / h   # (u, h)
    wk = 2 * np.pi * np.outer(np.arange(k), np.arange(w)) / w   # (k, w)
    along_h = np.stack([np.cos(hu), -np.sin(hu)], 1).reshape(2 * h, h) * sh  # e^{−iθ} of a real map
    # e^{−iθ} along W, rows (k, pair)
    along_w = _pairs(np.cos(wk), -np.sin(wk), pair_first_out=False, pair_first_in=True) * sw
    # c2r along W: frequencies 0 < k < W/2 stand for their Hermitian twins too, so count twice;
    # DC's and Nyquist's imaginary parts then meet only the real part taken at the end, i.e. are
    # ignored, as pocketfft does
    twice = np.where((np.arange(k) == 0) | ((w % 2 == 0) & (np.arange(k) == w // 2)), 1.0, 2.0)[:, None]
    inv_w = _pairs((twice * np.cos(wk)).T, (twice * np.sin(wk)).T,
                   pair_first_out=True, pair_first_in=False) * iw
    inv_h = np.stack([np.cos(hu), -np.sin(hu)], 2).reshape(h, 2 * h) * ih    # real part of e^{+iθ}·z
    # inv_w is kept transposed and used as a view: its rows of 2K floats (K odd for even W) would
    # give cuBLAS a leading dimension that is not a multiple of 4, and it picks slower kernels then
    # (C order first: mx.array keeps a Fortran-ordered array's column-major strides, which
    # would make inv_w_t.T row-major again)
    along_h, along_w, inv_w_t, inv_h = (mx.array(np.ascontiguousarray(m, dtype=np.float32))
                                        for m in (along_h, along_w, inv_w.T, inv_h))
    out = (along_h, along_w, inv_w_t.T, inv_h)
    mx.eval(out)  # materialised now, not inside the trace of a compiled forward
    return out


def _use_dft(h: int, w: int) -> bool:
    return max(h, w) <= _MAX_DFT


def rfft2_planar(x: mx.array, norm: str = "backward") -> mx.array:
    """The 2-D real FFT over H and W of a real (N, H, W, C) map, as (N, H, W//2+1, 2, C) float32."""
    _check_norm(norm)
    n, h, w, c = x.shape
    x = x.astype(mx.float32)
    if not _use_dft(h, w):
        f = mx.fft.rfft2(x, axes=(1, 2), norm=norm)
        return mx.stack([mx.real(f), mx.imag(f)], axis=3)
    along_h, along_w, _, _ = _matrices(h, w, norm)
    k = w // 2 + 1
    z = along_h @ x.reshape(n, h, w * c)                           # (N, (u, pair), W·C)
    return (along_w @ z.reshape(n * h, 2 * w, c)).reshape(n, h, k, 2, c)


def irfft2_planar(spectrum: mx.array, s: tuple[int, int], norm: str = "backward") -> mx.array:
    """The inverse of :func:`rfft2_planar` onto an (N, *s, C) map; imaginary parts that a real
    map's spectrum cannot have (DC's and Nyquist's) are ignored, as ``numpy.fft.irfft2`` does."""
    _check_norm(norm)
    n, h, k, _, c = spectrum.shape
    _check_shape(h, k, s)
    spectrum = spectrum.astype(mx.float32)
    w = s[1]
    if not _use_dft(h, w):
        f = spectrum[:, :, :, 0] + 1j * spectrum[:, :, :, 1]
        return mx.fft.irfft2(f, s=s, axes=(1, 2), norm=norm)
    _, _, inv_w, inv_h = _matrices(h, w, norm)
    z = inv_w @ spectrum.reshape(n * h, 2 * k, c)                  # (N·H, (pair, w), C)
    return (inv_h @ z.reshape(n, 2 * h, w * c)).reshape(n, h, w, c)


def _check_shape(h: int, k: int, s: tuple[int, int]) -> None:
    if s[0] != h or k != s[1] // 2 + 1:
        raise MlxnetError(f"irfft2: a spectrum of {h}×{k} does not give an {s[0]}×{s[1]} map")


def rfft2(x: mx.array, norm: str = "backward") -> mx.array:
    """``mx.fft.rfft2(x, axes=(1, 2), norm=norm)`` of a real (N, H, W, C) map, in complex64."""
    _check_norm(norm)
    if not _use_dft(*x.shape[1:3]):
        return mx.fft.rfft2(x.astype(mx.float32), axes=(1, 2), norm=norm)
    p = rfft2_planar(x, norm)
    return p[:, :, :, 0] + 1j * p[:, :, :, 1]


def irfft2(f: mx.array, s: tuple[int, int], norm: str = "backward") -> mx.array:
    """``mx.fft.irfft2(f, s=s, axes=(1, 2), norm=norm)`` of a complex (N, H, W//2+1, C) map."""
    _check_norm(norm)
    f = f.astype(mx.complex64)
    if not _use_dft(*s):
        _check_shape(f.shape[1], f.shape[2], s)
        return mx.fft.irfft2(f, s=s, axes=(1, 2), norm=norm)
    return irfft2_planar(mx.stack([mx.real(f), mx.imag(f)], axis=3), s, norm)
