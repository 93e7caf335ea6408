"""Fine-tuning a YOLOv8n, mlxnet against ultralytics: the same data, the same starting weights,
the same settings (both tools' defaults: optimizer auto, warm-up, EMA, mosaic closed for the last
10 epochs), several seeds a side, one machine. Reports each run's mAP50-95 and mAP50 after the
last epoch, seconds per epoch (training and validation, from each tool's results.csv) and peak
memory (the process's resident set on the CPU; the framework's peak allocation on a GPU).

    python scripts/bench/bench_train_detect.py --epochs 15 --seeds 0 1 2 --device cpu --json out.json

Needs ultralytics (and a torchvision matching its torch) in the same environment. The data are
drawn by shapes_dataset.py (no download): a pre-training set, on which ultralytics trains the
starting checkpoint from scratch (--start skips it), and the fine-tuning set both tools train on.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import shapes_dataset  # noqa: E402

ENV = {**os.environ, "YOLO_CONFIG_DIR": os.environ.get("YOLO_CONFIG_DIR", "/tmp/ultralytics-config"),
       "YOLO_OFFLINE": "1"}


def run_ultralytics(data: str, weights: str, out: str, epochs: int, imgsz: int, batch: int, seed: int,
                    device: str, workers: int) -> dict:
    """One ultralytics training in this process (called in a child process by main)."""
    from ultralytics import YOLO

    model = YOLO(weights)
    start = time.perf_counter()
    model.train(data=data, epochs=epochs, imgsz=imgsz, batch=batch, seed=seed, device=0 if device == "gpu" else "cpu",
                workers=workers, project=str(Path(out).parent), name=Path(out).name, exist_ok=True, plots=False,
                verbose=False, amp=device == "gpu")
    peak = None
    if device == "gpu":
        import torch
        peak = torch.cuda.max_memory_allocated() / 2**20
    return {"wall_s": time.perf_counter() - start, "gpu_peak_mib": peak}


def run_mlxnet(data: str, weights: str, out: str, epochs: int, imgsz: int, batch: int, seed: int,
               device: str, workers: int, dtype: str = "auto") -> dict:
    import mlx.core as mx

    import mlxnet
    from mlxnet.commands.grammar import apply_device
    from mlxnet.training.detect_loop import OPS_PER_BUFFER, DetectTrainConfig, train_detector

    apply_device(device, ops_per_buffer=OPS_PER_BUFFER)  # as `mlxnet train detect` sets up its process
    mlxnet.tune_cpu()  # as the mlxnet command tunes its own process (MLXNET_MALLOC=tuned, the default)
    start = time.perf_counter()
    train_detector(DetectTrainConfig(data=data, weights=weights, output=out, epochs=epochs, imgsz=imgsz, batch=batch,
                                     seed=seed, force=True, workers=workers, precision=dtype))
    peak = mx.get_peak_memory() / 2**20 if device == "gpu" else None
    return {"wall_s": time.perf_counter() - start, "gpu_peak_mib": peak}


def read_results(run: Path) -> dict:
    """The last epoch's metrics and the seconds per epoch, from either tool's results.csv."""
    rows = [{k.strip(): v for k, v in r.items()} for r in csv.DictReader((run / "results.csv").read_text().splitlines())]
    last = rows[-1]
    times = [float(r["time"]) for r in rows]  # both tools: seconds since the run began, validation included
    steps = [b - a for a, b in zip(times, times[1:])]
    return {"map50_95": float(last["metrics/mAP50-95(B)"]), "map50": float(last["metrics/mAP50(B)"]),
            "s_per_epoch": times[-1] / len(times),
            # without the first epoch, which pays each tool's one-off start (compiling, caching)
            "s_per_epoch_steady": statistics.median(steps) if steps else times[-1],
            "epochs": len(rows)}


def child_env(tool: str) -> dict[str, str]:
    """The child's environment: mlxnet's as ``mlxnet train detect`` has it, whose own process sets
    MLX's load-time settings (:data:`mlxnet._cuda_graphs.LOAD_TIME_SETTINGS`: the cuDNN plans a
    training step and its validation need exceed MLX's default 128, and a process started as
    ``python -c`` would rebuild them) unless the user set them."""
    if tool != "mlxnet":
        return ENV
    from mlxnet._cuda_graphs import LOAD_TIME_SETTINGS

    return {**LOAD_TIME_SETTINGS, **ENV}


def child(tool: str, args: argparse.Namespace, seed: int, out: Path) -> dict:
    """Run one training in a fresh process; its peak resident memory from the kernel's accounting
    of that process (wait4)."""
    import tempfile

    code = (f"import json, sys; sys.path.insert(0, {str(HERE)!r}); import bench_train_detect as b; "
            f"print('RESULT ' + json.dumps(b.run_{tool}({args.data!r}, {args.start!r}, {str(out)!r}, {args.epochs}, "
            f"{args.imgsz}, {args.batch}, {seed}, {args.device!r}, {args.workers}"
            f"{', ' + repr(args.dtype) if tool == 'mlxnet' else ''})))")
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", code], env=child_env(tool), stdout=stdout, stderr=stderr,
                                text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        stdout.seek(0), stderr.seek(0)
        text, errors = stdout.read(), stderr.read()
    if proc.returncode:
        raise SystemExit(f"{tool} seed {seed} failed:\n{errors[-3000:]}")
    result = json.loads(next(line for line in text.splitlines() if line.startswith("RESULT "))[7:])
    result["rss_peak_mib"] = usage.ru_maxrss / 1024  # Linux reports KiB
    return {**result, **read_results(out), "tool": tool, "seed": seed}


def pretrain(work: Path, epochs: int, imgsz: int, device: str) -> str:
    data = shapes_dataset.make(work / "pretrain-data", train=128, val=32, seed=100)
    code = (f"import sys; sys.path.insert(0, {str(HERE)!r}); import bench_train_detect as b; "
            f"b.run_ultralytics({str(data)!r}, 'yolov8n.yaml', {str(work / 'pretrain')!r}, {epochs}, {imgsz}, 16, 0, "
            f"{device!r}, 2)")
    subprocess.run([sys.executable, "-c", code], env=ENV, check=True, capture_output=True)
    return str(work / "pretrain" / "weights" / "last.pt")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", default="/tmp/mlxnet-bench-train-detect")
    p.add_argument("--start", default=None, help="starting checkpoint (default: pre-trained here by ultralytics)")
    p.add_argument("--pretrain-epochs", type=int, default=30)
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--imgsz", type=int, default=192)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--tools", nargs="+", default=["ultralytics", "mlxnet"])
    p.add_argument("--dtype", default="auto", help="mlxnet's --dtype (auto: bfloat16 on a GPU, float32 on the CPU)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    work = Path(args.work)
    args.data = str(shapes_dataset.make(work / "finetune-data", train=128, val=32, seed=1))
    if args.start is None:
        args.start = pretrain(work, args.pretrain_epochs, args.imgsz, args.device)
    runs = []
    for seed in args.seeds:
        for tool in args.tools:
            r = child(tool, args, seed, work / f"{tool}-{seed}")
            runs.append(r)
            print(json.dumps(r), flush=True)
    summary = {}
    for tool in args.tools:
        mine = [r for r in runs if r["tool"] == tool]
        summary[tool] = {k: [r[k] for r in mine] for k in ("map50_95", "map50", "s_per_epoch", "s_per_epoch_steady", "rss_peak_mib",
                                                           "gpu_peak_mib")}
    print(f"{'tool':<12}{'mAP50-95 (mean, spread)':>28}{'mAP50':>10}{'s/epoch':>10}{'steady':>10}{'peak MiB':>10}")
    for tool, s in summary.items():
        peak = s["gpu_peak_mib"] if args.device == "gpu" else s["rss_peak_mib"]
        peak = [v for v in peak if v is not None]
        print(f"{tool:<12}{statistics.mean(s['map50_95']):>14.4f} ({min(s['map50_95']):.4f}-{max(s['map50_95']):.4f})"
              f"{statistics.mean(s['map50']):>10.4f}{statistics.median(s['s_per_epoch']):>10.2f}"
              f"{statistics.median(s['s_per_epoch_steady']):>10.2f}"
              f"{(max(peak) if peak else float('nan')):>10.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": {k: v for k, v in vars(args).items()}, "runs": runs,
                                               "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
