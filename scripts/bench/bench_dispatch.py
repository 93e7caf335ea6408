"""Host cost of MLX's GPU dispatch: per op, and per model forward, under MLX's own settings.

    python scripts/bench/bench_dispatch.py [--env MLX_USE_CUDA_GRAPHS=0 ...] [--only resnet50 yolov8m]

MLX's CUDA back end records kernels into CUDA graphs of up to MLX_MAX_OPS_PER_BUFFER nodes
(MLX_USE_CUDA_GRAPHS=0 launches them one by one). Those settings are read once per process, so
each setting runs in its own child process. Printed: microseconds per op for chains of small
elementwise ops and of convolutions (host-bound by construction; the convolutions eager and
under ``mx.compile``), the same chain of convolutions in PyTorch on CUDA, launched one by one and
replayed as a CUDA graph (the floor ``torch.compile(mode="reduce-overhead")`` reaches), and the
median ms of the default (compiled) forward of chosen `mlxnet bench` workloads.
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


def _torch_launches(n: int = 50) -> dict:
    """PyTorch's host cost for the same chain of convolutions on CUDA: launched one by one
    (eager) and replayed as one CUDA graph (what ``torch.compile(mode="reduce-overhead")``
    does), µs per convolution; none where PyTorch has no CUDA."""
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    import time

    x = torch.randn(1, 64, 32, 32, device="cuda", dtype=torch.float16)
    w = torch.randn(64, 64, 3, 3, device="cuda", dtype=torch.float16) * 0.05

    def chain():
        y = x
        for _ in range(n):
            y = torch.nn.functional.conv2d(y, w, padding=1)
        return y

    def per_conv_us(fn, reps: int = 20) -> float:
        times = []
        for _ in range(reps + 3):
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        return sorted(times[3:])[reps // 2] * 1e6 / n

    with torch.no_grad():
        out = {"torch_us_per_conv": per_conv_us(chain)}
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            chain()  # warm-up outside the capture (cuDNN picks its algorithm)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            chain()
        out["torch_us_per_conv_graph"] = per_conv_us(graph.replay)
    return out


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
    out["us_per_conv_compiled"] = _median_ms(mx.compile(convs)) * 1e3 / 50
    out.update(_torch_launches())
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
