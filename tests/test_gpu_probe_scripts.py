"""scripts/bench/bench_depthwise.py and mlx_small_pool.py: CUDA-only measurements, refused with
a clear message elsewhere; on a CUDA GPU they run and report per-kernel times."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import mlx.core as mx
import pytest

BENCH = Path(__file__).resolve().parents[1] / "scripts" / "bench"


def _script(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


@pytest.mark.parametrize("name", ["bench_depthwise", "mlx_small_pool"])
def test_refused_without_cuda(name, capsys):
    if mx.cuda.is_available():
        pytest.skip("this machine has MLX's CUDA build")
    pytest.importorskip("torch")
    assert _script(name).main([]) == 2
    assert "needs MLX's CUDA build" in capsys.readouterr().err


def _needs_cuda_profiler() -> None:
    if not mx.cuda.is_available():
        pytest.skip("CUDA-only measurements")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch without CUDA: no CUPTI profiler")


@pytest.mark.gpu
def test_depthwise_bench_reports_every_shape(gpu, tmp_path):
    _needs_cuda_profiler()
    out = tmp_path / "depthwise.json"
    assert _script("bench_depthwise").main(["--reps", "2", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 7
    for row in rows:
        assert row["max_abs_diff"] < 0.05 and min(row["mlx_us"], row["mlxnet_us"], row["torch_us"]) > 0, row


@pytest.mark.gpu
def test_small_pool_reproduction_times_each_launch(gpu, capsys):
    _needs_cuda_profiler()
    assert _script("mlx_small_pool").main(["--reps", "3"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "µs per launch" in line]
    assert len(lines) == 3 and all(float(line.split()[-4]) > 0 for line in lines), lines
