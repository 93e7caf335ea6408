"""The README's front door: its first command (detection on the bundled photo, weights from the
hub) runs as written, through the real download path, against a prepared local hub cache."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np

from hubcache import prepare_hub_cache
from mlxnet.image import load_image
from mlxnet.models import yolo
from mlxnet.weights import get_spec
from testutil import save_ultralytics_pt

ROOT = Path(__file__).resolve().parents[1]


def first_command() -> list[str]:
    """The mlxnet part of the README's first shell block (after the install steps)."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", readme, re.S).group(1)
    return shlex.split(block.strip().splitlines()[0].split("&&")[-1])


def test_first_readme_command_detects_on_the_bundled_photo(tmp_path):
    args = first_command()
    assert args[:2] == ["mlxnet", "detect"] and "-o" in args
    spec = get_spec("yolov8n")
    src = save_ultralytics_pt(tmp_path / "yolov8n.pt", yolo.seeded_torch_state("n", 1234, 2.5, 5.0))
    cache = tmp_path / "hf" / "hub"
    prepare_hub_cache(cache, spec.repo, spec.filename, src)
    out_dir = tmp_path / "out"
    args[args.index("-o") + 1] = str(out_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MLXNET_"))}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
    run = subprocess.run([sys.executable, "-m", "mlxnet", *args[1:]], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    written = out_dir / "bus.jpg"
    photo = load_image(ROOT / "tests/fixtures/yolo/bus.jpg")
    annotated = load_image(written)
    assert annotated.shape == photo.shape and np.abs(annotated.astype(int) - photo).max() > 100  # boxes drawn
    assert "bus.jpg" in run.stdout


def test_the_gpu_table_is_regenerated_from_the_benchmark_json():
    """The README's GPU table is the benchmark's own output (mlxnet bench --markdown)."""
    command = re.search(r"`mlxnet (bench --markdown [^`]*)`", (ROOT / "README.md").read_text())
    args = command.group(1).split()
    table = subprocess.run([sys.executable, "-m", "mlxnet", *args], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout
    assert table.count("\n") > 10 and "PyTorch / mlxnet" in table
    assert table.strip() in (ROOT / "README.md").read_text()
