"""Transposed-convolution layers (PyTorch arguments, MLX weight layout, NLC / NHWC data)."""
from __future__ import annotations

import math
from typing import Sequence

import mlx.core as mx
import mlx.nn as nn

from .. import ops
from ..errors import MlxnetError
from ..ops.core.args import as_tuple


def _ntuple(name: str, value: int | Sequence[int], nd: int) -> tuple[int, ...]:
    return as_tuple(value, nd, name, f"ConvTranspose{nd}d")


class _ConvTransposeNd(nn.Module):
    nd = 0

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int],
                 stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
                 output_padding: int | Sequence[int] = 0, groups: int = 1, bias: bool = True,
                 dilation: int | Sequence[int] = 1) -> None:
        super().__init__()
        nd = self.nd
        if groups < 1 or in_channels % groups or out_channels % groups:
            raise MlxnetError(f"ConvTranspose{nd}d: groups must divide in_channels={in_channels} and "
                              f"out_channels={out_channels}, got groups={groups}")
        kernel = _ntuple("kernel_size", kernel_size, nd)
        self.stride = _ntuple("stride", stride, nd)
        self.padding = _ntuple("padding", padding, nd)
        self.output_padding = _ntuple("output_padding", output_padding, nd)
        self.dilation = _ntuple("dilation", dilation, nd)
        self.groups = groups
        # PyTorch's default init: uniform(±1/sqrt(fan_in)), fan_in = C_out/groups * prod(kernel)
        # (PyTorch computes it from its (C_in, C_out/groups, *kernel) weight).
        bound = 1.0 / math.sqrt(out_channels // groups * math.prod(kernel))
        self.weight = mx.random.uniform(-bound, bound, (out_channels, *kernel, in_channels // groups))
        if bias:
            self.bias = mx.random.uniform(-bound, bound, (out_channels,))

    def _extra_repr(self) -> str:
        c_out, *kernel, c_in_g = self.weight.shape
        return (f"{c_in_g * self.groups}, {c_out}, kernel_size={tuple(kernel)}, stride={self.stride}, "
                f"padding={self.padding}, output_padding={self.output_padding}, "
                f"dilation={self.dilation}, groups={self.groups}, bias={'bias' in self}")

    def __call__(self, x: mx.array) -> mx.array:
        op = ops.conv_transpose1d if self.nd == 1 else ops.conv_transpose2d
        # bias positional: positional arrays are the differentiable inputs of an op.
        return op(x, self.weight, self.get("bias"), stride=self.stride, padding=self.padding,
                  output_padding=self.output_padding, dilation=self.dilation, groups=self.groups)


class ConvTranspose1d(_ConvTransposeNd):
    """Like ``torch.nn.ConvTranspose1d`` on NLC input; weight (C_out, K, C_in/groups)."""

    nd = 1


class ConvTranspose2d(_ConvTransposeNd):
    """Like ``torch.nn.ConvTranspose2d`` on NHWC input; weight (C_out, KH, KW, C_in/groups)."""

    nd = 2
