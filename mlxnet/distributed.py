"""Several processes as one job, on MLX's distributed engine (``mx.distributed``).

A program started by ``mlx.launch -n N ...`` (ring over TCP, MPI, NCCL on CUDA, JACCL over
Thunderbolt) finds its rank and the job's size here; started plainly it is rank 0 of 1 and
every helper is the identity. mlxnet adds no communication of its own: sums go through
``mx.distributed.all_sum``, gradients through ``mlx.nn.average_gradients``.

Nothing is initialised on import: the group is created by the first call that needs it.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence, TypeVar

import mlx.core as mx
import mlx.nn as nn

Item = TypeVar("Item")
Tree = TypeVar("Tree")


@lru_cache(maxsize=1)
def group() -> mx.distributed.Group:
    """This process's group: the job ``mlx.launch`` started, else a group of one."""
    return mx.distributed.init()


def rank() -> int:
    return group().rank()


def size() -> int:
    return group().size()


def is_main() -> bool:
    """Whether this process writes the job's files and logs (rank 0)."""
    return rank() == 0


def shard(items: Sequence[Item]) -> list[Item]:
    """This rank's share of ``items``: every size-th one from its rank on (shares differ by at
    most one item, and together they are ``items``)."""
    return list(items[rank()::size()])


def total(value: float) -> float:
    """``value`` summed over the ranks (every rank must call it)."""
    if size() == 1:
        return value
    x = mx.array(value, dtype=mx.float32)
    try:  # the ring, MPI and JACCL back ends run on the CPU stream, whatever the default device
        return mx.distributed.all_sum(x, group=group(), stream=mx.cpu).item()
    except (RuntimeError, ValueError):  # NCCL runs on the GPU's
        return mx.distributed.all_sum(x, group=group()).item()


def average(tree: Tree) -> Tree:
    """The mean of ``tree``'s arrays over the ranks (gradients, BatchNorm statistics), through
    ``mlx.nn.average_gradients``: it packs small arrays into a few large all-reduces."""
    return nn.average_gradients(tree, group=group())


def barrier() -> None:
    """Wait until every rank gets here (``mlx.launch`` stops the others as soon as one rank
    exits with an error: what rank 0 still has to say must be said before)."""
    total(0.0)
