"""Small helpers shared by tests."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import mlx.core as mx
import numpy as np

TOLERANCE = {mx.float32: 1e-5, mx.float16: 2e-3, mx.bfloat16: 2e-2}


def to_numpy(x: mx.array) -> np.ndarray:
    return np.array(x.astype(mx.float32))


def assert_close(actual: mx.array, expected, dtype=mx.float32, scale: float = 1.0) -> None:
    """Relative-to-magnitude closeness; tolerance by dtype (fp32 tight, fp16/bf16 looser)."""
    a = to_numpy(actual)
    e = expected if isinstance(expected, np.ndarray) else to_numpy(expected)
    assert a.shape == e.shape, f"shape {a.shape} != {e.shape}"
    tol = TOLERANCE[dtype] * scale
    np.testing.assert_allclose(a, e, rtol=tol, atol=tol * max(1.0, float(np.abs(e).max(initial=0))))


def make_hub_cache(root: Path, repo: str, filename: str, data: bytes) -> Path:
    """huggingface_hub's cache layout: models--ORG--NAME/{refs/main, blobs/<sha256>,
    snapshots/<commit>/<file> -> ../../blobs/<sha256>}."""
    base = root / ("models--" + repo.replace("/", "--"))
    commit = hashlib.sha1(data).hexdigest()
    blob = base / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True)
    blob.write_bytes(data)
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(commit)
    snap = base / "snapshots" / commit / filename
    snap.parent.mkdir(parents=True)
    snap.symlink_to(os.path.relpath(blob, snap.parent))
    return snap
