"""Deterministic random weights for a PyTorch-keyed state dict (numpy only).

Golden-output scripts (run where the reference PyTorch code lives) and mlxnet's tests call
this with the same key → shape table and seed and get bit-identical weights, so fixtures
need to hold only inputs and outputs. Each tensor's values depend on (seed, key) alone.
This module imports nothing but numpy, so scripts can load it by file path.
"""
from __future__ import annotations

import re
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


def seeded_yolo_state(shapes: Iterable[tuple[str, tuple[int, ...]]], seed: int, bn_gain: float,
                      head_gain: float) -> dict[str, np.ndarray]:
    """:func:`seeded_state_dict` for an ultralytics YOLO (its keys), made to give spread-out
    outputs: a DFL conv at its fixed 0..bins-1 ramp, BatchNorm scales × ``bn_gain`` and the
    head's output convs (both heads' of an end-to-end model) × ``head_gain``. With plain seeded
    tensors the features shrink layer by layer and every score sits within 1e-6 of 0.5, so NMS
    order would hinge on rounding."""
    state = seeded_state_dict(shapes, seed)
    for k in state:
        if re.fullmatch(r"model\.\d+\.dfl\.conv\.weight", k):
            bins = state[k].shape[1]
            state[k] = np.arange(bins, dtype=np.float32).reshape(1, bins, 1, 1)
        elif k.endswith(".bn.weight"):
            state[k] = state[k] * np.float32(bn_gain)
        elif re.fullmatch(r"model\.\d+\.(one2one_)?cv[23]\.\d\.2\.weight", k):
            state[k] = state[k] * np.float32(head_gain)
    return state
