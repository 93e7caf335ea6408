"""Host cost of MLX's GPU dispatch: per op, and per model forward, under MLX's own settings.

    python scripts/bench/bench_dispatch.py [--env MLX_USE_CUDA_GRAPHS=0 ...] [--only resnet50 yolov8m]

MLX's CUDA back end records kernels into CUDA graphs of up to MLX_MAX_OPS_PER_BUFFER nodes
(MLX_USE_CUDA_GRAPHS=0 launches them one by one). Those settings are read once per process, so
each setting runs in its own child process. Printed: microseconds per op for chains of small
elementwise ops and of convolutions (host-bound by construction), and the median ms of the
default (compiled) forward of chosen `mlxnet bench` workloads.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

def _median_ms(fn, reps: int = 20, warmup: int = 3) -> float:
    """Median ms of evaluating ``fn()`` to the end (``mlxnet bench``'s timer, one run)."""
    from mlxnet.benchmark import measure

    return measure.summary(measure.time_alternating({"run": measure.mlx_runner(fn)}, warmup, reps)["run"])[0]


def child(only: list[str], batches: list[int], dtypes: list[str]) -> dict:
    import mlx.core as mx

    import mlxnet
    from mlxnet.benchmark import measure
    from mlxnet.benchmark.workloads import entries

    device = os.environ.get("BENCH_DEVICE", "gpu")  # cpu: try the script where there is no GPU
    mlxnet.use_device(device)
    out: dict = {}
    x = mx.random.normal((1, 32, 32, 64)).astype(mx.float16)
    w = mx.random.normal((64, 3, 3, 64)).astype(mx.float16) * 0.05

    def adds(n: int = 200):
        y = x
        for _ in range(n):
            y = y + 1
        return y

    def convs(n: int = 50):
        y = x
        for _ in range(n):
            y = mx.conv2d(y, w, padding=1)
        return y
    out["us_per_add"] = _median_ms(adds) * 1e3 / 200
    out["us_per_conv"] = _median_ms(convs) * 1e3 / 50
    table = entries()
    for name in only:
        for batch in batches:
            for dtype in dtypes:
                bench = table[name].build(device, batch, dtype)
                out[f"{name} b{batch} {dtype}"] = _median_ms(bench.forward)
                del bench
                measure.free()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", nargs="*", default=[], help="settings to compare, each 'K=V[,K=V]' ('' is MLX's default)")
    ap.add_argument("--only", nargs="*", default=["resnet50", "yolov8m"])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--dtype", nargs="+", default=["float16"])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.only, a.batch, a.dtype)))
        return
    for setting in [""] + a.env:
        env = dict(os.environ)
        env.update(kv.split("=", 1) for kv in setting.split(",") if kv)
        cmd = [sys.executable, __file__, "--child", "--only", *a.only, "--batch", *map(str, a.batch), "--dtype", *a.dtype]
        run = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if run.returncode:
            print(f"{setting or 'default'}: failed\n{run.stderr[-2000:]}")
            continue
        times = json.loads(run.stdout.strip().splitlines()[-1])
        print(f"{setting or 'default'}: " + ", ".join(f"{k} {v:.2f}" for k, v in times.items()), flush=True)


if __name__ == "__main__":
    main()
