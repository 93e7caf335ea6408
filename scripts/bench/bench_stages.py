"""Compiled stages against their alternatives, alternating call by call in one process (GPU).

    python scripts/bench/bench_stages.py [--only yolov8s yolov8m lama sam] [--batch 1 8] [--dtype float32 float16]

For YOLOv8 it times the model's own forward (staged from YOLOv8's STAGED_MIN_WORK, else one
graph) against the whole forward compiled as one graph; for LaMa and SAM-tiny's TinyViT the
model's stages (each compiled with only the arrays it reads as inputs) against the same stages
compiled with the whole model as input. Median ms of --reps calls each, and their ratio
(alternative / model: above 1, the model's forward is faster). See docs/performance-notes.md,
"Compiled stages".
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import mlxnet
import mlx.core as mx
import mlx.nn as nn

from mlxnet.device import tracing
from mlxnet.nn import handoff


def one_graph(net: nn.Module) -> Callable[[mx.array], mx.array]:
    """``net``'s eager forward traced as one compiled graph, the whole model as input."""
    def forward(x: mx.array) -> mx.array:
        with tracing(), mlxnet.use_compile(False):
            return net(x)
    return mx.compile(forward, inputs=[net])


def wide_stages(module: nn.Module, stage: Callable, bounds: list[tuple], finish: Callable | None = None):
    """The model's stage method (undecorated) compiled once per bounds with the whole model as
    input, handed off one by one like the model's own forward; ``finish`` the last step."""
    compiled: dict[tuple, Any] = {}

    def call(key: tuple, fn: Callable, x: mx.array) -> mx.array:
        if key not in compiled:
            def traced(v: mx.array) -> mx.array:
                with tracing():
                    return fn(v)
            compiled[key] = mx.compile(traced, inputs=[module])
        return compiled[key](x)

    def forward(x: mx.array) -> mx.array:
        for b in bounds:
            x = handoff(call(b, lambda v, b=b: stage(module, v, *b), x))
        return call(("finish",), lambda v: finish(module, v), x) if finish else x
    return forward


def alternate(runs: dict[str, Callable[[], Any]], reps: int, warmup: int = 5) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in runs}
    for rep in range(warmup + reps):
        for name, run in runs.items():
            t = time.perf_counter()
            mx.eval(run())
            mx.synchronize()
            if rep >= warmup:
                times[name].append((time.perf_counter() - t) * 1e3)
    return {name: statistics.median(ts) for name, ts in times.items()}


def cases(name: str, batch: int, dtype: mx.Dtype) -> tuple[str, dict[str, Callable[[], Any]]]:
    if name.startswith("yolov8"):
        from mlxnet.models import yolo

        net = yolo.YOLOv8(name[-1]).fuse()
        net.set_dtype(dtype)
        x = mx.random.uniform(shape=(batch, 640, 640, 3)).astype(dtype)
        whole = one_graph(net)
        return "one graph / model", {"one graph": lambda: whole(x), "model": lambda: net(x)}
    if name == "lama":
        from mlxnet.models.lama import LaMa

        net = LaMa()
        net.set_dtype(dtype)
        x = mx.random.uniform(shape=(batch, 512, 512, 4))
        wide = wide_stages(net, LaMa._layers.__wrapped__, net._stages())

        def wide_forward():
            return wide(x.astype(net.dtype))
        return "whole-model inputs / own inputs", {"whole-model inputs": wide_forward, "model": lambda: net(x)}
    if name == "sam":
        from mlxnet.models import sam

        net = sam.sam_tiny().image_encoder
        net.set_dtype(dtype)
        x = mx.random.normal((batch, 1024, 1024, 3)).astype(dtype)
        layer, neck = type(net)._layer.__wrapped__, type(net)._neck.__wrapped__
        wide = wide_stages(net, layer, [(i,) for i in range(len(net.layers))], neck)
        return "whole-model inputs / own inputs", {"whole-model inputs": lambda: wide(x), "model": lambda: net(x)}
    raise SystemExit(f"unknown entry {name!r}: yolov8n..x, lama, sam")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", default=["yolov8s", "yolov8m", "yolov8l", "yolov8x", "lama", "sam"])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--dtype", nargs="+", default=["float32", "float16"])
    ap.add_argument("--reps", type=int, default=35)
    a = ap.parse_args()
    mlxnet.tune_gpu()
    mlxnet.use_device("gpu")
    for dtype in a.dtype:
        for batch in a.batch:
            for name in a.only:
                label, runs = cases(name, batch, getattr(mx, dtype))
                outs = [run() for run in runs.values()]
                ref = outs[-1].astype(mx.float32)
                for out in outs[:-1]:  # the alternatives compute the same thing
                    assert mx.allclose(out.astype(mx.float32), ref, rtol=1e-2, atol=1e-2 * float(mx.abs(ref).max())).item()
                ms = alternate(runs, a.reps if "yolo" in name else max(a.reps // 2, 10))
                (alt, t_alt), (_, t_model) = ms.items()
                print(f"{name:8s} b{batch} {dtype:8s} {alt} {t_alt:7.3f} ms, model {t_model:7.3f} ms | {label} "
                      f"{t_alt / t_model:.3f}", flush=True)
                del runs, outs


if __name__ == "__main__":
    main()
