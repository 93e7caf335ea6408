"""Transposed convolution's plan: every argument checked against PyTorch's rules, and the output
geometry each face computes from (one ``TransposedAxis`` per spatial axis)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import mlx.core as mx

from ...errors import MlxnetError
from ..core.args import as_tuple

IntOrTuple = int | Sequence[int]


@dataclass(frozen=True)
class TransposedAxis:
    """One spatial axis of a transposed convolution (PyTorch semantics)."""

    size: int
    kernel: int
    stride: int
    padding: int
    output_padding: int
    dilation: int

    @property
    def out(self) -> int:
        return ((self.size - 1) * self.stride - 2 * self.padding
                + self.dilation * (self.kernel - 1) + self.output_padding + 1)

    def tap(self, k: int) -> tuple[int, int]:
        """(input shift a, output phase r) of kernel tap k."""
        return divmod(k * self.dilation, self.stride)

    @property
    def shifts(self) -> int:
        return self.dilation * (self.kernel - 1) // self.stride + 1

    @property
    def first(self) -> int:
        """First phase-grid position m whose output survives the padding crop."""
        return self.padding // self.stride

    @property
    def count(self) -> int:
        """Phase-grid positions computed per phase."""
        return (self.padding + self.out - 1) // self.stride + 1 - self.first

    @property
    def crop(self) -> int:
        return self.padding - self.first * self.stride

    @property
    def pad_lo(self) -> int:
        """Zero padding before the input (negative: crop) so every shifted read starts at >= 0."""
        return self.shifts - 1 - self.first

    @property
    def span(self) -> int:
        """Padded input length: phase output i reads padded input i + (shifts - 1 - a)."""
        return self.count + self.shifts - 1


@dataclass(frozen=True)
class Plan:
    axes: tuple[TransposedAxis, ...]
    groups: int
    c_in: int
    c_out: int


def _tuple(name: str, value: IntOrTuple, nd: int) -> tuple[int, ...]:
    return as_tuple(value, nd, name, f"conv_transpose{nd}d")


def plan(x: mx.array, weight: mx.array, bias: mx.array | None, nd: int, stride: IntOrTuple,
         padding: IntOrTuple, output_padding: IntOrTuple, dilation: IntOrTuple, groups: int) -> Plan:
    """Check every argument against PyTorch's rules; one-line MlxnetError naming expected vs got."""
    op = f"conv_transpose{nd}d"
    layout = "NLC" if nd == 1 else "NHWC"
    if x.ndim != nd + 2:
        raise MlxnetError(f"{op}: input must be {nd + 2}-D {layout}, got shape {tuple(x.shape)}")
    if weight.ndim != nd + 2:
        raise MlxnetError(f"{op}: weight must be {nd + 2}-D (C_out, *kernel, C_in/groups), "
                          f"got shape {tuple(weight.shape)}")
    s, p, op_, d = (_tuple(n, v, nd) for n, v in (("stride", stride), ("padding", padding),
                                                  ("output_padding", output_padding),
                                                  ("dilation", dilation)))
    if min(s) < 1 or min(d) < 1 or min(p) < 0 or min(op_) < 0:
        raise MlxnetError(f"{op}: expected stride >= 1, dilation >= 1, padding >= 0, output_padding >= 0;"
                          f" got stride={s}, dilation={d}, padding={p}, output_padding={op_}")
    for i in range(nd):
        if op_[i] >= max(s[i], d[i]):
            raise MlxnetError(f"{op}: output_padding must be smaller than stride or dilation, "
                              f"got output_padding={op_[i]}, stride={s[i]}, dilation={d[i]}")
    c_in, c_out = x.shape[-1], weight.shape[0]
    if not isinstance(groups, int) or groups < 1 or c_in % groups or c_out % groups:
        raise MlxnetError(f"{op}: groups must divide C_in={c_in} and C_out={c_out}, got groups={groups}")
    if weight.shape[-1] != c_in // groups:
        raise MlxnetError(f"{op}: weight's last axis must be C_in/groups={c_in // groups}, "
                          f"got weight shape {tuple(weight.shape)}")
    if bias is not None and tuple(bias.shape) != (c_out,):
        raise MlxnetError(f"{op}: bias must have shape ({c_out},), got {tuple(bias.shape)}")
    axes = tuple(TransposedAxis(x.shape[1 + i], weight.shape[1 + i], s[i], p[i], op_[i], d[i]) for i in range(nd))
    if min(a.out for a in axes) < 1:
        raise MlxnetError(f"{op}: output size {tuple(a.out for a in axes)} is not positive for input "
                          f"{tuple(x.shape)}, kernel {tuple(weight.shape[1:-1])}, padding {p}")
    return Plan(axes, groups, c_in, c_out)


def as_2d(x: mx.array, weight: mx.array, p: Plan) -> tuple[mx.array, mx.array, Plan]:
    """View a 1-D problem (NLC) as 2-D (N, 1, L, C) with a 1×K kernel."""
    if len(p.axes) == 2:
        return x, weight, p
    unit = TransposedAxis(1, 1, 1, 0, 0, 1)
    return (x[:, None], weight[:, None], Plan((unit, p.axes[0]), p.groups, p.c_in, p.c_out))
