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
from mlx.utils import tree_map

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


def _all_sum(x: mx.array) -> mx.array:
    try:  # the ring, MPI and JACCL back ends run on the CPU stream, whatever the default device
        return mx.distributed.all_sum(x, group=group(), stream=mx.cpu)
    except (RuntimeError, ValueError):  # NCCL runs on the GPU's
        return mx.distributed.all_sum(x, group=group())


@mx.custom_function
def _summed(x: mx.array) -> mx.array:
    return _all_sum(x)


@_summed.vjp
def _summed_vjp(primals: mx.array, cotangent: mx.array, output: mx.array) -> mx.array:
    # Every rank's loss reads the sum, so x's gradient is the sum of every rank's cotangent
    # (MLX's own all_sum passes each rank's cotangent through unchanged).
    return _all_sum(cotangent)


def all_sum(x: mx.array) -> mx.array:
    """``x`` summed over the ranks, lazily (the identity in a group of one). Differentiable as a
    sum that every rank's loss reads: its gradient is the cotangents summed over the ranks."""
    if size() == 1:
        return x
    return _summed(x)


def sum_over_ranks(tree: Tree) -> Tree:
    """The sum of ``tree``'s arrays over the ranks (:func:`average` times the size); a nested
    tree (MLX's tree utilities read a flat dict's dotted keys as paths)."""
    if size() == 1:
        return tree
    n = size()
    return tree_map(lambda a: a * n, average(tree))


def average(tree: Tree) -> Tree:
    """The mean of ``tree``'s arrays over the ranks (gradients, BatchNorm statistics), through
    ``mlx.nn.average_gradients``: it packs small arrays into a few large all-reduces."""
    return nn.average_gradients(tree, group=group())


def barrier() -> None:
    """Wait until every rank gets here (``mlx.launch`` stops the others as soon as one rank
    exits with an error: what rank 0 still has to say must be said before)."""
    total(0.0)
