"""GPU kernel time, kernel launches, peak memory and wall time per forward, mlxnet beside
PyTorch eager and torch.compile, each row and side in a fresh process.

    python scripts/bench/gpu_kernels_memory.py --quick --out gpu-kernels.json
    python scripts/bench/gpu_kernels_memory.py --rows resnet50:8:float16 yolov8m:8:float16 \\
        --sides mlxnet,eager,compile,compile-ro --out more.json
    python scripts/bench/gpu_kernels_memory.py --dry-run --quick   # the orchestration on the CPU

A row is ``model:batch:dtype`` (a ``mlxnet bench`` id). The sides:

- ``mlxnet``: mlxnet's default forward (after ``mlxnet.tune_gpu()``, as the ``mlxnet`` command
  runs);
- ``mlxnet-low``: the same after ``mlxnet.tune_gpu(low_memory=True)`` (the command's
  ``MLXNET_GPU_MEMORY=low``: one kernel per MLX command buffer on CUDA);
- ``mlxnet-min``: after ``mlxnet.tune_gpu(low_memory=True, memory_limit=0)`` (the command's
  ``MLXNET_GPU_MEMORY=min``: MLX also waits for each kernel before it queues the next);
- ``eager``: the workload's PyTorch reference (torchvision, ultralytics, MobileSAM or the
  plain-torch twins), eager;
- ``compile``: the same module under ``torch.compile`` (default mode);
- ``compile-ro``: ``torch.compile(mode="reduce-overhead")`` (CUDA graphs), run for its wall time
  at batch 1 (where the host's launch cost is what it removes).

Per side: GPU kernel ms per forward (the sum of the kernel, memcpy and memset durations CUPTI
records through torch.profiler, which sees MLX's kernels as well as PyTorch's since both run in
the profiled process), their number per forward, peak memory of one forward after a warm-up (MLX's
``get_peak_memory`` / PyTorch's ``max_memory_allocated``, caches emptied and the peak reset just
before; the weights and inputs are resident and counted once, and the weights' bytes are stated
beside it), and the median wall ms per forward (no profiler attached). Each side runs in its own
process, so one side's caches, compiled kernels and allocator pools do not count in another's
memory, and a crash or a hang (with ``--timeout``) loses one cell, not the run.

Without an NVIDIA GPU the script says so and exits 2. ``--dry-run`` runs everything on the CPU
(MLX's CPU device, PyTorch on the CPU) to check the orchestration; kernel columns are then
"n/a (no CUDA)" and PyTorch's memory too (it keeps no peak statistics for the CPU).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
SIDES = ("mlxnet", "mlxnet-low", "mlxnet-min", "eager", "compile", "compile-ro")
MLX_SIDES = SIDES[:3]
TORCH_SIDES = SIDES[3:]
GPU_MEMORY = {"mlxnet-low": "low", "mlxnet-min": "min"}  # the MLX sides' mlxnet.GPU_MEMORY_SETTINGS
QUICK = ("resnet50:1:float16", "yolov8n:1:float16", "sam-tiny-encoder:1:float16")
FULL_MODELS = ("resnet50", "yolov8n", "yolov8m", "sam-tiny-encoder", "lama-512")
NO_CUDA = "n/a (no CUDA)"
PROGRESS = "[gkm "  # the prefix of the progress lines a side's process prints (relayed live)
# The run's start (epoch seconds), handed to each side's process so that all progress lines
# count from the same moment.
_T0 = float(os.environ.get("GKM_START", time.time()))


def log(message: str) -> None:
    """A progress line with the time of day and the seconds since the script started (to
    stderr, so the JSON and the table on stdout stay clean): torch.compile can take a minute,
    and a long run should show where it is."""
    now = datetime.datetime.now().strftime("%H:%M:%S")
    print(f"{PROGRESS}{now} +{time.time() - _T0:6.1f}s] {message}", file=sys.stderr, flush=True)


def one_line(text: str, limit: int = 160) -> str:
    """The first non-empty line of an error, short enough for a table cell."""
    line = next((s.strip() for s in str(text).splitlines() if s.strip()), "?")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def parse_row(text: str) -> tuple[str, int, str]:
    try:
        name, batch, dtype = text.split(":")
        return name, int(batch), dtype
    except ValueError:
        raise SystemExit(f"gpu_kernels_memory: a row is model:batch:dtype, got {text!r}") from None


def row_id(row: tuple[str, int, str]) -> str:
    return ":".join(map(str, row))


# --- one side of one row, in its own process -------------------------------------------------


def torch_weights_bytes(module: Any) -> int:
    """Bytes of a PyTorch module's parameters and buffers (each tensor once)."""
    seen, total = set(), 0
    for t in [*module.parameters(), *module.buffers()]:
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def mlx_weights_bytes(forward: Callable[[], Any]) -> int | None:
    """Bytes of the parameters of the MLX modules a workload's forward closes over (the
    workloads keep their model in the closure; None where none is found)."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    modules = [c.cell_contents for c in (forward.__closure__ or ())
               if isinstance(getattr(c, "cell_contents", None), nn.Module)]
    if not modules:
        return None
    seen, total = set(), 0
    for m in modules:
        for _, a in tree_flatten(m.parameters()):
            if id(a) not in seen:
                seen.add(id(a))
                total += a.nbytes
    return total


def memory_mlx(run: Callable[[], None]) -> dict:
    """Resident bytes (weights and inputs) before one forward and MLX's peak over it."""
    import mlx.core as mx

    from mlxnet.benchmark import measure

    measure.free()
    resident = mx.get_active_memory()
    return {"resident_bytes": int(resident), "peak_bytes": measure.peak_bytes(run)}


def memory_torch(run: Callable[[], None]) -> dict:
    """The same for PyTorch's CUDA allocator: what is allocated before one forward and its
    peak over it (the caching allocator's reserve is not counted, as MLX's cache is not)."""
    import torch

    from mlxnet.benchmark import measure

    measure.free()
    torch.cuda.synchronize()
    resident = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run()
    return {"resident_bytes": int(resident), "peak_bytes": int(torch.cuda.max_memory_allocated())}


def kernels(run: Callable[[], None], reps: int, trace: Path) -> dict:
    """Kernel ms and kernels per forward, through profile_gpu.profile (its reading of the
    profiler's trace is the one the earlier GPU profiles used)."""
    import profile_gpu  # scripts/bench, beside this file

    stats = profile_gpu.profile(run, reps, trace)
    if not stats["kernels"]:
        # a forward on the GPU runs kernels: none recorded means CUPTI was not tracing (another
        # profiler attached, or no permission for GPU counters), not a free forward
        return {"kernel_ms": None, "kernels": None, "kernel_note": "n/a (profiler saw no kernels)"}
    return {"kernel_ms": stats["busy_ms"], "kernels": stats["kernels"],
            "kernel_ms_events": stats["busy_ms_events"], "kernels_events": stats["kernels_events"],
            "profiled_wall_ms": stats["wall_ms"], "gpu_idle_ms": stats["gaps"]["idle_ms"],
            "by_kind_ms": stats["by_kind"]}


def build_side(name: str, batch: int, dtype: str, side: str, device: str,
               compile_backend: str) -> tuple[Callable[[], None], dict]:
    """The timed call of one side and what it runs (note, dtype, weights' bytes)."""
    from mlxnet.benchmark import measure
    from mlxnet.benchmark.workloads import entries

    table = entries()
    if name not in table:
        raise ValueError(f"unknown model {name!r} (mlxnet bench --list names them)")
    work = table[name].build(device, batch, dtype)
    if side in MLX_SIDES:
        return measure.mlx_runner(work.forward), {"note": work.note, "dtype": dtype,
                                                   "weights_bytes": mlx_weights_bytes(work.forward)}
    if work.torch is None:
        raise ValueError(f"{name} has no PyTorch reference")
    ref = work.torch()
    module = ref.module
    if side in ("compile", "compile-ro"):
        import torch

        kwargs: dict[str, Any] = {"backend": compile_backend}
        if side == "compile-ro" and compile_backend == "inductor":
            kwargs["mode"] = "reduce-overhead"
        # (reduce-overhead is an Inductor mode: the test hook's "eager" back end runs without it)
        module = torch.compile(module, **kwargs)
    return measure.torch_runner(module, ref.inputs, device), {
        "note": ref.note, "dtype": ref.dtype, "weights_bytes": torch_weights_bytes(ref.module)}


def measure_side(args: argparse.Namespace) -> dict:
    """Everything one side of one row measures (run in a fresh process)."""
    name, batch, dtype = parse_row(args.child_row)
    side, dry = args.child_side, args.dry_run
    device = "cpu" if dry else "gpu"
    label = f"{args.child_row} {side}"
    import mlxnet
    from mlxnet.benchmark import measure

    # direct launches, as the mlxnet command runs (before any GPU work); one kernel per command
    # buffer for the low-memory sides, and MLX waiting for each kernel for "min" (on the CPU of
    # a dry run too: MLX's memory limit holds on every device)
    mlxnet.tune_gpu(**mlxnet.GPU_MEMORY_SETTINGS[GPU_MEMORY.get(side, "default")])
    # MLX runs on the GPU only for its own side: a PyTorch side builds the MLX model too (the
    # workload builds both), which on the CPU costs that process no GPU memory or launches.
    mlxnet.use_device("gpu" if side in MLX_SIDES and not dry else "cpu")
    if not dry:
        import torch

        # CUPTI records through PyTorch's profiler; a CUDA context of PyTorch's own makes sure
        # it is set up in the MLX-only process too (PyTorch's allocator is not what is read there).
        torch.cuda.init()
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
    log(f"{label}: building")
    if args.fail_side == side:
        raise RuntimeError(f"deliberate failure of {side} (--fail-side)")
    run, info = build_side(name, batch, dtype, side, device, args.compile_backend)
    # torch.compile compiles on its first calls; reduce-overhead records its CUDA graphs after
    # a few more: extra warm-up there.
    warmup = args.warmup + (3 if side in ("compile", "compile-ro") else 0)
    t = time.perf_counter()
    for i in range(warmup):
        run()
        if i == 0:
            log(f"{label}: first call {time.perf_counter() - t:.1f} s")
    log(f"{label}: warm ({warmup} calls, {time.perf_counter() - t:.1f} s); memory")
    result: dict[str, Any] = {"side": side, **info}
    if side in MLX_SIDES:
        result.update(memory_mlx(run))
    elif not dry:
        result.update(memory_torch(run))
    else:
        result.update(resident_bytes=None, peak_bytes=None)
    log(f"{label}: wall ({args.reps} calls)")
    times = measure.time_alternating({side: run}, 0, args.reps)[side]
    result["wall_ms"], result["wall_spread_ms"] = measure.summary(times)
    if dry:
        result.update(kernel_ms=None, kernels=None)
    else:
        log(f"{label}: profiling ({args.profile_reps} calls)")
        trace_dir = Path(args.traces) if args.traces else Path(tempfile.mkdtemp(prefix="gkm-"))
        trace_dir.mkdir(parents=True, exist_ok=True)
        trace = trace_dir / f"trace-{name}-b{batch}-{dtype}-{side}.json"
        result.update(kernels(run, args.profile_reps, trace))
        if not args.traces:
            trace.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                trace_dir.rmdir()
    log(f"{label}: done")
    return result


def child_main(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(HERE))  # profile_gpu, beside this file
    try:
        result = measure_side(args)
    except BaseException as e:  # noqa: BLE001 - the parent reports it as the side's cell
        traceback.print_exc()
        result = {"side": args.child_side, "error": one_line(f"{type(e).__name__}: {e}")}
    Path(args.child_result).write_text(json.dumps(result))
    return 0


# --- the orchestration ------------------------------------------------------------------------


def run_side(row: str, side: str, args: argparse.Namespace) -> dict:
    """One side of one row in a fresh Python process, with a time limit. Its progress lines
    are relayed as they come; its other output is kept for the failure message."""
    with tempfile.TemporaryDirectory(prefix="gkm-") as tmp:
        result_file = Path(tmp) / "result.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child-row", row, "--child-side", side,
               "--child-result", str(result_file), "--reps", str(args.reps),
               "--profile-reps", str(args.profile_reps), "--warmup", str(args.warmup),
               "--compile-backend", args.compile_backend]
        cmd += ["--dry-run"] * args.dry_run + (["--fail-side", args.fail_side] if args.fail_side else [])
        cmd += ["--traces", args.traces] if args.traces else []
        env = dict(os.environ)
        # As the mlxnet command starts itself on CUDA builds: room for every convolution plan.
        env.setdefault("MLX_CUDA_CONV_CACHE_SIZE", "16384")
        env["GKM_START"] = repr(_T0)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
        tail: collections.deque[str] = collections.deque(maxlen=40)

        def relay() -> None:
            for line in proc.stdout:  # type: ignore[union-attr]
                if line.startswith(PROGRESS):
                    print(line, end="", file=sys.stderr, flush=True)
                elif line.strip():
                    tail.append(line.rstrip())

        reader = threading.Thread(target=relay, daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the side's own process group (torch.compile's workers too)
            proc.wait()
            reader.join(5)
            if result_file.exists():  # measured, then stuck on the way out (compile workers): keep it
                return dict(json.loads(result_file.read_text()), exit="killed after its result")
            return {"side": side, "error": f"timed out after {args.timeout:g} s", "log_tail": list(tail)}
        reader.join(5)
        if result_file.exists():
            result = json.loads(result_file.read_text())
            if "error" in result:
                result["log_tail"] = list(tail)
            return result
        last = tail[-1] if tail else "no output"
        return {"side": side, "error": one_line(f"exit code {rc}: {last}"), "log_tail": list(tail)}


def mb(n: float | None) -> float | None:
    return None if n is None else n / 2**20


def row_label(row: str) -> str:
    name, batch, dtype = parse_row(row)
    return f"{name} b{batch} {dtype.replace('float', 'fp')}"


def cell(sides: dict[str, dict], side: str, key: str, fmt: str, dry: bool, told: set[str]) -> str:
    """One side's value in a table cell: the number, "failed: <why>" (the why only in the row's
    first cell of that side, "failed" after), "n/a …" or "–" (not run)."""
    r = sides.get(side)
    if r is None:
        return "–"
    if "error" in r:
        if side in told:
            return "failed"
        told.add(side)
        return "failed: " + r["error"].replace("|", "\\|")
    value = r.get(key)
    if value is None:
        return NO_CUDA if dry else r.get("kernel_note", "n/a") if key in ("kernel_ms", "kernels") else "n/a"
    return format(value, fmt)


def table(report: dict) -> str:
    """The issue's column layout: kernel ms, kernels per forward and peak MB for mlxnet /
    PyTorch eager / torch.compile; wall ms for mlxnet / torch.compile(reduce-overhead); then
    the weights each peak holds."""
    dry = report["dry_run"]
    head = ["row", "GPU kernel ms per forward: mlxnet / eager / compile",
            "kernels per forward: mlxnet / eager / compile",
            "peak MB: mlxnet / mlxnet low-memory / mlxnet min-memory / eager / compile",
            "wall ms: mlxnet / compile (reduce-overhead)", "weights MB (in the peak): mlxnet / PyTorch"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    three = ("mlxnet", "eager", "compile")
    for row in report["rows"]:
        s = {r["side"]: dict(r, peak_mb=mb(r.get("peak_bytes")), weights_mb=mb(r.get("weights_bytes")))
             for r in row["sides"]}
        told: set[str] = set()
        torch_side = next((x for x in TORCH_SIDES if x in s and "error" not in s[x]), TORCH_SIDES[0])
        cells = [row_label(row["row"]),
                 " / ".join(cell(s, x, "kernel_ms", ".2f", dry, told) for x in three),
                 " / ".join(cell(s, x, "kernels", ".0f", dry, told) for x in three),
                 " / ".join(cell(s, x, "peak_mb", ".0f", dry, told) for x in ("mlxnet", "mlxnet-low", "mlxnet-min", *three[1:])),
                 " / ".join(cell(s, x, "wall_ms", ".2f", dry, told) for x in ("mlxnet", "compile-ro")),
                 " / ".join(cell(s, x, "weights_mb", ".0f", dry, told) for x in ("mlxnet", torch_side))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine_info(dry: bool) -> dict:
    from mlxnet.benchmark import machine

    info = machine.describe("cpu" if dry else "gpu")
    import torch

    info["torch"] = torch.__version__
    if not dry:
        info["torch_gpu"] = torch.cuda.get_device_name(0)
    return info


def no_cuda_reason() -> str | None:
    """Why the GPU sides cannot run here, or None where both libraries see an NVIDIA GPU."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return "PyTorch sees no CUDA GPU"
    from mlxnet.device import gpu_backend

    if gpu_backend() != "cuda":
        return "MLX is not a CUDA build here (pip install 'mlx[cuda]')"
    return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--rows", nargs="+", help="model:batch:dtype rows (default: --quick's)")
    ap.add_argument("--quick", action="store_true", help="ResNet-50, YOLOv8n, SAM-tiny encoder, b1 fp16")
    ap.add_argument("--full", action="store_true",
                    help=f"{', '.join(FULL_MODELS)} at batch 1 and 8 in float16 and float32")
    ap.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated, of {','.join(SIDES)}")
    ap.add_argument("--out", help="JSON report")
    ap.add_argument("--traces", help="keep each side's Chrome trace in this folder")
    ap.add_argument("--reps", type=int, default=50, help="timed calls for the wall median")
    ap.add_argument("--profile-reps", type=int, default=5, help="profiled calls for the kernel sums")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=420.0, help="seconds a side's process may take")
    ap.add_argument("--dry-run", action="store_true", help="run everything on the CPU (no kernel figures)")
    ap.add_argument("--compile-backend", default="inductor", help=argparse.SUPPRESS)  # tests: "eager"
    ap.add_argument("--fail-side", choices=SIDES, help=argparse.SUPPRESS)  # tests: a side that fails
    ap.add_argument("--child-row", help=argparse.SUPPRESS)
    ap.add_argument("--child-side", help=argparse.SUPPRESS)
    ap.add_argument("--child-result", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def planned_rows(args: argparse.Namespace) -> list[str]:
    if args.full:
        rows = [f"{m}:{b}:{d}" for m in FULL_MODELS for b in (1, 8) for d in ("float16", "float32")]
    else:
        rows = list(args.rows or ()) + (list(QUICK) if args.quick or not args.rows else [])
    for r in rows:
        parse_row(r)
    return list(dict.fromkeys(rows))


def planned_sides(args: argparse.Namespace, row: str) -> list[str]:
    """The sides asked for; reduce-overhead only at batch 1 unless the row list names it alone
    (at batch 8 the GPU, not the host, bounds the forward)."""
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    for s in sides:
        if s not in SIDES:
            raise SystemExit(f"gpu_kernels_memory: unknown side {s!r}; expected {', '.join(SIDES)}")
    batch = parse_row(row)[1]
    return [s for s in sides if s != "compile-ro" or batch == 1 or sides == ["compile-ro"]]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child_row:
        return child_main(args)
    rows = planned_rows(args)
    if not args.dry_run:
        reason = no_cuda_reason()
        if reason:
            print(f"gpu_kernels_memory: no CUDA here ({reason}); --dry-run runs the orchestration on the CPU",
                  file=sys.stderr)
            return 2
    report: dict[str, Any] = {"dry_run": args.dry_run, "machine": machine_info(args.dry_run),
                              "settings": {k: getattr(args, k) for k in
                                           ("reps", "profile_reps", "warmup", "timeout", "compile_backend")},
                              "rows": []}
    jobs = [(row, side) for row in rows for side in planned_sides(args, row)]
    log(f"{len(rows)} rows, {len(jobs)} processes{' (dry run on the CPU)' if args.dry_run else ''}")
    done = 0
    for row in rows:
        sides = []
        for side in planned_sides(args, row):
            done += 1
            log(f"{row} {side}: process {done} of {len(jobs)}")
            t = time.monotonic()
            result = run_side(row, side, args)
            result["process_s"] = round(time.monotonic() - t, 1)
            status = f"failed: {result['error']}" if "error" in result else f"{result['wall_ms']:.2f} ms wall"
            log(f"{row} {side}: {status} ({result['process_s']} s)")
            sides.append(result)
        report["rows"].append({"row": row, "sides": sides})
        if args.out:  # written after every row, so a run stopped part way keeps what it measured
            Path(args.out).write_text(json.dumps(report, indent=1))
    markdown = table(report)
    report["table"] = markdown
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    from mlxnet.benchmark import machine

    print("\n".join(machine.summary(report["machine"])))
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
