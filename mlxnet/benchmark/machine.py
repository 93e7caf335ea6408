"""The machine a benchmark ran on, as a user would name it: chip, OS, MLX and its back end."""
from __future__ import annotations

import platform
import subprocess
import sys
from typing import Any

import mlx.core as mx

import mlxnet


def cpu_name() -> str:
    """The CPU's marketing name (``Apple M2 Pro``, ``AMD EPYC 9654``), else the architecture."""
    if sys.platform == "darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                 text=True, timeout=5)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe(device: str) -> dict[str, Any]:
    """Chip, OS, versions, back end and device of this process."""
    info: dict[str, Any] = {
        "chip": cpu_name(),
        "os": platform.platform(terse=True),
        "python": platform.python_version(),
        "mlx": mx.__version__,
        "mlxnet": mlxnet.__version__,
        "backend": mlxnet.backend(),
        "device": device,
    }
    if device == "gpu":
        details = mx.device_info()
        info["gpu"] = str(details.get("device_name") or details.get("architecture") or "?")
        memory = details.get("memory_size") or details.get("total_memory")
        if memory:
            info["gpu_memory_gib"] = round(memory / 2**30, 1)
    else:
        info["blas"] = mlxnet.blas_info()
    return info


def summary(info: dict[str, Any]) -> list[str]:
    """The machine in a few short lines, for the top of a table."""
    where = info.get("gpu") if info["device"] == "gpu" else info["chip"]
    lines = [f"{where}: {info['device']}, MLX {info['mlx']} ({info['backend']} back end)",
             f"{info['os']}, Python {info['python']}, mlxnet {info['mlxnet']}"]
    lines += [f"BLAS: {info['blas']}"] if "blas" in info else []
    lines += [f"PyTorch {info['torch']}"] if "torch" in info else []
    return lines
