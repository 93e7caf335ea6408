"""Op speed on the current device: mlxnet (kernel on a GPU, reference on CPU) vs MLX's
built-in and PyTorch (CUDA when torch sees a GPU, else CPU; NCHW), in one run.

    python scripts/bench/bench_ops.py [--only SUBSTRING ...] [--json out.json] [--scale 0.25]

Each case is timed as the median over several batches of back-to-back calls (MLX: the lazy
graph of a batch is built untimed, then evaluated; PyTorch: launched, then synchronised), so
sync overheads are amortised the same way for every framework.
Achieved GB/s counts each input read once and each output written once, and is compared with
a measured copy bandwidth (``x + 0`` on a large array). Cases live in the CASES list, one
section per op family; append a section to add ops.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import mlxnet
import mlx.core as mx
import mlx.nn as mlx_nn
import numpy as np

from mlxnet import ops

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the benchmark still compares mlxnet with MLX
    torch = None
    F = None


@dataclass
class Case:
    """One benchmark: inputs, then the same computation in mlxnet, MLX and PyTorch.

    ``setup(scale)`` returns the mlxnet/MLX inputs; ``torch_inputs`` turns them into PyTorch
    tensors on the given device (default: 4-D NHWC → NCHW, 3-D NLC → NCL, others as is).
    ``mlx`` and ``torch`` may be None where there is no counterpart.
    """

    section: str
    name: str
    setup: Callable[[float], tuple[mx.array, ...]]
    mlxnet: Callable[..., Any]
    mlx: Callable[..., Any] | None = None
    torch: Callable[..., Any] | None = None
    torch_inputs: Callable[[tuple[mx.array, ...], str], tuple] | None = None
    record: bool = False  # a case of record (reported first)
    extra: dict = field(default_factory=dict)


def channels_first(xs: Sequence[mx.array], device: str) -> tuple:
    out = []
    for x in xs:
        t = torch.from_numpy(np.array(x.astype(mx.float32))).to(device)
        if x.ndim in (3, 4):
            t = t.movedim(-1, 1).contiguous()
        out.append(t.to(getattr(torch, str(x.dtype).split(".")[-1])))
    return tuple(out)


def _act(shape: Sequence[int], dtype: mx.Dtype = mx.float32) -> Callable[[float], tuple[mx.array]]:
    """NHWC activations; ``scale`` shrinks the batch (at least 1) for quick runs."""
    def make(scale: float) -> tuple[mx.array]:
        n = max(1, round(shape[0] * scale))
        return (mx.random.normal((n, *shape[1:]), key=mx.random.key(0)).astype(dtype),)
    return make


def _seq(f: Callable, times: int) -> Callable:
    def run(x):
        outs = []
        for _ in range(times):
            x = f(x)
            outs.append(x)
        return tuple(outs)
    return run


# ---- pooling -----------------------------------------------------------------------------
_RECORD = (16, 112, 112, 64)
_mlx_max2 = mlx_nn.MaxPool2d(2, 2)
_mlx_max3 = mlx_nn.MaxPool2d(3, 2, 1)
_mlx_avg2 = mlx_nn.AvgPool2d(2, 2)
_mlx_avg3 = mlx_nn.AvgPool2d(3, 2, 1)
_mlx_max5 = mlx_nn.MaxPool2d(5, 1, 2)

POOLING = [
    Case("pooling", "max_pool2d k2 s2 fp32 16x112x112x64", _act(_RECORD),
         lambda x: ops.max_pool2d(x, 2, 2), _mlx_max2,
         lambda t: F.max_pool2d(t, 2, 2), record=True),
    Case("pooling", "max_pool2d k3 s2 p1 fp32 16x112x112x64", _act(_RECORD),
         lambda x: ops.max_pool2d(x, 3, 2, 1), _mlx_max3,
         lambda t: F.max_pool2d(t, 3, 2, 1), record=True),
    Case("pooling", "max_pool2d k3 s2 p1 bf16 16x112x112x64", _act(_RECORD, mx.bfloat16),
         lambda x: ops.max_pool2d(x, 3, 2, 1), _mlx_max3,
         lambda t: F.max_pool2d(t, 3, 2, 1)),
    Case("pooling", "avg_pool2d k2 s2 fp32 16x112x112x64", _act(_RECORD),
         lambda x: ops.avg_pool2d(x, 2, 2), _mlx_avg2,
         lambda t: F.avg_pool2d(t, 2, 2)),
    Case("pooling", "avg_pool2d k3 s2 p1 fp32 16x56x56x256", _act((16, 56, 56, 256)),
         lambda x: ops.avg_pool2d(x, 3, 2, 1), _mlx_avg3,
         lambda t: F.avg_pool2d(t, 3, 2, 1)),
    Case("pooling", "sppf (3x max k5 s1 p2) fp32 1x20x20x512", _act((1, 20, 20, 512)),
         ops.sppf_pool, _seq(_mlx_max5, 3),
         _seq(lambda t: F.max_pool2d(t, 5, 1, 2), 3), record=True),
    Case("pooling", "sppf (3x max k5 s1 p2) fp16 16x40x40x256", _act((16, 40, 40, 256), mx.float16),
         ops.sppf_pool, _seq(_mlx_max5, 3),
         _seq(lambda t: F.max_pool2d(t, 5, 1, 2), 3)),
    Case("pooling", "adaptive_avg_pool2d (1,1) fp32 64x7x7x2048", _act((64, 7, 7, 2048)),
         lambda x: ops.adaptive_avg_pool2d(x, 1), lambda x: x.mean(axis=(1, 2), keepdims=True),
         lambda t: F.adaptive_avg_pool2d(t, 1)),
    Case("pooling", "adaptive_avg_pool2d (7,7) fp32 16x20x20x512", _act((16, 20, 20, 512)),
         lambda x: ops.adaptive_avg_pool2d(x, 7), None,
         lambda t: F.adaptive_avg_pool2d(t, 7)),
    Case("pooling", "adaptive_max_pool2d (6,6) fp32 16x40x40x256", _act((16, 40, 40, 256)),
         lambda x: ops.adaptive_max_pool2d(x, 6), None,
         lambda t: F.adaptive_max_pool2d(t, 6)),
]

# ---- conv_transpose ----------------------------------------------------------------------
# (label, input NHWC / NLC, C_out, kernel, stride, padding, output_padding, groups). The first
# seven are LaMa's and SAM's upsamplers (also the CPU table of scripts/bench/bench_conv_transpose.py,
# which adds MLX's CPU built-in and the backward passes).
CONV_TRANSPOSE_SHAPES = [
    ("LaMa up", (1, 64, 64, 256), 128, 3, 2, 1, 1, 1),
    ("SAM upscale", (4, 56, 56, 64), 64, 2, 2, 0, 0, 1),
    ("SAM decoder", (1, 64, 64, 256), 64, 2, 2, 0, 0, 1),
    ("SAM decoder", (1, 128, 128, 64), 32, 2, 2, 0, 0, 1),
    ("LaMa 512²", (1, 64, 64, 512), 256, 3, 2, 1, 1, 1),
    ("LaMa 512²", (1, 128, 128, 256), 128, 3, 2, 1, 1, 1),
    ("LaMa 512²", (1, 256, 256, 128), 64, 3, 2, 1, 1, 1),
    ("SAM upscale", (16, 56, 56, 64), 64, 2, 2, 0, 0, 1),
    ("DCGAN", (16, 32, 32, 128), 64, 4, 2, 1, 0, 1),
    ("stride 1", (8, 32, 32, 64), 64, 3, 1, 1, 0, 1),
    ("few channels", (8, 64, 64, 8), 8, 3, 2, 1, 1, 1),
    ("grouped", (8, 32, 32, 64), 64, 3, 2, 1, 1, 4),
    ("grouped", (8, 32, 32, 128), 128, 4, 2, 1, 0, 32),
    ("depthwise", (8, 64, 64, 128), 128, 4, 2, 1, 0, 128),
    ("1-D audio", (8, 2048, 64), 32, 4, 2, 1, 0, 1),
    ("1-D audio", (4, 4096, 16), 16, 16, 8, 4, 0, 1),
]


def _convt_setup(shape, c_out, k, g, dtype=mx.float32):
    def make(scale: float) -> tuple[mx.array, ...]:
        n = max(1, round(shape[0] * scale))
        keys = mx.random.split(mx.random.key(0), 3)
        x = mx.random.normal((n, *shape[1:]), key=keys[0]).astype(dtype)
        w = (0.05 * mx.random.normal((c_out, *(k,) * (len(shape) - 2), shape[-1] // g), key=keys[1]))
        return x, w.astype(dtype), mx.random.normal((c_out,), key=keys[2]).astype(dtype)
    return make


def _convt_torch_inputs(groups: int) -> Callable[[tuple[mx.array, ...], str], tuple]:
    from mlxnet.weights.layout import to_torch_layout

    def convert(xs: tuple[mx.array, ...], device: str) -> tuple:
        x, b = channels_first((xs[0], xs[2]), device)
        kind = f"conv_transpose{xs[0].ndim - 2}d"
        w = torch.from_numpy(to_torch_layout(np.array(xs[1].astype(mx.float32)), kind, groups))
        return x, w.to(device=device, dtype=x.dtype), b
    return convert


def _convt_cases() -> list[Case]:
    """Per shape: the dispatcher, and on a GPU also each forward method it chooses from."""
    from mlxnet.ops.conv_transpose import kernel as conv_transpose_kernel
    from mlxnet.ops.conv_transpose.definition import _run

    cases = []
    on_gpu = mlxnet.backend() != "cpu"
    for label, shape, c_out, k, s, p, op, g in CONV_TRANSPOSE_SHAPES:
        nd = len(shape) - 2
        prm = dict(stride=s, padding=p, output_padding=op, groups=g)
        mlx_op = mx.conv_transpose1d if nd == 1 else mx.conv_transpose2d
        torch_op = F.conv_transpose1d if nd == 1 else F.conv_transpose2d
        name = (f"convT{nd}d {label} {'x'.join(map(str, shape))}->{c_out} k{k} s{s}"
                + (f" g{g}" if g > 1 else ""))
        methods = {"dispatch" if on_gpu else "reference": getattr(ops, f"conv_transpose{nd}d")}
        if on_gpu:  # the forward methods the GPU dispatcher picks from
            for m, impl in conv_transpose_kernel.FORWARD.items():
                methods[m] = (lambda impl, nd: lambda x, w, b, **kw: _run(
                    nd, impl, x, w, b, kw["stride"], kw["padding"], kw["output_padding"], 1,
                    kw["groups"]))(impl, nd)  # bind nd now: the loop moves on
        for m, fn in methods.items():
            cases.append(Case(
                "conv_transpose", f"{name} [{m}]", _convt_setup(shape, c_out, k, g),
                (lambda fn, prm: lambda x, w, b: fn(x, w, b, **prm))(fn, prm),
                # MLX's CPU conv_transpose takes seconds per call: only timed on a GPU here.
                (lambda f, prm: lambda x, w, b: f(x, w, **prm) + b)(mlx_op, prm) if on_gpu else None,
                (lambda f, prm: lambda x, w, b: f(x, w, b, **prm))(torch_op, prm) if F else None,
                _convt_torch_inputs(g), record=label.startswith(("LaMa", "SAM")) and m != "builtin"))
    return cases


CONV_TRANSPOSE: list[Case] = _convt_cases()

# ---- fft ---------------------------------------------------------------------------------
# LaMa's Fourier unit: rfft2 then irfft2 (norm 'ortho') of an NHWC map, mlxnet's in the planar
# layout LaMa uses. At a 512² image the maps are 64² with 192 channels; 2048² images give 256².
# mlxnet uses the DFT GEMMs up to ops.fft.definition._MAX_DFT per side, mx.fft beyond it.


def _fft_case(shape: tuple) -> Case:
    hw = shape[1:3]
    return Case(
        "fft", f"rfft2+irfft2 ortho fp32 {'x'.join(map(str, shape))}", _act(shape),
        lambda x: ops.fft.irfft2_planar(ops.fft.rfft2_planar(x, "ortho"), s=hw, norm="ortho"),
        lambda x: mx.fft.irfft2(mx.fft.rfft2(x, axes=(1, 2), norm="ortho"), s=hw, axes=(1, 2), norm="ortho"),
        lambda t: torch.fft.irfftn(torch.fft.rfftn(t, dim=(-2, -1), norm="ortho"), s=hw, dim=(-2, -1),
                                   norm="ortho"),
        record=shape[1:] == (64, 64, 192))


FFT = [_fft_case((n, s, s, 192)) for n in (1, 8) for s in (32, 64, 128, 256)]

# ---- pad ---------------------------------------------------------------------------------
# LaMa reflect-pads every 3×3 conv's input: 64² maps of 128 + 384 channels at a 512² image,
# and 3 pixels around the 512² map before its last 7×7 conv. MLX has no reflect mode: its
# zero-padding mx.pad is the built-in copy beside it.


def _pad_case(shape: tuple, p: int, dtype: mx.Dtype) -> Case:
    short = {mx.float32: "fp32", mx.float16: "fp16"}[dtype]
    return Case(
        "pad", f"pad2d reflect {p} {short} {'x'.join(map(str, shape))}", _act(shape, dtype),
        lambda x: ops.pad2d(x, (p, p, p, p), "reflect"),
        lambda x: mx.pad(x, ((0, 0), (p, p), (p, p), (0, 0))),
        lambda t: F.pad(t, (p, p, p, p), mode="reflect"),
        record=shape == (8, 64, 64, 384) and dtype == mx.float32)


PAD = [_pad_case(shape, p, dt) for shape, p in (((8, 64, 64, 128), 1), ((8, 64, 64, 384), 1),
                                                  ((8, 512, 512, 64), 3))
       for dt in (mx.float32, mx.float16)]

CASES: list[Case] = POOLING + CONV_TRANSPOSE + FFT + PAD


# ---- timing ------------------------------------------------------------------------------

def _leaves(out: Any) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _time(prepare: Callable[[int], Callable[[], None]], target_s: float = 0.05,
          batches: int = 7) -> float:
    """Median seconds per call. ``prepare(reps)`` does the untimed work (building MLX's lazy
    graph) and returns the timed part; reps grows until a batch takes ~target_s."""
    prepare(1)()
    reps = 1
    while True:
        run = prepare(reps)
        t = time.perf_counter()
        run()
        dt = time.perf_counter() - t
        if dt >= target_s or reps >= 64:
            break
        reps = min(64, reps * max(2, int(target_s / max(dt, 1e-6))))
    samples = []
    for _ in range(batches):
        run = prepare(reps)
        t = time.perf_counter()
        run()
        samples.append((time.perf_counter() - t) / reps)
    return statistics.median(samples)


def time_mlx(f: Callable, xs: tuple) -> float:
    """Evaluation time only: the graph (Python dispatch included) is built before the clock."""
    def prepare(reps: int) -> Callable[[], None]:
        outs = [_leaves(f(*xs)) for _ in range(reps)]
        return lambda: mx.eval(outs)
    return _time(prepare)


def torch_device() -> str:
    return "cuda" if torch is not None and torch.cuda.is_available() else "cpu"


def time_torch(f: Callable, ts: tuple) -> float:
    """Eager PyTorch: launches are asynchronous on CUDA, so the clock covers the GPU work."""
    sync = torch.cuda.synchronize if torch_device() == "cuda" else (lambda: None)

    def prepare(reps: int) -> Callable[[], None]:
        sync()

        def run() -> None:
            with torch.no_grad():
                for _ in range(reps):
                    f(*ts)
            sync()
        return run
    return _time(prepare)


def copy_bandwidth() -> float:
    """GB/s of ``x + 0`` on 256 MiB of float32 (read + write)."""
    x = mx.random.normal((64 * 1024 * 1024,))
    mx.eval(x)
    t = time_mlx(lambda x: x + 0, (x,))
    return 2 * x.nbytes / t / 1e9


def nbytes(xs: Sequence[mx.array], outs: Sequence[mx.array]) -> int:
    return sum(a.nbytes for a in xs) + sum(o.nbytes for o in outs)


def run_case(case: Case, scale: float, copy_gbps: float) -> dict:
    xs = case.setup(scale)
    mx.eval(xs)
    outs = _leaves(case.mlxnet(*xs))
    mx.eval(outs)
    row: dict[str, Any] = dict(section=case.section, case=case.name, record=case.record,
                               input_shapes=[list(x.shape) for x in xs])
    row["mlxnet_ms"] = time_mlx(case.mlxnet, xs) * 1e3
    row["mlx_ms"] = time_mlx(case.mlx, xs) * 1e3 if case.mlx else None
    if case.torch is not None and torch is not None:
        ts = (case.torch_inputs or channels_first)(xs, torch_device())
        row["torch_ms"] = time_torch(case.torch, ts) * 1e3
    else:
        row["torch_ms"] = None
    row["gbps"] = nbytes(xs, outs) / (row["mlxnet_ms"] / 1e3) / 1e9
    row["copy_fraction"] = row["gbps"] / copy_gbps
    row["x_vs_mlx"] = row["mlx_ms"] / row["mlxnet_ms"] if row["mlx_ms"] else None
    row["x_vs_torch"] = row["torch_ms"] / row["mlxnet_ms"] if row["torch_ms"] else None
    return row


def _fmt(v: float | None, spec: str) -> str:
    return format(v, spec) if v is not None else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="run cases whose name contains one of these")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--scale", type=float, default=1.0, help="batch-size factor (quick CPU runs)")
    a = ap.parse_args()
    cases = [c for c in CASES if not a.only or any(s in c.name for s in a.only)]
    cases.sort(key=lambda c: not c.record)
    device = f"{mlxnet.backend()} (kernels {'on' if mlxnet.kernels_enabled() else 'off'})"
    tdev = torch_device() if torch is not None else "absent"
    if tdev == "cuda":
        tdev += f" {torch.cuda.get_device_name()}"
    copy_gbps = copy_bandwidth()
    print(f"mlxnet on {device}; torch on {tdev}; copy bandwidth {copy_gbps:.0f} GB/s")
    print(f"{'case':46s} {'mlxnet ms':>10s} {'MLX ms':>9s} {'torch ms':>9s} {'×MLX':>7s} "
          f"{'×torch':>7s} {'GB/s':>7s} {'%copy':>6s}")
    rows = []
    for case in cases:
        try:
            r = run_case(case, a.scale, copy_gbps)
        except Exception as e:  # one broken case must not hide the others
            print(f"{case.name[:46]:46s} FAILED: {type(e).__name__}: {e}", flush=True)
            rows.append(dict(section=case.section, case=case.name, error=f"{type(e).__name__}: {e}"))
            continue
        rows.append(r)
        print(f"{case.name[:46]:46s} {r['mlxnet_ms']:10.4f} {_fmt(r['mlx_ms'], '9.4f')} "
              f"{_fmt(r['torch_ms'], '9.4f')} {_fmt(r['x_vs_mlx'], '7.1f')} "
              f"{_fmt(r['x_vs_torch'], '7.2f')} {r['gbps']:7.1f} {100 * r['copy_fraction']:5.0f}%",
              flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=device, torch_device=tdev, copy_gbps=copy_gbps,
                           mlx_version=mx.__version__, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
