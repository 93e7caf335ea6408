"""scripts/bench/gpu_kernels_memory.py: its orchestration (a process per row and side, the JSON,
the issue's table, failed and timed-out sides as cells) run on the CPU through --dry-run, and
its refusal without CUDA. The GPU figures themselves need an NVIDIA GPU."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench" / "gpu_kernels_memory.py"


def _script():
    spec = importlib.util.spec_from_file_location("gpu_kernels_memory", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # import-safe: nothing runs, CUDA or not
    return module


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout)


def test_rows_and_sides_planned():
    gkm = _script()
    quick = gkm.planned_rows(gkm.parse_args(["--quick"]))
    assert quick == ["resnet50:1:float16", "yolov8n:1:float16", "sam-tiny-encoder:1:float16"]
    assert gkm.planned_rows(gkm.parse_args([])) == quick
    full = gkm.planned_rows(gkm.parse_args(["--full"]))
    assert len(full) == 20 and "lama-512:8:float32" in full
    args = gkm.parse_args(["--rows", "yolov8m:8:float16", "resnet50:1:float32"])
    assert gkm.planned_rows(args) == ["yolov8m:8:float16", "resnet50:1:float32"]
    # reduce-overhead is timed at batch 1 only, where the host's launches bound the forward
    assert gkm.planned_sides(args, "yolov8m:8:float16") == ["mlxnet", "mlxnet-low", "mlxnet-min", "eager", "compile"]
    assert gkm.planned_sides(args, "resnet50:1:float32") == list(gkm.SIDES)
    with pytest.raises(SystemExit):
        gkm.planned_rows(gkm.parse_args(["--rows", "resnet50-1-float16"]))
    with pytest.raises(SystemExit):
        gkm.planned_sides(gkm.parse_args(["--sides", "mlxnet,jax"]), "resnet50:1:float16")


def test_without_cuda_one_line_and_exit_2():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA here: the script would measure")
    result = _run("--quick", timeout=120)
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and "--dry-run" in result.stderr


@pytest.mark.slow  # several child processes of the benchmark script: 16 s on 2 cores
def test_dry_run_rows_json_table_and_a_failed_side(tmp_path):
    out = tmp_path / "report.json"
    result = _run("--dry-run", "--rows", "resnet18:1:float32", "--sides", "mlxnet,mlxnet-low,mlxnet-min,eager,compile,compile-ro",
                  "--compile-backend", "eager", "--reps", "2", "--warmup", "1", "--fail-side", "eager",
                  "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["dry_run"] is True and report["machine"]["device"] == "cpu" and report["machine"]["torch"]
    (row,) = report["rows"]
    assert row["row"] == "resnet18:1:float32"
    sides = {s["side"]: s for s in row["sides"]}
    assert list(sides) == ["mlxnet", "mlxnet-low", "mlxnet-min", "eager", "compile", "compile-ro"]
    assert sides["compile-ro"]["wall_ms"] > 0, sides["compile-ro"]
    mlx, low, eager, compiled = sides["mlxnet"], sides["mlxnet-low"], sides["eager"], sides["compile"]
    assert low["weights_bytes"] == mlx["weights_bytes"] and low["peak_bytes"] > low["resident_bytes"]
    # waiting for each kernel: nothing queued holds a dead intermediate (MLX's CPU queue too)
    least = sides["mlxnet-min"]
    assert least["resident_bytes"] < least["peak_bytes"] < mlx["peak_bytes"], (least, mlx)
    # MLX's peak of one forward holds the resident weights (ResNet-18: 45 MB in float32) once
    assert 40 * 2**20 < mlx["weights_bytes"] < 50 * 2**20
    assert mlx["weights_bytes"] <= mlx["resident_bytes"] < mlx["peak_bytes"] < 3 * mlx["resident_bytes"]
    assert mlx["wall_ms"] > 0 and mlx["kernel_ms"] is None and mlx["kernels"] is None
    assert eager["error"] == "RuntimeError: deliberate failure of eager (--fail-side)"
    assert compiled["wall_ms"] > 0 and compiled["peak_bytes"] is None  # no CPU peak from PyTorch
    assert compiled["weights_bytes"] == pytest.approx(mlx["weights_bytes"], rel=0.01)
    # the table: printed last and kept in the JSON, the columns, the failure as a cell
    lines = result.stdout.strip().splitlines()
    table = [line for line in lines if line.startswith("|")]
    assert table == report["table"].splitlines() and lines[-3:] == table
    assert table[0].startswith("| row | GPU kernel ms per forward: mlxnet / eager / compile |")
    cells = [c.strip() for c in table[2].strip("|").split("|")]
    assert len(cells) == 6 and cells[0] == "resnet18 b1 fp32"
    kernel_ms, _, peak, wall, weights = cells[1:]
    failed = "failed: RuntimeError: deliberate failure of eager (--fail-side)"
    assert kernel_ms == f"n/a (no CUDA) / {failed} / n/a (no CUDA)"
    assert peak.split(" / ")[:2] == [f"{mlx['peak_bytes'] / 2**20:.0f}", f"{low['peak_bytes'] / 2**20:.0f}"]
    assert wall == f"{mlx['wall_ms']:.2f} / {sides['compile-ro']['wall_ms']:.2f}"
    assert weights == "45 / 45"
    # progress lines, timestamped, for each side's process
    assert "resnet18:1:float32 compile: warm" in result.stderr


def test_a_side_past_its_time_limit_is_a_cell(tmp_path):
    out = tmp_path / "report.json"
    result = _run("--dry-run", "--rows", "resnet18:1:float32", "--sides", "mlxnet", "--timeout", "0.5",
                  "--out", str(out), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    (side,) = json.loads(out.read_text())["rows"][0]["sides"]
    assert side["error"] == "timed out after 0.5 s"
    assert "failed: timed out after 0.5 s" in result.stdout
