"""Pooling's argument rules and window geometry (PyTorch's), which every face computes from.

Each op's geometry function (``_max_geometry``, ``_avg_geometry``, ``_unpool_size``, ``_sizes``,
``_sppf_axes``) checks a call and returns its windows, so every face refuses the same calls.
Along each spatial axis, an ``Axis`` holds fixed windows (kernel, stride, padding, dilation,
output size) and a ``Windows`` table holds every window's input positions and which of them are
real inputs. 1d ops run the 2d code on (N, 1, L, C).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import mlx.core as mx
import numpy as np

from ...errors import MlxnetError
from ..core.args import as_flag, as_int, as_tuple, one_line, shape_of

IntOrPair = int | Sequence[int]


def as_pair(value: IntOrPair, what: str, op: str, default: tuple[int, int] | None = None,
            one: bool = True) -> tuple[int, int]:
    """PyTorch's 2-d pooling spelling (see :func:`..core.args.as_tuple`); ``default``: what ``()``
    stands for (stride: the kernel size); ``one=False`` refuses 1-tuples (max_unpool2d)."""
    return as_tuple(value, 2, what, op, default, one)  # type: ignore[return-value]


def as_single(value: int | Sequence[int], what: str, op: str, default: int | None = None) -> int:
    """PyTorch's 1-d pooling spelling: an int or a 1-tuple; with a ``default``, also ``()``."""
    return as_tuple(value, 1, what, op, None if default is None else (default,))[0]


def float32_parts(value: int) -> tuple[int, int]:
    """(mantissa, shift) with float32(value) == mantissa * 2**shift exactly, |mantissa| < 2**24:
    an int64 as C converts it to float (round to nearest even), in two int32 kernel params."""
    magnitude = abs(value)
    shift = max(0, magnitude.bit_length() - 24)
    mantissa, rest = divmod(magnitude, 1 << shift)
    half = (1 << shift) >> 1
    if shift and (rest > half or (rest == half and mantissa & 1)):
        mantissa += 1
    if mantissa == 1 << 24:
        mantissa, shift = mantissa >> 1, shift + 1
    return (-mantissa if value < 0 else mantissa), shift


def float32_value(value: int) -> np.float32:
    mantissa, shift = float32_parts(value)
    return np.float32(mantissa * 2.0**shift)


def check_input(x: mx.array, ndim: int, layout: str, op: str, empty_channels: bool = False) -> None:
    """PyTorch's input rule: only the batch axis may be empty (and the channels, where
    ``empty_channels``, as adaptive average pooling allows)."""
    if not isinstance(x, mx.array) or x.ndim != ndim:
        raise MlxnetError(f"{op}: expected a {ndim}-D {layout} array, got shape {shape_of(x)}")
    if not mx.issubdtype(x.dtype, mx.floating):
        raise MlxnetError(f"{op}: expected a floating-point input, got {x.dtype}")
    if 0 in x.shape[1:-1] + (() if empty_channels else x.shape[-1:]):
        raise MlxnetError(f"{op}: only the batch axis may be empty, got shape {x.shape}")


@dataclass(frozen=True)
class Axis:
    """Fixed windows along one spatial axis (PyTorch's pooling rules)."""

    size: int
    kernel: int
    stride: int
    padding: int
    dilation: int
    out: int


def fixed_axis(size: int, kernel: int, stride: int | None, padding: int, dilation: int,
               ceil_mode: bool, op: str) -> Axis:
    """PyTorch's ``pooling_output_shape`` with its argument checks.

    With ceil_mode the last window may run past the padded input, but it must start inside
    the input or the left padding, else it is dropped.
    """
    stride = kernel if stride is None else stride
    if kernel <= 0 or stride <= 0 or dilation <= 0 or padding < 0:
        raise MlxnetError(f"{op}: kernel_size, stride and dilation must be > 0 and padding >= 0, "
                          f"got kernel_size={kernel}, stride={stride}, padding={padding}, "
                          f"dilation={dilation}")
    if padding > kernel // 2:  # PyTorch's rule (undilated kernel), for max and avg alike
        raise MlxnetError(f"{op}: padding should be at most half of the kernel size "
                          f"({kernel // 2}), got {padding}")
    span = dilation * (kernel - 1) + 1
    numerator = size + 2 * padding - span + (stride - 1 if ceil_mode else 0)
    out = numerator // stride + 1
    if ceil_mode and (out - 1) * stride >= size + padding:
        out -= 1
    if out < 1:
        raise MlxnetError(f"{op}: input size {size} is too small for kernel {kernel} "
                          f"(dilation {dilation}, padding {padding}): output size would be {out}")
    return Axis(size, kernel, stride, padding, dilation, out)


@dataclass(frozen=True)
class Windows:
    """The windows along one axis: ``pos[o, k]`` is the input position of slot k of output o,
    ``valid`` says whether it is a real input (not padding, overhang or a ragged tail).
    Fixed windows keep their Axis so the reference can slice the padded input, not gather."""

    pos: np.ndarray
    valid: np.ndarray
    fixed: Axis | None = None


def fixed_windows(a: Axis) -> Windows:
    pos = (np.arange(a.out)[:, None] * a.stride - a.padding
           + np.arange(a.kernel)[None, :] * a.dilation)
    return Windows(pos, (pos >= 0) & (pos < a.size), a)


def avg_divisor(a: Axis, count_include_pad: bool) -> np.ndarray:
    """PyTorch's per-window divisor along one axis (the 2d divisor is the product).

    With count_include_pad the padding counts, but not slots past the padded input
    (ceil-mode overhang); without it only real inputs count.
    """
    start = np.arange(a.out) * a.stride - a.padding
    end = np.minimum(start + a.kernel, a.size + a.padding)
    if count_include_pad:
        return (end - start).astype(np.float32)
    return (np.minimum(end, a.size) - np.maximum(start, 0)).astype(np.float32)


def adaptive_bounds(size: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    """PyTorch's adaptive windows: start = floor(i*size/out), end = ceil((i+1)*size/out)."""
    i = np.arange(out)
    return (i * size) // out, -((-(i + 1) * size) // out)


def adaptive_windows(size: int, out: int) -> Windows:
    start, end = adaptive_bounds(size, out)
    pos = start[:, None] + np.arange(int((end - start).max()))[None, :]
    return Windows(pos, pos < end[:, None])


def adaptive_sizes(shape: tuple[int, int], output_size: Any, op: str) -> tuple[int, int]:
    """Output (oh, ow): an int means square; a pair's None entries keep the input's size.

    As PyTorch: a bare None, 1-tuples and bools are refused (its ``output_size`` is an int or
    exactly two entries), and so are sizes a C int cannot hold.
    """
    kind = "an int or a pair of ints (None: the input's size)"
    if isinstance(output_size, Sequence) and not isinstance(output_size, (str, bytes, bytearray)):
        entries = tuple(output_size)
        if len(entries) != 2:
            raise MlxnetError(f"{op}: output_size must be {kind}, got {one_line(output_size)}")
        sizes = tuple(s if o is None else as_int(o, "each output_size entry", op, 32)
                      for s, o in zip(shape, entries))
    else:
        if output_size is None:
            raise MlxnetError(f"{op}: output_size must be {kind}, got None")
        size = as_int(output_size, "output_size", op, bits=32)
        sizes = (size, size)
    if min(sizes) < 0:
        raise MlxnetError(f"{op}: output sizes must be ints >= 0 or None, got {one_line(output_size)}")
    return sizes  # type: ignore[return-value]


_UNIT = Axis(size=1, kernel=1, stride=1, padding=0, dilation=1, out=1)


def _axes(ndim: int, x: mx.array, kernel_size: Any, stride: Any, padding: Any, dilation: Any,
          ceil_mode: bool, op: str) -> tuple[Axis, Axis]:
    """(rows, cols) window geometry; 1d pooling has a single unit row. PyTorch's spellings: a
    1-tuple stands for an int (both axes in 2d), and ``stride`` None or ``()`` for the kernel
    size."""
    check_input(x, ndim + 2, "NHWC (batch, height, width, channels)" if ndim == 2
                else "NLC (batch, length, channels)", op)
    as_flag(ceil_mode, "ceil_mode", op)
    if ndim == 1:
        k = as_single(kernel_size, "kernel_size", op)
        s = k if stride is None else as_single(stride, "stride", op, default=k)
        cols = fixed_axis(x.shape[1], k, s, as_single(padding, "padding", op),
                          as_single(dilation, "dilation", op), ceil_mode, op)
        return _UNIT, cols
    k = as_pair(kernel_size, "kernel_size", op)
    s = k if stride is None else as_pair(stride, "stride", op, default=k)
    p, d = as_pair(padding, "padding", op), as_pair(dilation, "dilation", op)
    return tuple(fixed_axis(x.shape[1 + i], k[i], s[i], p[i], d[i], ceil_mode, op)
                 for i in range(2))  # type: ignore[return-value]


def _to_2d(x: mx.array, ndim: int) -> mx.array:
    return x if ndim == 2 else x.reshape(x.shape[0], 1, *x.shape[1:])


def _from_2d(out: Any, ndim: int) -> Any:
    if ndim == 2:
        return out
    if isinstance(out, (list, tuple)):
        return tuple(o.squeeze(1) for o in out)
    return out.squeeze(1)


def _single(out: Any) -> mx.array:
    return out[0] if isinstance(out, (list, tuple)) else out


# ---- each op's geometry: the call checked, its windows ------------------------------------

def _max_geometry(ndim: int, x: mx.array, kernel_size: Any, stride: Any = None, padding: Any = 0,
                  dilation: Any = 1, ceil_mode: bool = False,
                  return_indices: bool = False) -> tuple[Axis, Axis, bool]:
    rows, cols = _axes(ndim, x, kernel_size, stride, padding, dilation, ceil_mode,
                       f"max_pool{ndim}d")
    return rows, cols, return_indices


def _avg_geometry(ndim: int, x: mx.array, kernel_size: Any, stride: Any = None, padding: Any = 0,
                  ceil_mode: bool = False, count_include_pad: bool = True,
                  divisor_override: Any = None) -> tuple[Axis, Axis, bool, int | None]:
    op = f"avg_pool{ndim}d"
    rows, cols = _axes(ndim, x, kernel_size, stride, padding, 1, ceil_mode, op)
    as_flag(count_include_pad, "count_include_pad", op)
    if divisor_override is not None:
        # PyTorch takes any nonzero int64 (not a bool or a float) and divides by its float value.
        divisor_override = as_int(divisor_override, "divisor_override", op)
        if divisor_override == 0:
            raise MlxnetError(f"{op}: divisor_override must not be zero, got 0")
    return rows, cols, count_include_pad, divisor_override


def _unpool_size(x: mx.array, indices: mx.array, kernel_size: IntOrPair,
                 stride: IntOrPair | None = None, padding: IntOrPair = 0,
                 output_size: Sequence[int] | None = None) -> tuple[int, int]:
    """PyTorch's default (H-1)*stride - 2*padding + kernel, or a checked output_size.

    As PyTorch's F.max_unpool2d: kernel_size, stride and padding are ints or pairs (no
    1-tuples, and any int: only the output size is checked, >= 0); output_size is (H, W) or,
    PyTorch's (N, C, H, W) spelling, four ints of which the last two count.
    """
    op = "max_unpool2d"
    check_input(x, 4, "NHWC (batch, height, width, channels)", op)
    if not isinstance(indices, mx.array) or indices.shape != x.shape:
        raise MlxnetError(f"{op}: indices must have the input's shape {x.shape}, got {shape_of(indices)}")
    if not mx.issubdtype(indices.dtype, mx.integer):
        raise MlxnetError(f"{op}: indices must be integers, got {indices.dtype}")
    k = as_pair(kernel_size, "kernel_size", op, one=False)
    s = k if stride is None else as_pair(stride, "stride", op, one=False)
    p = as_pair(padding, "padding", op, one=False)
    default = tuple((x.shape[1 + i] - 1) * s[i] - 2 * p[i] + k[i] for i in range(2))
    if output_size is None:
        size = default
    else:
        if not isinstance(output_size, Sequence) or isinstance(output_size, (str, bytes)) \
                or len(output_size) not in (2, 4):
            raise MlxnetError(f"{op}: output_size must be 2 or 4 ints (H, W or N, C, H, W), "
                              f"got {one_line(output_size)}")
        size = tuple(as_int(v, "each output_size entry", op, bits=32) for v in output_size)[-2:]
        for i in range(2):
            if not default[i] - s[i] < size[i] < default[i] + s[i]:
                raise MlxnetError(f"{op}: output_size {tuple(size)} must lie strictly between "
                                  f"{tuple(d - t for d, t in zip(default, s))} and "
                                  f"{tuple(d + t for d, t in zip(default, s))}")
    if min(size) < 0:
        raise MlxnetError(f"{op}: output size must be >= 0, got {tuple(size)} (kernel_size {k}, "
                          f"stride {s}, padding {p})")
    return size  # type: ignore[return-value]


OutputSize = int | None | tuple[int | None, int | None]


def _sizes(x: mx.array, output_size: OutputSize, op: str) -> tuple[int, int]:
    check_input(x, 4, "NHWC (batch, height, width, channels)", op, empty_channels=op.startswith("adaptive_avg"))
    return adaptive_sizes(x.shape[1:3], output_size, op)


def _sppf_axes(x: mx.array) -> tuple:
    check_input(x, 4, "NHWC (batch, height, width, channels)", "sppf_pool")
    return tuple(fixed_axis(size, 5, 1, 2, 1, False, "sppf_pool")
                 for size in x.shape[1:3])
