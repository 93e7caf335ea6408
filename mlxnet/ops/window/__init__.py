"""Window partition and merge for windowed attention (Swin, TinyViT): an NHWC map zero-padded
to whole windows and cut into (windows, window², C) tiles, and back. The definitions pad,
reshape and transpose; on GPUs each is one copy kernel (custom_kernels/window.kern) instead of
a pad (a fill and a copy) and a transposing copy.
"""
from __future__ import annotations

import mlx.core as mx

from ..core.registry import register
from . import check, definition, kernel


def _partition_example() -> tuple[tuple, dict]:
    return (mx.random.normal((2, 9, 11, 8)), 4), {}


def _partition_edges() -> list[tuple[tuple, dict]]:
    return [((mx.random.normal((1, 1, 2, 1)), 2), {}), ((mx.random.normal((1, 5, 3, 3)), 2), {}),
            ((mx.zeros((0, 4, 4, 3)), 2), {})]


def _merge_example() -> tuple[tuple, dict]:
    return (mx.random.normal((2 * 3 * 3, 16, 8)), 4, 9, 11), {}


def _merge_edges() -> list[tuple[tuple, dict]]:
    return [((mx.random.normal((1, 4, 1)), 2, 1, 2), {}), ((mx.random.normal((6, 4, 3)), 2, 5, 3), {}),
            ((mx.zeros((0, 4, 3)), 2, 4, 4), {})]


window_partition = register("window_partition", kernel=kernel.window_partition, sources=(kernel.PARTITION,),
                            check=check.window_partition, example=_partition_example,
                            edge_examples=_partition_edges)(definition.window_partition)
window_merge = register("window_merge", kernel=kernel.window_merge, sources=(kernel.MERGE,),
                        check=check.window_merge, example=_merge_example,
                        edge_examples=_merge_edges)(definition.window_merge)

__all__ = ["window_partition", "window_merge"]
