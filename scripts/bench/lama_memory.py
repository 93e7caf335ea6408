"""Peak memory and time of one LaMa (big-lama) inpainting at high resolution.

    python scripts/bench/lama_memory.py 1024 2048 [--dtype float16] [--device cpu|gpu]

Each size runs in a fresh process (so peaks do not mix) with random weights (memory does not
depend on the values) and a centred square hole. Reports MLX's peak allocation
(``mx.get_peak_memory``) and the process's peak resident set size.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def measure(size: int, dtype: str, device: str) -> dict:
    import mlxnet

    mlxnet.use_device(device)
    import mlx.core as mx
    import numpy as np

    from mlxnet.models.lama import LaMa

    net = LaMa()
    if dtype != "float32":
        net.set_dtype(getattr(mx, dtype))
    mx.eval(net.parameters())
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    mask = np.zeros((size, size), np.uint8)
    mask[size // 4:3 * size // 4, size // 4:3 * size // 4] = 255
    mx.reset_peak_memory()
    start = time.perf_counter()
    out = net.inpaint(image, mask)
    seconds = time.perf_counter() - start
    assert out.shape == image.shape
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KiB
    return {"size": size, "dtype": dtype, "backend": mlxnet.backend(), "seconds": round(seconds, 2),
            "mlx_peak_gib": round(mx.get_peak_memory() / 2**30, 2), "peak_rss_gib": round(rss_kb / 2**20, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sizes", nargs="+", type=int)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # child process mode
    a = ap.parse_args()
    if a.one:
        print(json.dumps(measure(a.sizes[0], a.dtype, a.device)))
        return
    for size in a.sizes:
        out = subprocess.run([sys.executable, __file__, str(size), "--dtype", a.dtype, "--device", a.device,
                              "--one"], capture_output=True, text=True)
        print(out.stdout.strip() if out.returncode == 0 else f"{size}: failed: {out.stderr.strip()[-500:]}",
              flush=True)


if __name__ == "__main__":
    main()
