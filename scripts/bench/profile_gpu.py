"""Where a model's GPU time goes, per kernel, mlxnet beside PyTorch, in one process.

    python scripts/bench/profile_gpu.py --only yolov8m lama-512 --batch 8 --dtype float16 [--out DIR]

For each `mlxnet bench` workload it runs a few forwards of mlxnet's default path and of
PyTorch eager under torch.profiler. CUPTI records every kernel the process launches, MLX's
included, so both sides are seen by the same tool. Printed per side: wall ms per forward, GPU
busy ms (sum of kernel times), kernels per forward, and the kernels that take the most time,
grouped by kind (convolution, GEMM, FFT, fused elementwise, copy, reduction). Wall minus busy is
time the GPU waited for the host. The Chrome traces are written to --out for a closer look.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Callable

import mlxnet

from mlxnet.benchmark import machine, measure
from mlxnet.benchmark.workloads import entries

KINDS = [  # first match wins; names as cuDNN, cuBLAS, cuFFT, MLX and PyTorch spell them
    ("conv", r"conv|implicit_gemm|xmma_fprop|sm\d+_xmma|cudnn|fprop|dgrad|winograd|precomputed"),
    ("gemm", r"gemm|cutlass|sgemm|hgemm|ampere_|sm90_|nvjet|matmul"),
    ("fft", r"fft|regular_fft|vector_fft|spRadix"),
    ("attention", r"attention|sdpa|flash|fmha"),
    ("copy", r"copy|transpose|concat|cat_|gather|scatter|pad|nchw|nhwc|permute"),
    ("reduce", r"reduce|softmax|norm|mean|sum|max|arg"),
    ("elementwise", r"."),
]


def kind(name: str) -> str:
    low = name.lower()
    return next(k for k, pattern in KINDS if re.search(pattern, low))


def profile(run: Callable[[], None], reps: int, trace: Path) -> dict:
    """Kernel statistics of ``reps`` calls of ``run`` (already warm)."""
    import time

    from torch.profiler import ProfilerActivity, profile as tprofile

    with tprofile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        for _ in range(reps):
            run()
        wall = (time.perf_counter() - t) * 1e3 / reps
    prof.export_chrome_trace(str(trace))
    events = json.load(open(trace))["traceEvents"]
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    by_name: dict[str, list[float]] = defaultdict(list)
    for e in kernels:
        by_name[e["name"]].append(e.get("dur", 0) / 1e3)
    gaps = _gaps(kernels, reps)
    by_kind: dict[str, float] = defaultdict(float)
    for name, ds in by_name.items():
        by_kind[kind(name)] += sum(ds) / reps
    try:
        events_ms, events_n = (v / reps for v in _device_events(prof))
    except Exception:  # noqa: BLE001 - a check only; the trace's sums above are the figures
        events_ms = events_n = None
    return {"wall_ms": wall, "busy_ms": sum(sum(d) for d in by_name.values()) / reps,
            "kernels": len(kernels) / reps, "by_kind": dict(by_kind), "gaps": gaps,
            "busy_ms_events": events_ms, "kernels_events": events_n,
            "host_calls": _host_cuda_calls(events, reps),
            "top": sorted(((sum(ds) / reps, len(ds) / reps, name) for name, ds in by_name.items()), reverse=True)}


def device_time_us(event) -> float:
    """A profiler event's device time: ``device_time_total`` in newer torch (2.4 on),
    ``cuda_time_total`` before (later kept only as a deprecated alias)."""
    for name in ("device_time_total", "cuda_time_total"):
        value = getattr(event, name, None)
        if value is not None:
            return float(value)
    return 0.0


def _device_events(prof) -> tuple[float, int]:
    """Device ms and count of the profiler's own device events (kernels, copies, sets): a
    cross-check of the trace's sums, which should agree."""
    from torch.autograd import DeviceType

    device = [e for e in prof.events() if getattr(e, "device_type", None) == DeviceType.CUDA]
    return sum(device_time_us(e) for e in device) / 1e3, len(device)


def _gaps(kernels: list[dict], reps: int) -> dict:
    """GPU idle time between consecutive kernels (per forward), and the widest gaps with the
    kernels on either side."""
    ks = sorted(kernels, key=lambda e: e["ts"])
    idle, widest = 0.0, []
    for a, b in zip(ks, ks[1:]):
        gap = b["ts"] - (a["ts"] + a.get("dur", 0))
        if gap > 2:
            idle += gap
            widest.append((gap, a["name"][:60], b["name"][:60]))
    widest.sort(reverse=True)
    return {"idle_ms": idle / 1e3 / reps, "widest": widest[:8]}


def _host_cuda_calls(events: list[dict], reps: int) -> dict:
    """Host-side CUDA runtime/driver calls (launches, syncs, allocations): the eight costliest,
    total ms per forward by name."""
    tot: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            tot[e["name"]] += e.get("dur", 0) / 1e3 / reps
    return dict(sorted(tot.items(), key=lambda kv: -kv[1])[:8])


def report(label: str, stats: dict, top: int) -> str:
    lines = [f"  {label}: wall {stats['wall_ms']:.2f} ms, GPU busy {stats['busy_ms']:.2f} ms, "
             f"{stats['kernels']:.0f} kernels per forward",
             "    by kind (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(stats["by_kind"].items(), key=lambda kv: -kv[1]))]
    g = stats["gaps"]
    lines.append(f"    GPU idle between kernels: {g['idle_ms']:.2f} ms per forward; widest (µs): "
                 + "; ".join(f"{gap:.0f} after {a} before {b}" for gap, a, b in g["widest"][:4]))
    lines.append("    host CUDA calls (ms per forward): "
                 + ", ".join(f"{k} {v:.2f}" for k, v in stats["host_calls"].items()))
    for ms, count, name in stats["top"][:top]:
        lines.append(f"    {ms:7.3f} ms  {count:5.1f}x  [{kind(name)}] {name[:110]}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", required=True)
    ap.add_argument("--batch", type=int, nargs="+", default=[1])
    ap.add_argument("--dtype", nargs="+", default=["float32"])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--out", default="/tmp/profile", help="folder for the Chrome traces")
    a = ap.parse_args()
    mlxnet.tune_gpu()  # as the mlxnet command runs (before any GPU work)
    mlxnet.use_device("gpu")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    print("\n".join(machine.summary(machine.describe("gpu"))))
    table = entries()
    for name in a.only:
        for batch in a.batch:
            for dtype in a.dtype:
                bench = table[name].build("gpu", batch, dtype)
                baseline = bench.torch() if bench.torch is not None else None
                print(f"\n{name} batch {batch} {dtype} ({baseline.note if baseline else bench.note})", flush=True)
                sides = [("mlxnet", measure.mlx_runner(bench.forward))]
                if baseline is not None:
                    sides.append(("torch", measure.torch_runner(baseline.module, baseline.inputs, "gpu")))
                for label, run in sides:
                    for _ in range(3):
                        run()
                    stats = profile(run, a.reps, out / f"trace-{name}-b{batch}-{dtype}-{label}.json")
                    print(report(label, stats, a.top), flush=True)
                del bench, baseline
                measure.free()


if __name__ == "__main__":
    main()
