"""conv2d's argument check (the registry's ``check``) and the argument helpers its faces share:
PyTorch's spellings of stride, padding and dilation, the groups and activation rules, the
output size."""
from __future__ import annotations

import mlx.core as mx

from ...errors import MlxnetError
from ..core.args import as_tuple, shape_of

Pair = tuple[int, int]


def _pair(v: int | tuple[int, ...], what: str = "stride, padding and dilation") -> Pair:
    return as_tuple(v, 2, what, "conv2d")  # type: ignore[return-value]


def _check_groups(x: mx.array, weight: mx.array, groups: int) -> None:
    c, (c_out, c_in_g) = x.shape[-1], (weight.shape[0], weight.shape[-1])
    if c_in_g * groups != c or c_out % groups:
        raise MlxnetError(f"conv2d: weight {tuple(weight.shape)} with groups={groups} does not fit "
                          f"an input of {c} channels")


ACTIVATIONS = (None, "silu", "relu")


def _check_activation(activation: str | None) -> None:
    if activation not in ACTIVATIONS:
        raise MlxnetError(f"conv2d: activation must be None, 'silu' or 'relu', got {activation!r}")


def _out_size(x: mx.array, weight: mx.array, stride: Pair, padding: Pair, dilation: Pair) -> Pair:
    return tuple((x.shape[1 + a] + 2 * padding[a] - dilation[a] * (weight.shape[1 + a] - 1) - 1) // stride[a] + 1
                 for a in (0, 1))  # type: ignore[return-value]


PADDING_MODES = ("same", "valid")


def conv2d(x: mx.array, weight: mx.array, bias: mx.array | None = None, residual: mx.array | None = None, *,
           stride: int | Pair = 1, padding: int | Pair | str = 0, dilation: int | Pair = 1,
           groups: int = 1, activation: str | None = None) -> tuple:
    """PyTorch's conv2d rules, once for every face: NHWC x and OHWI weight, ints or pairs
    (a 1-tuple repeats) with stride, dilation ≥ 1 and padding ≥ 0 or "same" / "valid", a
    (C_out,) bias, an output of at least one pixel, a residual of the output's shape. "same"
    with an even dilated kernel pads one more pixel after than before, as PyTorch does: that
    pixel is added to x here."""
    if not (isinstance(x, mx.array) and isinstance(weight, mx.array) and x.ndim == 4 and weight.ndim == 4):
        raise MlxnetError(f"conv2d: expected NHWC x and OHWI weight of 4 dimensions, got "
                          f"{shape_of(x)} and {shape_of(weight)}")
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        raise MlxnetError(f"conv2d: groups must be a positive int, got {groups!r}")
    _check_groups(x, weight, groups)
    _check_activation(activation)
    if bias is not None and (not isinstance(bias, mx.array) or bias.shape != weight.shape[:1]):
        raise MlxnetError(f"conv2d: bias must have shape ({weight.shape[0]},), got {shape_of(bias)}")
    stride, dilation = _pair(stride, "stride"), _pair(dilation, "dilation")
    if min(stride) < 1 or min(dilation) < 1:
        raise MlxnetError(f"conv2d: stride and dilation must be >= 1, got stride={stride}, dilation={dilation}")
    if isinstance(padding, str):
        if padding not in PADDING_MODES:
            raise MlxnetError(f"conv2d: padding must be an int, a pair or one of 'same', 'valid'; got {padding!r}")
        if padding == "same" and stride != (1, 1):
            raise MlxnetError(f"conv2d: padding='same' needs stride 1, got stride={stride}")
        spans = [dilation[a] * (weight.shape[1 + a] - 1) for a in (0, 1)]
        extra = [span % 2 if padding == "same" else 0 for span in spans]
        padding = (0, 0) if padding == "valid" else (spans[0] // 2, spans[1] // 2)
        if any(extra):
            x = mx.pad(x, [(0, 0), (0, extra[0]), (0, extra[1]), (0, 0)])
    padding = _pair(padding, "padding")
    if min(padding) < 0:
        raise MlxnetError(f"conv2d: padding must be >= 0, got {padding}")
    out = _out_size(x, weight, stride, padding, dilation)
    if min(out) < 1:
        raise MlxnetError(f"conv2d: a {x.shape[1]}×{x.shape[2]} input padded by {padding} is smaller than "
                          f"the dilated kernel {tuple(weight.shape[1:3])} (dilation {dilation})")
    if residual is not None:
        shape = (x.shape[0], *out, weight.shape[0])
        if not isinstance(residual, mx.array) or tuple(residual.shape) != shape:
            raise MlxnetError(f"conv2d: residual must have the output's shape {shape}, got {shape_of(residual)}")
    # the residual is a positional array input (differentiable), after the bias (None if absent)
    if residual is not None:
        args = (x, weight, bias, residual)
    else:
        args = (x, weight) if bias is None else (x, weight, bias)
    return args, dict(stride=stride, padding=padding, dilation=dilation, groups=groups, activation=activation)


def depthwise_conv2d(x: mx.array, weight: mx.array, bias: mx.array | None = None, *,
                     stride: int | Pair = 1, padding: int | Pair | str = 0, dilation: int | Pair = 1) -> tuple:
    """conv2d's rules with groups = the input's channels and one filter per channel."""
    channels = x.shape[-1] if isinstance(x, mx.array) and x.ndim == 4 else 0
    if isinstance(weight, mx.array) and weight.ndim == 4 and (weight.shape[0] != channels or weight.shape[-1] != 1):
        raise MlxnetError(f"depthwise_conv2d: weight must be (C, KH, KW, 1) for an input of C={channels} "
                          f"channels, got {tuple(weight.shape)}")
    args, params = conv2d(x, weight, bias, stride=stride, padding=padding, dilation=dilation,
                          groups=max(channels, 1))
    del params["groups"], params["activation"]
    return args, params
