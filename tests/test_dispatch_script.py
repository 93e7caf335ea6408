"""scripts/bench/bench_dispatch.py: the host cost per op, MLX's side on whatever device this is
(the CPU here) and PyTorch's CUDA side where PyTorch has CUDA."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench" / "bench_dispatch.py"


def _script():
    spec = importlib.util.spec_from_file_location("bench_dispatch", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_chains_are_timed_per_op(monkeypatch):
    import mlx.core as mx

    if mx.cuda.is_available() or mx.metal.is_available():
        monkeypatch.setenv("BENCH_DEVICE", "gpu")
    else:
        monkeypatch.setenv("BENCH_DEVICE", "cpu")
    out = _script().child([], [1], ["float16"])
    for key in ("us_per_add", "us_per_conv", "us_per_conv_compiled"):
        assert 0 < out[key] < 1e6, (key, out)
    try:
        import torch
        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    assert ("torch_us_per_conv" in out) == cuda  # PyTorch's side only where it has CUDA
    if cuda:
        assert 0 < out["torch_us_per_conv_graph"] < 1e6 and 0 < out["torch_us_per_conv"] < 1e6
