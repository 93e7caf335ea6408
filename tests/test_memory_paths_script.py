"""scripts/bench/memory_paths.py: each setting in its own process, one JSON line each."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench" / "memory_paths.py"


def test_lama_path_under_each_gpu_memory_setting_gives_the_same_image():
    runs = {}
    for setting in ("default", "min"):
        out = subprocess.run([sys.executable, str(SCRIPT), "lama", "--lama-size", "64", "--gpu-memory", setting],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        (line,) = out.stdout.strip().splitlines()
        runs[setting] = json.loads(line)
    assert [r["gpu_memory"] for r in runs.values()] == ["default", "min"]
    assert runs["default"]["size"] == "64x64" and runs["default"]["mlx_peak_gib"] > 0
    # the settings change when MLX waits and frees, never what it computes
    assert runs["min"]["output_sum"] == runs["default"]["output_sum"]
