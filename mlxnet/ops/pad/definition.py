"""pad2d's definition: one gather with a precomputed index (padding and crop together), or
MLX's own ``mx.pad`` of the cropped map for 'constant'; and the argument check every face
calls first."""
from __future__ import annotations

import numbers
from functools import lru_cache

import mlx.core as mx
import numpy as np

from ...errors import MlxnetError
from ..activations import definition as activations
from ..core.args import ints, one_line, shape_of

MODES = ("reflect", "symmetric", "replicate", "constant")

Pads = tuple[int, int, int, int]
_BRIEF = 60  # characters of a bad argument's repr an error message shows


def _kept(size: int, lo: int, hi: int) -> tuple[int, int]:
    """(first kept index, kept length) of an axis of ``size`` whose start and end ``lo`` and
    ``hi`` pad or, where negative, crop."""
    start = max(-lo, 0)
    return start, size - start - max(-hi, 0)


def _axis(size: int, lo: int, hi: int, mode: str) -> np.ndarray:
    """Input index along one axis of every output position: the positive pads applied to the
    whole axis, then the negative ones cropping that padded axis (F.pad's order), so position j
    reads input coordinate j - lo, folded back into the axis by the mode."""
    t = np.arange(size + lo + hi) - lo
    if mode == "replicate":
        return np.clip(t, 0, size - 1)
    if mode == "reflect":  # edge not repeated
        t = np.abs(t)
        return np.where(t >= size, 2 * (size - 1) - t, t)
    t = np.where(t < 0, -t - 1, t)  # symmetric: edge repeated
    return np.where(t >= size, 2 * size - 1 - t, t)


@lru_cache(maxsize=64)
def _pad_index(h: int, w: int, top: int, bottom: int, left: int, right: int, mode: str) -> mx.array:
    """Flat source index of every pixel of the output (h + top + bottom, w + left + right) map."""
    index = _axis(h, top, bottom, mode)[:, None] * w + _axis(w, left, right, mode)[None, :]
    return mx.array(index.ravel().astype(np.int32))


def _check(x: mx.array, pads: Pads, mode: str, value: float | None = None) -> Pads:
    """Validate a call and return its pads as 4 ints: every face calls this first, so each
    refuses exactly what the definition refuses."""
    if not isinstance(mode, str) or mode not in MODES:
        raise MlxnetError(f"pad2d: unknown mode {one_line(mode, _BRIEF)}; expected one of {', '.join(MODES)}")
    pads = ints(pads, (4,), "pads", "pad2d", "4 ints (top, bottom, left, right)")
    if not isinstance(x, mx.array) or x.ndim < 3:
        raise MlxnetError(f"pad2d: x must be an (..., H, W, C) array, got {shape_of(x)}")
    if value is not None:
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            raise MlxnetError(f"pad2d: value must be a number, got {one_line(value, _BRIEF)}")
        if mode != "constant" and value != 0:  # PyTorch accepts only None or 0 here too
            raise MlxnetError(f"pad2d: mode {mode!r} takes no value (got {value!r}); value is for 'constant'")
    h, w = x.shape[-3:-1]
    said = f"pads {pads} (top, bottom, left, right)"
    for size, lo, hi, unit in ((h, pads[0], pads[1], "rows"), (w, pads[2], pads[3], "columns")):
        crop = max(-lo, 0) + max(-hi, 0)
        # 'constant' crops the map itself (PyTorch refuses a wider crop); the other modes crop
        # the padded map, which may be wider
        if size + lo + hi < 0 or (mode == "constant" and crop > size):
            raise MlxnetError(f"pad2d: {said} crop {crop} {unit} of a {h}×{w} map, which has only {size} "
                              f"({mode} mode)")
        grow = max(lo, hi, 0)
        if grow == 0 or mode == "constant":
            continue
        if mode == "replicate" and size == 0:
            raise MlxnetError(f"pad2d: {said} leave no {unit} to replicate in a {h}×{w} map")
        # reflect does not repeat the edge, so it reaches one pixel less than symmetric (PyTorch's limit)
        limit = size - 1 if mode == "reflect" else size
        if mode != "replicate" and grow > limit:
            rule = "less than" if mode == "reflect" else "at most"
            raise MlxnetError(f"pad2d: {said} are too wide to {mode}-pad a {h}×{w} map: each pad must be "
                              f"{rule} the {size} {unit} it pads")
    return pads


def pad2d(x: mx.array, pads: Pads, mode: str = "reflect", value: float | None = None) -> mx.array:
    """Pad the H, W axes of ``x`` (..., H, W, C) by ``pads = (top, bottom, left, right)``, as
    ``F.pad(x, (left, right, top, bottom), mode, value)`` pads NCHW maps; negative pads crop
    (in 'constant' the map itself, in the other modes the padded map, as F.pad).
    ``value`` (default 0) fills for mode 'constant'. Each mode is one gather (or MLX's pad), so
    the output is the only new buffer."""
    pads = _check(x, pads, mode, value)
    top, bottom, left, right = pads
    if not any(pads):
        return x
    h, w = x.shape[-3:-1]
    if mode == "constant":
        (row0, kh), (col0, kw) = _kept(h, top, bottom), _kept(w, left, right)
        widths = [(max(top, 0), max(bottom, 0)), (max(left, 0), max(right, 0)), (0, 0)]
        return mx.pad(x[..., row0:row0 + kh, col0:col0 + kw, :], [(0, 0)] * (x.ndim - 3) + widths,
                      constant_values=0 if value is None else value)
    index = _pad_index(h, w, top, bottom, left, right, mode)
    lead, c = x.shape[:-3], x.shape[-1]
    flat = mx.take(x.reshape(*lead, h * w, c), index, axis=-2)
    return flat.reshape(*lead, h + top + bottom, w + left + right, c)


def bias_act_pad2d(x: mx.array, bias: mx.array, residual: mx.array | None = None, skip: mx.array | None = None,
                   *, pads: Pads, mode: str = "reflect", activation: str | None = "relu") -> mx.array:
    """A convolution's epilogue written padded for the next convolution: ``pad2d(bias_act(x,
    bias, residual, activation=activation) + skip, pads, mode)`` of an (N, H, W, C) ``x``;
    ``skip`` (x's shape, optional) is added after the activation, as a resnet block's input."""
    y = activations.bias_act(x, bias, residual, activation=activation)
    return pad2d(y if skip is None else y + skip, pads, mode)
