"""Deterministic random weights for a PyTorch-keyed state dict (numpy only).

Golden-output scripts (run where the reference PyTorch code lives) and mlxnet's tests call
this with the same key → shape table and seed and get bit-identical weights, so fixtures
need to hold only inputs and outputs. Each tensor's values depend on (seed, key) alone.
This module imports nothing but numpy, so scripts can load it by file path.
"""
from __future__ import annotations

import zlib
from typing import Iterable

import numpy as np


def seeded_tensor(key: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(key.encode())])
    leaf = key.rsplit(".", 1)[-1]
    if leaf == "running_var":
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    if leaf == "running_mean" or leaf == "bias":
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    if len(shape) <= 1:  # norm scales and other vectors; < 1 so deep residual stacks stay finite
        return rng.uniform(0.2, 0.6, shape).astype(np.float32)
    fan_in = int(np.prod(shape[1:]))  # PyTorch layouts: (out, in, *kernel)
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)


def seeded_state_dict(shapes: Iterable[tuple[str, tuple[int, ...]]], seed: int) -> dict[str, np.ndarray]:
    """Float tensors for each (key, shape); integer buffers (num_batches_tracked) are left out."""
    return {k: seeded_tensor(k, tuple(s), seed) for k, s in shapes}
