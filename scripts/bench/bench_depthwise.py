"""Depthwise 3×3 convolutions (groups = channels) at SAM-tiny's encoder shapes, per kernel:

    python scripts/bench/bench_depthwise.py [--dtype float16] [--reps 20] [--out FILE]

For each shape, GPU kernel µs per call (CUPTI through torch.profiler, which sees MLX's kernels
and PyTorch's in one process) of MLX's own grouped convolution (``mx.conv2d``: cuDNN on CUDA),
mlxnet's depthwise kernel (``mlxnet.ops.depthwise_conv2d``) and PyTorch's channels-last
``F.conv2d``, each with its bias; plus the largest difference of mlxnet's output from MLX's.
Needs a CUDA GPU and PyTorch (for the profiler).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np

import mlxnet
from mlxnet import ops

sys.path.insert(0, str(Path(__file__).resolve().parent))
import profile_gpu  # noqa: E402  (scripts/bench, beside this file)

# (what, N, H, W, C, stride) of SAM-tiny's depthwise convs on a 1024² image
SHAPES = [("MBConv", 1, 256, 256, 256, 1), ("merge 0", 1, 256, 256, 128, 2),
          ("block 1", 1, 128, 128, 128, 1), ("merge 1", 1, 128, 128, 160, 2),
          ("block 2", 1, 64, 64, 160, 1), ("merge 2 / block 3", 1, 64, 64, 320, 1),
          ("MBConv b8", 8, 256, 256, 256, 1)]


def kernel_us(run, reps: int, trace: Path) -> float:
    run()
    run()
    return profile_gpu.profile(run, reps, trace)["busy_ms"] * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if mlxnet.device.backend() != "cuda":
        print("needs MLX's CUDA build on an NVIDIA GPU (and PyTorch with CUDA)", file=sys.stderr)
        return 2
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        print("needs PyTorch with CUDA (its profiler and its convolution)", file=sys.stderr)
        return 2
    dtype = getattr(mx, args.dtype)
    rows = []
    trace = Path(tempfile.mkdtemp()) / "trace.json"
    for what, n, h, w, c, stride in SHAPES:
        x = mx.random.normal((n, h, w, c)).astype(dtype)
        wt = (mx.random.normal((c, 3, 3, 1)) * 0.3).astype(dtype)
        b = mx.random.normal((c,)).astype(dtype)
        mx.eval(x, wt, b)
        mlx_fn = mx.compile(lambda: mx.conv2d(x, wt, stride=stride, padding=1, groups=c) + b)
        ours = lambda: ops.depthwise_conv2d(x, wt, b, stride=stride, padding=1)  # noqa: E731
        err = float(mx.abs(ours().astype(mx.float32) - mlx_fn().astype(mx.float32)).max())
        tx = torch.from_numpy(np.array(x.astype(mx.float32))).cuda().to(getattr(torch, args.dtype))
        tx = tx.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
        tw = torch.from_numpy(np.array(wt.astype(mx.float32))).cuda().to(tx.dtype).permute(0, 3, 1, 2)
        tw = tw.contiguous(memory_format=torch.channels_last)
        tb = torch.from_numpy(np.array(b.astype(mx.float32))).cuda().to(tx.dtype)
        row = {"what": what, "shape": [n, h, w, c], "stride": stride, "max_abs_diff": err,
               "mlx_us": kernel_us(lambda: mx.eval(mlx_fn()), args.reps, trace),
               "mlxnet_us": kernel_us(lambda: mx.eval(ours()), args.reps, trace),
               "torch_us": kernel_us(lambda: F.conv2d(tx, tw, tb, stride=stride, padding=1, groups=c),
                                     args.reps, trace)}
        torch.cuda.synchronize()
        rows.append(row)
        print(f"{what:18s} {n}x{h}x{w}x{c} s{stride}: MLX {row['mlx_us']:8.1f} µs  mlxnet {row['mlxnet_us']:8.1f} µs  "
              f"PyTorch {row['torch_us']:8.1f} µs  (max |diff| {err:.3g})", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"dtype": args.dtype, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
