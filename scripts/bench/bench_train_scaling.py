"""Training throughput with 1 and with N processes on this machine (mlx.launch, ring back end).

    python scripts/bench/bench_train_scaling.py [--ranks 2] [--model resnet18] [--size 96] [--batch 16]

Builds a synthetic ImageFolder (4 classes of noisy colours) in a temporary folder, runs
``mlxnet train classify`` on it for two epochs with the same global batch in one process and
under ``mlx.launch --backend ring -n N`` on 127.0.0.1, and prints the images/s of the second
epoch (the first includes start-up). Each process gets the cores divided evenly (OpenBLAS and
MLX threads), as they would on N machines of that many cores.
"""
from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image


def make_folder(root: Path, per_class: int) -> None:
    rng = np.random.default_rng(0)
    for c, colour in enumerate([(200, 40, 40), (40, 60, 200), (40, 200, 60), (200, 200, 40)]):
        (root / f"class{c}").mkdir(parents=True)
        for i in range(per_class):
            pixels = (np.array(colour) + rng.integers(-60, 60, (120, 160, 3))).clip(0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / f"class{c}" / f"{i}.png")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def images_per_s(stdout: str) -> float:
    rates = [float(m) for m in re.findall(r"([\d.]+) images/s", stdout)]
    if not rates:
        raise SystemExit(f"no throughput in the output:\n{stdout}")
    return rates[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--size", type=int, default=96)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--per-class", type=int, default=32)
    a = ap.parse_args()
    bin_dir = Path(sys.executable).parent
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        make_folder(data, a.per_class)
        args = ["train", "classify", str(data), "--weights", "none", "--model", a.model, "--size", str(a.size),
                "--batch", str(a.batch), "--epochs", "2", "--val-split", "0", "--lr", "0.01"]
        results = {}
        for ranks in (1, a.ranks):
            threads = str(max(1, cores // ranks))
            env = {**os.environ, "OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads}
            cmd = [str(bin_dir / "mlxnet"), *args, "-o", str(Path(tmp) / f"run{ranks}")]
            if ranks > 1:
                cmd = [str(bin_dir / "mlx.launch"), "--backend", "ring", "-n", str(ranks), "--hosts", "127.0.0.1",
                       "-p", str(free_port()), *[f"--env={k}={env[k]}" for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")],
                       *cmd]
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
            if done.returncode:
                raise SystemExit(done.stdout + done.stderr)
            results[ranks] = images_per_s(done.stdout)
            print(f"{ranks} process{'es' if ranks > 1 else ''}: {results[ranks]:.1f} images/s "
                  f"({a.model}, {a.size}² crops, global batch {a.batch}, {threads} BLAS thread(s) each)", flush=True)
        print(f"speed-up with {a.ranks} processes: {results[a.ranks] / results[1]:.2f}x on {cores} cores")


if __name__ == "__main__":
    main()
