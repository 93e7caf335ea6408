"""Transposed convolutions beyond scripts/bench/bench_ops.py (whose conv_transpose section times the
forward methods on one device): the CPU table with MLX's very slow CPU built-in, and on a GPU the
backward methods the dispatcher picks from.

    python scripts/bench/bench_conv_transpose.py            # CPU: mlxnet vs MLX built-in vs PyTorch
    python scripts/bench/bench_conv_transpose.py --gpu      # GPU: backward methods, fwd+bwd totals

Times are milliseconds per call: the minimum over repetitions on CPU (shared cores make the
median noisy); on GPU the median, each repetition queueing a few calls before one sync.
Shapes come from bench_ops.CONV_TRANSPOSE_SHAPES.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import mlxnet
import mlx.core as mx
import numpy as np
import torch
import torch.nn.functional as F

from mlxnet import ops
from mlxnet.ops.conv_transpose import kernel as gpu
from mlxnet.ops.conv_transpose.definition import _run, decomposed_nhwc
from mlxnet.ops.conv_transpose.plan import as_2d
from mlxnet.ops.conv_transpose.plan import plan as ref_plan

sys.path.insert(0, str(Path(__file__).parent))
from bench_ops import CONV_TRANSPOSE_SHAPES  # noqa: E402


@dataclass
class Case:
    name: str
    shape: tuple[int, ...]  # (N, H, W, C_in) or (N, L, C_in)
    c_out: int
    k: int
    s: int
    p: int = 0
    op: int = 0
    g: int = 1

    @property
    def nd(self) -> int:
        return len(self.shape) - 2

    @property
    def params(self) -> dict:
        return dict(stride=self.s, padding=self.p, output_padding=self.op, groups=self.g)

    def label(self) -> str:
        dims = "×".join(map(str, self.shape))
        extra = f" p{self.p}" + (f" op{self.op}" if self.op else "") + (f" g{self.g}" if self.g > 1 else "")
        return f"{self.name}: {dims}→{self.c_out} k{self.k} s{self.s}{extra}"


GPU_CASES = [Case(label, shape, c_out, k, s, p, op, g)
             for label, shape, c_out, k, s, p, op, g in CONV_TRANSPOSE_SHAPES]
CPU_CASES = GPU_CASES[:7]  # LaMa's and SAM's upsamplers


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timeit(fn: Callable[[], object], device: str, reps: int, warmup: int = 2) -> float:
    """ms per call; fn must finish its work (mx.eval / torch sync) itself."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return min(times) if device == "cpu" else statistics.median(times)


def problem(case: Case, dtype: mx.Dtype, torch_device: str):
    rng = np.random.default_rng(0)
    kernel = (case.k,) * case.nd
    x = rng.standard_normal(case.shape).astype(np.float32)
    w = (rng.standard_normal((case.c_out, *kernel, case.shape[-1] // case.g)) * 0.05).astype(np.float32)
    b = rng.standard_normal((case.c_out,)).astype(np.float32)
    xm, wm, bm = (mx.array(a).astype(dtype) for a in (x, w, b))
    tdt = {mx.float32: torch.float32, mx.float16: torch.float16, mx.bfloat16: torch.bfloat16}[dtype]
    # PyTorch: NCHW input, (C_in, C_out/g, *kernel) weight.
    wt = w.reshape(case.g, case.c_out // case.g, *kernel, -1)
    wt = np.moveaxis(wt, -1, 1).reshape(case.shape[-1], case.c_out // case.g, *kernel)
    xt, wt_, bt = (torch.tensor(a, device=torch_device, dtype=tdt) for a in (np.moveaxis(x, -1, 1), wt, b))
    mx.eval(xm, wm, bm)
    return (xm, wm, bm), (xt.contiguous(), wt_.contiguous(), bt)


def _mlx_builtin(case: Case, x, w, b):
    f = mx.conv_transpose1d if case.nd == 1 else mx.conv_transpose2d
    return f(x, w, stride=case.s, padding=case.p, output_padding=case.op, groups=case.g) + b


def _ours(case: Case, impl, x, w, b):
    prm = case.params
    return _run(case.nd, impl, x, w, b, prm["stride"], prm["padding"], prm["output_padding"], 1, prm["groups"])


def _torch_fn(case: Case):
    return F.conv_transpose1d if case.nd == 1 else F.conv_transpose2d


def cpu_table(reps: int, builtin: bool) -> list[str]:
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rows = ["| shape | mlxnet | MLX built-in | PyTorch CPU | mlxnet / PyTorch |", "|---|---|---|---|---|"]
    with mlxnet.use_device("cpu"):
        for case in CPU_CASES:
            (x, w, b), (xt, wt, bt) = problem(case, mx.float32, "cpu")
            ours = timeit(lambda: mx.eval(_ours(case, decomposed_nhwc, x, w, b)), "cpu", reps)
            time.sleep(0.5)  # let OpenBLAS's spinning threads park before PyTorch's start
            tt = timeit(lambda: _torch_fn(case)(xt, wt, bt, **case.params), "cpu", reps)
            mb = (f"{timeit(lambda: mx.eval(_mlx_builtin(case, x, w, b)), 'cpu', 1, 0):.0f}"
                  if builtin else "–")
            rows.append(f"| {case.label()} | {ours:.1f} | {mb} | {tt:.1f} | {ours / tt:.2f} |")
            print(rows[-1], flush=True)
    return rows


def gpu_backward_table(reps: int, dtypes: list[mx.Dtype], inner: int = 2) -> list[str]:
    """Each timing queues ``inner`` calls before one sync (launch latency amortised)."""
    tdev = "cuda" if torch.cuda.is_available() else "cpu"
    vjps = ["conv", "decomposition", "builtin"]
    rows = ["| shape | dtype | " + " | ".join(f"vjp {m}" for m in vjps) + " | dispatch vjp |"
            " MLX built-in fwd+bwd | mlxnet fwd+bwd | PyTorch fwd+bwd |", "|---" * (len(vjps) + 6) + "|"]

    def mlx_time(fn):
        return timeit(lambda: mx.eval([fn() for _ in range(inner)]), "gpu", reps) / inner

    def torch_time(fn):
        return timeit(lambda: ([fn() for _ in range(inner)], _sync(tdev)), tdev, reps) / inner

    for dtype in dtypes:
        for case in GPU_CASES:
            (x, w, b), (xt, wt, bt) = problem(case, dtype, tdev)
            op = ops.conv_transpose1d if case.nd == 1 else ops.conv_transpose2d
            x2, w2 = (x[:, None], w[:, None]) if case.nd == 1 else (x, w)
            plan = as_2d(x, w, ref_plan(x, w, b, case.nd, case.s, case.p, case.op, 1, case.g))[2]
            dy = mx.random.normal(_ours(case, decomposed_nhwc, x, w, b).shape).astype(dtype)
            dy2 = dy[:, None] if case.nd == 1 else dy
            mx.eval(dy)
            # "builtin" is timed even where its dx is wrong (output_padding): speed only.
            t_v = [mlx_time(lambda: gpu.vjp_nhwc(x2, w2, b, plan, dy2, method=m)) for m in vjps]

            def grad_of(fn):
                return mx.grad(lambda x_, w_, b_: (fn(x_, w_, b_) * dy).sum(), argnums=(0, 1, 2))

            g_builtin = grad_of(lambda x_, w_, b_: _mlx_builtin(case, x_, w_, b_))
            g_ours = grad_of(lambda x_, w_, b_: op(x_, w_, b_, **case.params))
            t_bb = mlx_time(lambda: g_builtin(x, w, b))
            t_ob = mlx_time(lambda: g_ours(x, w, b))
            leaves = [t.clone().requires_grad_() for t in (xt, wt, bt)]
            dyt = torch.randn(_torch_fn(case)(xt, wt, bt, **case.params).shape, device=tdev, dtype=xt.dtype)
            t_tb = torch_time(lambda: _torch_fn(case)(*leaves, **case.params).backward(dyt))
            rows.append(f"| {case.label()} | {str(dtype).split('.')[-1]} | "
                        + " | ".join(f"{t:.3f}" for t in t_v)
                        + f" | {gpu.vjp_method(plan)} | {t_bb:.3f} | {t_ob:.3f} | {t_tb:.3f} |")
            print(rows[-1], flush=True)
            mx.clear_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", action="store_true", help="GPU tables (else the CPU table)")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--no-builtin", action="store_true", help="CPU: skip MLX's (very slow) built-in")
    ap.add_argument("--fp16", action="store_true", help="GPU: also float16")
    a = ap.parse_args()
    if a.gpu:
        mlxnet.use_device("gpu")
        rows = gpu_backward_table(a.reps or 10, [mx.float32] + ([mx.float16] if a.fp16 else []))
    else:
        rows = cpu_table(a.reps or 10, not a.no_builtin)
    print("\n".join(["", f"device: {mlxnet.backend()}"] + rows))


if __name__ == "__main__":
    main()
