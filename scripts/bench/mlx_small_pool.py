"""A plain-MLX reproduction: a custom kernel that reads an array of at most 8 bytes on CUDA.

    python scripts/bench/mlx_small_pool.py [--reps 20]

MLX's CUDA back end allocates arrays of up to 8 bytes from a small pool of managed memory that
the process's scalars share. The same elementwise kernel (y = relu(x + b[c]) over a 28×28×512
float16 map) is launched with its two runtime sizes in an int32 array of 2 elements (8 bytes:
the pool) and of 3 (12 bytes: device memory); printed is the GPU time per launch of each (CUPTI
through torch.profiler) and of MLX's own fused kernel for the same sum. Needs MLX's CUDA build
and PyTorch with CUDA (for the profiler).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parent))

SOURCE = """
  const int n = p[0], C = p[1];
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  const float v = static_cast<float>(x[i]) + static_cast<float>(b[i % C]);
  out[i] = static_cast<T>(v > 0.0f ? v : 0.0f);
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args(argv)
    if not mx.cuda.is_available():
        print("needs MLX's CUDA build on an NVIDIA GPU", file=sys.stderr)
        return 2
    import profile_gpu  # scripts/bench, beside this file

    kernel = mx.fast.cuda_kernel(name="bias_relu", input_names=["x", "b", "p"], output_names=["out"], source=SOURCE)
    x = mx.random.normal((1, 28, 28, 512)).astype(mx.float16)
    b = mx.random.normal((512,)).astype(mx.float16)
    mx.eval(x, b)
    trace = Path(tempfile.mkdtemp()) / "trace.json"
    runs = {}
    for ints in (2, 3):
        p = mx.array([x.size, 512, 0][:ints], mx.int32)
        mx.eval(p)
        runs[f"sizes in {4 * ints} bytes"] = lambda p=p: kernel(
            inputs=[x, b, p], template=[("T", mx.float16)], grid=(x.size, 1, 1), threadgroup=(256, 1, 1),
            output_shapes=[x.shape], output_dtypes=[x.dtype])[0]
    runs["MLX's fused kernel"] = mx.compile(lambda: mx.maximum(x + b, 0))
    for name, fn in runs.items():
        run = lambda fn=fn: mx.eval(fn())  # noqa: E731
        run()
        run()
        us = profile_gpu.profile(run, args.reps, trace)["busy_ms"] * 1e3
        print(f"{name:22s} {us:7.2f} µs per launch", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
