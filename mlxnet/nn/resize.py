"""Bilinear resizing of the last two axes, as PyTorch's ``F.interpolate(mode="bilinear",
align_corners=False, antialias=False)`` computes it.

Two forms of one resize:

- :func:`interpolate_bilinear`, the definition: each output pixel blends the two nearest source
  rows, then the two nearest source columns.
- :class:`BilinearResize`, the fast form for a fixed chain of resizes and top-left crops (SAM's
  mask upsampling: 256 → 1024, crop, → the original size). Each step is linear and acts on rows
  and columns separately, so the whole chain is one matrix per axis, ``rows @ x @ cols.T``:
  two matrix products, which a BLAS runs at full speed, where the definition's gathers run at
  memory speed and materialise every intermediate size.

Both use PyTorch's source coordinates and weights (float32, see :func:`bilinear_taps`), so the
results agree with the reference to float32 rounding, not only to the resize's definition.
"""
from __future__ import annotations

from functools import cached_property

import mlx.core as mx
import numpy as np

Size = tuple[int, int]


def bilinear_taps(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each output index along one axis: the two source indices (lo, hi) and the weight of
    hi (float32; lo's is ``1 - weight``).

    Half-pixel centres, clamped at the first pixel and at the last, as PyTorch does it in float32:
    scale = n_in / n_out rounded to float32, the source coordinate ``scale * (i + 0.5) - 0.5``
    rounded once (PyTorch's builds contract it to a fused multiply-add; two roundings would move
    weights by up to 1e-4 at a thousand pixels), and the same size gives the identity.
    """
    index = np.arange(n_out)
    if n_in == n_out:
        return index, index, np.zeros(n_out, np.float32)
    scale = np.float64(np.float32(n_in) / np.float32(n_out))
    src = np.maximum((scale * (index + 0.5) - 0.5).astype(np.float32), np.float32(0))
    lo = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    hi = np.minimum(lo + 1, n_in - 1)
    weight = np.clip(src - lo.astype(np.float32), 0, 1).astype(np.float32)
    return lo, hi, weight


def bilinear_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) float64 matrix of one axis' resize: ``matrix @ column`` resizes a column."""
    lo, hi, weight = bilinear_taps(n_in, n_out)
    matrix = np.zeros((n_out, n_in))
    rows = np.arange(n_out)
    np.add.at(matrix, (rows, lo), (np.float32(1) - weight).astype(np.float64))  # lo == hi at the edge
    np.add.at(matrix, (rows, hi), weight.astype(np.float64))
    return matrix


def interpolate_bilinear(x: mx.array, size: Size, keep: Size | None = None) -> mx.array:
    """Resize the last two axes of ``x`` to ``size`` (the definition); ``keep`` returns only the
    first (rows, cols) of that output (a top-left crop, without computing the rest)."""
    keep = keep or size
    for axis, n_out, n_keep in ((-2, size[0], keep[0]), (-1, size[1], keep[1])):
        lo, hi, weight = (t[:n_keep] for t in bilinear_taps(x.shape[axis], n_out))
        weight = mx.array(weight if axis == -1 else weight[:, None])
        low, high = mx.take(x, mx.array(lo), axis=axis), mx.take(x, mx.array(hi), axis=axis)
        x = low * (1 - weight) + high * weight
    return x


class BilinearResize:
    """A chain of bilinear resizes and top-left crops of the last two axes, as one matrix per axis.

        upscale = BilinearResize((256, 256)).resize((1024, 1024)).crop((1024, 768)).resize((1080, 810))
        logits = upscale(low_res)        # (..., 256, 256) float32 → (..., 1080, 810)

    Each step returns a new chain; the matrices are composed in float64 and applied in float32.
    """

    def __init__(self, size: Size, rows: np.ndarray | None = None, cols: np.ndarray | None = None) -> None:
        self.in_size = size
        self.rows = np.eye(size[0]) if rows is None else rows  # (out_h, in_h)
        self.cols = np.eye(size[1]) if cols is None else cols  # (out_w, in_w)

    @property
    def out_size(self) -> Size:
        return self.rows.shape[0], self.cols.shape[0]

    def resize(self, size: Size) -> "BilinearResize":
        h, w = self.out_size
        return BilinearResize(self.in_size, bilinear_matrix(h, size[0]) @ self.rows,
                              bilinear_matrix(w, size[1]) @ self.cols)

    def crop(self, size: Size) -> "BilinearResize":
        """Keep the first ``size`` = (rows, cols) of the current output."""
        return BilinearResize(self.in_size, self.rows[:size[0]], self.cols[:size[1]])

    @cached_property
    def _matrices(self) -> tuple[mx.array, mx.array]:
        """The two matrices transposed, (in_h, out_h) and (in_w, out_w), in float32."""
        return mx.array(self.rows.T.astype(np.float32)), mx.array(self.cols.T.astype(np.float32))

    def __call__(self, x: mx.array) -> mx.array:
        """(..., in_h, in_w) float → (..., out_h, out_w)."""
        if tuple(x.shape[-2:]) != self.in_size:
            raise ValueError(f"BilinearResize: expected (..., {self.in_size[0]}, {self.in_size[1]}), "
                             f"got {tuple(x.shape)}")
        rows_t, cols_t = self._matrices
        (h, w), (out_h, out_w) = self.in_size, self.out_size
        lead, n = x.shape[:-2], x.size // (h * w)
        # Each axis as one tall product over the whole batch (a BLAS's fastest shape; a batch of
        # small products is several times slower). Rows first, on the small input turned on its
        # side, so that the columns' product, the large one, writes the output in place.
        x = x.reshape(n, h, w).swapaxes(1, 2).reshape(n * w, h) @ rows_t
        x = x.reshape(n, w, out_h).swapaxes(1, 2).reshape(n * out_h, w) @ cols_t
        return x.reshape(*lead, out_h, out_w)
