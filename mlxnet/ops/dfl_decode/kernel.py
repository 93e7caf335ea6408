"""dfl_decode's GPU kernel (custom_kernels/dfl_decode.kern): the whole decoding in one pass that
reads each level's maps where they are; the definition past the kernel's limits."""
from __future__ import annotations

from typing import Sequence

import mlx.core as mx

from ..core.kernel_source import PortableKernel, int_params
from . import definition
from .definition import _levels

MAX_LEVELS = 4  # the kernel's level slots (YOLOv8 has 3; its P2 and P6 variants 4)
_GROUP = 256

DFL_DECODE = PortableKernel("dfl_decode.kern", "dfl_decode",
                            ["v", "b0", "c0", "b1", "c1", "b2", "c2", "b3", "c3", "p"], ["out"])


def dfl_decode(bin_values: mx.array, *maps: mx.array, strides: Sequence[int]) -> mx.array:
    levels = _levels(bin_values, maps, strides)
    n, nc, bins = maps[0].shape[0], maps[1].shape[-1], bin_values.size
    anchors = sum(box.shape[1] * box.shape[2] for box, _, _ in levels)
    cols = 4 + nc
    largest = max([n * anchors * cols] + [m.size for m in maps])
    if len(levels) > MAX_LEVELS or largest >= 2**31 - _GROUP or n > 65535:
        return definition.dfl_decode(bin_values, *maps, strides=strides)
    dtype = maps[0].dtype
    placeholder = mx.zeros((1,), dtype)
    inputs, params = [bin_values.astype(mx.float32)], [n, nc, bins]
    for slot in range(MAX_LEVELS):
        if slot < len(levels):
            box, cls, stride = levels[slot]
            inputs += [box.astype(dtype), cls.astype(dtype)]
            params += [box.shape[1] * box.shape[2], box.shape[2], stride]
        else:
            inputs += [placeholder, placeholder]
            params += [0, 1, 1]
    (out,) = DFL_DECODE(inputs + [int_params(tuple(params))], template=[("T", dtype)],
                        grid=(anchors * cols, n, 1), threadgroup=(_GROUP, 1, 1),
                        output_shapes=[(n, anchors, cols)], output_dtypes=[mx.float32])
    return out
