"""MLX's Linux CPU speed with and without mlxnet's OpenBLAS binding, in one run.

Each configuration runs in its own process (the binding holds for the whole process):
    python scripts/bench/bench_blas.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

CHILD = r"""
import json, time
import mlxnet
import mlx.core as mx

def best(f, n):
    f(); ts = []
    for _ in range(n):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return min(ts)

a = mx.random.normal((1024, 1024)); mx.eval(a)
mm = best(lambda: mx.eval(a @ a), 5)
x = mx.random.normal((4, 56, 56, 64)); w = mx.random.normal((64, 3, 3, 64)); mx.eval(x, w)
conv = best(lambda: mx.eval(mx.conv2d(x, w, padding=1)), 3)
print(json.dumps({"blas": mlxnet.blas_info(), "matmul_gflops": 2 * 1024**3 / mm / 1e9,
                  "conv3x3_ms": conv * 1e3}))
"""


def measure(env_blas: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "MLXNET_BLAS"}
    if env_blas:
        env["MLXNET_BLAS"] = env_blas
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ref, bound = measure("reference"), measure(None)
    print(f"{'configuration':44s} {'matmul 1024² GFLOP/s':>22s} {'conv3x3 4×56×56×64 ms':>22s}")
    for r in (ref, bound):
        print(f"{r['blas'][:44]:44s} {r['matmul_gflops']:22.1f} {r['conv3x3_ms']:22.1f}")
    print(f"speed-up: matmul {bound['matmul_gflops'] / ref['matmul_gflops']:.0f}×, "
          f"conv {ref['conv3x3_ms'] / bound['conv3x3_ms']:.1f}×")


if __name__ == "__main__":
    main()
