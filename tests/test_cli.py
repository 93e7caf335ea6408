"""The CLI frame: info, ops, --help, one-line errors."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

MLXNET = [sys.executable, "-m", "mlxnet"]


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(MLXNET + list(args), capture_output=True, text=True, env=env)


def test_info_reports_backend_device_and_blas():
    out = run("info")
    assert out.returncode == 0, out.stderr
    for field in ("MLX", "backend", "device", "BLAS (CPU)", "host memory", "memory limit (MLX)"):
        assert field in out.stdout
    # the GPU memory setting leaves a CPU run's limit alone
    least = run("info", "--device", "cpu", env={**os.environ, "MLXNET_GPU_MEMORY": "min"})
    assert least.returncode == 0 and "waits for each kernel" not in least.stdout, least.stdout


@pytest.mark.gpu
def test_info_says_how_the_gpu_launches_kernels(gpu):
    import os

    env = {k: v for k, v in os.environ.items() if k != "MLX_USE_CUDA_GRAPHS"}
    out = run("info", env=env)
    assert out.returncode == 0, out.stderr
    # The command's own process launches directly (mlxnet.tune_gpu); Metal has no such row.
    assert ("direct launches (MLX_USE_CUDA_GRAPHS=0)" in out.stdout) == (gpu == "cuda")
    kept = run("info", env={**env, "MLX_USE_CUDA_GRAPHS": "1"})
    assert ("CUDA graphs (MLX_USE_CUDA_GRAPHS=1)" in kept.stdout) == (gpu == "cuda")
    least = run("info", env={**env, "MLXNET_GPU_MEMORY": "min"})
    assert "0: MLX waits for each kernel" in least.stdout, least.stdout
    for before_or_after in (["--device", "cpu", "info"], ["info", "--device", "cpu"]):
        on_cpu = run(*before_or_after, env={**env, "MLXNET_GPU_MEMORY": "min"})
        assert on_cpu.returncode == 0 and "waits for each kernel" not in on_cpu.stdout, on_cpu.stdout


def test_ops_lists_every_registered_op():
    import mlxnet

    out = run("ops")
    assert out.returncode == 0, out.stderr
    for name, op in mlxnet.ops.REGISTRY.items():
        line = next(l for l in out.stdout.splitlines() if f" {name} " in l)
        assert line.split()[1] == ("fast" if op.cpu else "definition")
        assert ("kernel" in line) == bool(op.sources)
        assert ("MLX built-in" in line) == (op.has_kernel and not op.sources)


@pytest.mark.parametrize("cmd", [[], ["info"], ["ops"]])
def test_every_command_has_help(cmd):
    out = run(*cmd, "--help")
    assert out.returncode == 0 and "Usage" in out.stdout


def test_errors_are_one_line_and_non_zero():
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("MLXNET_")}
    out = run("--device", "tpu", "info", env=env)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == ["error: unknown device 'tpu': expected 'cpu' or 'gpu'"]
    out = run("--debug", "--device", "tpu", "info", env=env)
    assert out.returncode == 1 and "Traceback" in out.stderr


@pytest.mark.parametrize("columns", [80, 200])
@pytest.mark.parametrize("cmd", ["ops", "info"])
def test_tables_are_readable_at_80_and_200_columns(cmd, columns):
    import os

    import mlxnet

    out = run(cmd, env={**os.environ, "COLUMNS": str(columns)})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert max(len(line) for line in lines) <= columns
    if cmd == "ops":  # every op and kernel file whole on its op's line
        for name, op in mlxnet.ops.REGISTRY.items():
            line = next(l for l in lines if l.split() and l.split()[0] == name)
            assert all(k.filename in line for k in op.sources), line
