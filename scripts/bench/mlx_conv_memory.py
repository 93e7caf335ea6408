"""Plain MLX against PyTorch: the memory one convolution takes beyond its input, weight and
output, and the peak of a chain of convolutions whose every intermediate dies at once.

    python scripts/bench/mlx_conv_memory.py [--device gpu] [--dtype float16] [--ops-per-buffer 1 10 ...]
    python scripts/bench/mlx_conv_memory.py --in-flight 4

No mlxnet code runs: each side is the library's own conv (``mx.conv2d`` on NHWC, ``F.conv2d``
on NCHW, cuDNN behind both on CUDA). For every shape, in a fresh process per side, the weights
and input are made and evaluated first, the peak counter is reset, one conv runs, and the peak
minus the live input + weight + output is printed: the workspace and temporaries the library
allocated for that conv (MLX: ``mx.get_peak_memory``; PyTorch: ``torch.cuda.max_memory_allocated``).
The shapes are YOLOv8n's first convolutions at 640² and a few wider ones.

The chain: K 3×3 convolutions of a (1, 160, 160, 64) map (3.1 MB in float16), each output read
only by the next conv, evaluated once at the end. PyTorch frees each intermediate as soon as the
next conv has run, so its peak stays near two maps; the printed figure is the peak beyond the
input and the weights, in maps. With ``--ops-per-buffer`` the MLX side also runs with
``MLX_MAX_OPS_PER_BUFFER`` set to each value (MLX reads it once per process).

In flight (``--in-flight N``): with one kernel per command buffer, a queued command buffer
still holds its kernel's inputs until it completes, and MLX queues up to 10 before it waits
(``MAX_ACTIVE_TASKS`` in mlx/transforms.cpp) unless more than its memory limit is in use. How
many dead maps are held therefore depends on how far the host runs ahead of the GPU, which
changes from process to process and call to call. N fresh processes each run a chain of 32
convolutions of a (8, 160, 160, 64) map three times under ``MLX_MAX_OPS_PER_BUFFER=1``, with
MLX's memory limit as it is and at 0 (MLX then waits for each kernel before it queues the
next), and print each call's peak beyond the input and weights, in maps, and the median wall ms.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

# (batch, height, width, in channels, out channels, kernel, stride)
SHAPES = [(1, 640, 640, 3, 16, 3, 2), (1, 320, 320, 16, 32, 3, 2), (1, 160, 160, 32, 32, 3, 1),
          (1, 160, 160, 32, 64, 3, 2), (1, 80, 80, 64, 64, 3, 1), (8, 160, 160, 64, 64, 3, 1),
          (1, 64, 64, 256, 256, 1, 1)]


def mlx_side(shape: tuple, dtype: str, device: str) -> float:
    import mlx.core as mx

    mx.set_default_device(mx.gpu if device == "gpu" else mx.cpu)
    n, h, w, ci, co, k, s = shape
    dt = getattr(mx, dtype)
    x = mx.random.normal((n, h, w, ci)).astype(dt)
    wt = (mx.random.normal((co, k, k, ci)) * 0.1).astype(dt)
    mx.eval(x, wt)
    y = mx.conv2d(x, wt, stride=s, padding=k // 2)  # a warm-up: plans and caches made once
    mx.eval(y)
    del y
    mx.synchronize()
    mx.reset_peak_memory()
    base = mx.get_active_memory()
    y = mx.conv2d(x, wt, stride=s, padding=k // 2)
    mx.eval(y)
    mx.synchronize()
    return (mx.get_peak_memory() - base - y.nbytes) / 2**20


CHAIN = (1, 160, 160, 64)
CHAIN_LENGTHS = [1, 4, 16, 64]


def _mlx_chain_run(shape: tuple, k: int, dtype: str, device: str):
    """The map ``x`` and a call that runs K 3×3 convolutions of it, each reading the last, and
    evaluates the end (on the device, the inputs evaluated first)."""
    import mlx.core as mx

    mx.set_default_device(mx.gpu if device == "gpu" else mx.cpu)
    dt = getattr(mx, dtype)
    c = shape[-1]
    x = mx.random.normal(shape).astype(dt)
    ws = [(mx.random.normal((c, 3, 3, c)) * 0.05).astype(dt) for _ in range(k)]
    mx.eval(x, ws)

    def run():
        y = x
        for w in ws:
            y = mx.conv2d(y, w, padding=1)
        mx.eval(y)
        mx.synchronize()
    return x, run


def mlx_chain(k: int, dtype: str, device: str) -> float:
    import mlx.core as mx

    x, run = _mlx_chain_run(CHAIN, k, dtype, device)
    run()  # warm-up
    mx.clear_cache()
    mx.reset_peak_memory()
    base = mx.get_active_memory()
    run()
    return (mx.get_peak_memory() - base) / x.nbytes


IN_FLIGHT_MAP, IN_FLIGHT_LENGTH = (8, 160, 160, 64), 32


def mlx_in_flight(wait: bool, dtype: str, device: str) -> dict:
    import statistics
    import time

    import mlx.core as mx

    x, run = _mlx_chain_run(IN_FLIGHT_MAP, IN_FLIGHT_LENGTH, dtype, device)
    for _ in range(3):
        run()
    mx.clear_cache()
    base = mx.get_active_memory()
    if wait:
        mx.set_memory_limit(0)
    peaks = []
    for _ in range(3):
        mx.reset_peak_memory()
        run()
        peaks.append(round((mx.get_peak_memory() - base) / x.nbytes, 2))
    times = []
    for _ in range(15):
        t = time.perf_counter()
        run()
        times.append((time.perf_counter() - t) * 1e3)
    return {"peak_maps_per_call": peaks, "wall_ms": round(statistics.median(times), 2)}


def torch_chain(k: int, dtype: str, device: str) -> float:
    import torch
    import torch.nn.functional as F

    if device != "gpu":
        raise SystemExit("PyTorch's peak counter is CUDA-only")
    dt = getattr(torch, dtype)
    n, h, w, c = CHAIN
    x = torch.randn(n, c, h, w, device="cuda", dtype=dt)
    ws = [torch.randn(c, c, 3, 3, device="cuda", dtype=dt) * 0.05 for _ in range(k)]

    def run():
        y = x
        with torch.no_grad():
            for wt in ws:
                y = F.conv2d(y, wt, padding=1)
        torch.cuda.synchronize()
        return y
    run()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    run()
    return (torch.cuda.max_memory_allocated() - base) / (x.numel() * x.element_size())


def torch_side(shape: tuple, dtype: str, device: str) -> float:
    import torch
    import torch.nn.functional as F

    dev = "cuda" if device == "gpu" else "cpu"
    if dev == "cpu":
        raise SystemExit("PyTorch's peak counter is CUDA-only")
    n, h, w, ci, co, k, s = shape
    dt = getattr(torch, dtype)
    x = torch.randn(n, ci, h, w, device=dev, dtype=dt)
    wt = torch.randn(co, ci, k, k, device=dev, dtype=dt) * 0.1
    with torch.no_grad():
        y = F.conv2d(x, wt, stride=s, padding=k // 2)
        del y
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        y = F.conv2d(x, wt, stride=s, padding=k // 2)
        torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base - y.numel() * y.element_size()) / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--ops-per-buffer", nargs="*", type=int, default=[],
                    help="also run the MLX chain with MLX_MAX_OPS_PER_BUFFER set to each of these")
    ap.add_argument("--in-flight", type=int, default=0, metavar="N",
                    help="only the in-flight chain, in N fresh processes per memory limit")
    ap.add_argument("--side", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.side:
        side, index = a.side[0], int(a.side[1])
        if side == "mlx-in-flight":
            print(json.dumps(mlx_in_flight(bool(index), a.dtype, a.device)))
        elif side.endswith("chain"):
            fn = mlx_chain if side == "mlx-chain" else torch_chain
            print(json.dumps(round(fn(index, a.dtype, a.device), 2)))
        else:
            fn = mlx_side if side == "mlx" else torch_side
            print(json.dumps(round(fn(SHAPES[index], a.dtype, a.device), 3)))
        return

    def child(side: str, index: int, env: dict | None = None):
        run = subprocess.run([sys.executable, __file__, "--device", a.device, "--dtype", a.dtype, "--side", side,
                              str(index)], capture_output=True, text=True, timeout=300,
                             env=None if env is None else {**os.environ, **env})
        lines = run.stdout.strip().splitlines()
        return json.loads(lines[-1]) if run.returncode == 0 and lines else \
            (run.stderr.strip().splitlines() or ["failed"])[-1][:120]

    def as_dict(result) -> dict:
        return result if isinstance(result, dict) else {"error": result}

    if a.in_flight:
        for wait in (0, 1):
            for _ in range(a.in_flight):
                print(json.dumps({"in-flight chain": IN_FLIGHT_LENGTH, "map": IN_FLIGHT_MAP, "dtype": a.dtype,
                                  "MLX_MAX_OPS_PER_BUFFER": 1, "memory_limit": 0 if wait else "MLX's",
                                  **as_dict(child("mlx-in-flight", wait, {"MLX_MAX_OPS_PER_BUFFER": "1"}))}),
                      flush=True)
        return
    for k in CHAIN_LENGTHS:
        row = {"chain of convs": k, "map": CHAIN, "dtype": a.dtype, "mlx_peak_maps": child("mlx-chain", k),
               "torch_peak_maps": child("torch-chain", k)}
        for ops in a.ops_per_buffer:
            row[f"mlx_peak_maps MLX_MAX_OPS_PER_BUFFER={ops}"] = child("mlx-chain", k, {"MLX_MAX_OPS_PER_BUFFER": str(ops)})
        print(json.dumps(row), flush=True)
    for i, shape in enumerate(SHAPES):
        row = {"shape NHWC, out, k, s": shape, "dtype": a.dtype}
        for side in ("mlx", "torch"):
            row[f"{side}_extra_MB"] = child(side, i)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
