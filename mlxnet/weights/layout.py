"""PyTorch → MLX tensor layouts: the one place NCHW-family weights become NHWC-family.

PyTorch                          MLX / mlxnet
Conv1d   (O, I/g, K)          →  (O, K, I/g)
Conv2d   (O, I/g, KH, KW)     →  (O, KH, KW, I/g)
ConvT1d  (I, O/g, K)          →  (O, K, I/g)
ConvT2d  (I, O/g, KH, KW)     →  (O, KH, KW, I/g)
Linear, norms, biases            unchanged

Both functions take numpy arrays or MLX arrays (bfloat16 has no numpy dtype) and return the same kind.
"""
from __future__ import annotations

from typing import Literal

import mlx.core as mx
import numpy as np

LayoutKind = Literal["conv1d", "conv2d", "conv_transpose1d", "conv_transpose2d", "plain"]


def _moveaxis(w, source: int, destination: int):
    return (mx if isinstance(w, mx.array) else np).moveaxis(w, source, destination)


def from_torch_layout(w: np.ndarray, kind: LayoutKind, groups: int = 1) -> np.ndarray:
    """Reorder one PyTorch weight into mlxnet's layout (numpy in, numpy out; mx in, mx out)."""
    if kind == "plain":
        return w
    if kind in ("conv1d", "conv2d"):
        return _moveaxis(w, 1, -1)
    if kind in ("conv_transpose1d", "conv_transpose2d"):
        c_in, c_out_g = w.shape[:2]
        kernel = w.shape[2:]
        w = w.reshape(groups, c_in // groups, c_out_g, *kernel)
        w = _moveaxis(w, 1, -1)  # (g, O/g, *kernel, I/g)
        return w.reshape(groups * c_out_g, *kernel, c_in // groups)
    raise ValueError(f"unknown layout kind {kind!r}")


def to_torch_layout(w: np.ndarray, kind: LayoutKind, groups: int = 1) -> np.ndarray:
    """Inverse of :func:`from_torch_layout` (for exporting and for tests)."""
    if kind == "plain":
        return w
    if kind in ("conv1d", "conv2d"):
        return _moveaxis(w, -1, 1)
    if kind in ("conv_transpose1d", "conv_transpose2d"):
        c_out, kernel, c_in_g = w.shape[0], w.shape[1:-1], w.shape[-1]
        w = w.reshape(groups, c_out // groups, *kernel, c_in_g)
        w = _moveaxis(w, -1, 1)  # (g, I/g, O/g, *kernel)
        return w.reshape(groups * c_in_g, c_out // groups, *kernel)
    raise ValueError(f"unknown layout kind {kind!r}")
