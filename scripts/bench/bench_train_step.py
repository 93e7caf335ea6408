"""One training step of a detector (forward, the v8 detection loss, backward), mlxnet against
ultralytics' PyTorch model and loss, on the same machine in one run: the step a fine-tune
repeats, without data loading, the optimizer or validation.

    python scripts/bench/bench_train_step.py --model yolov8n --imgsz 192 --batch 16 --json out.json

Rows: ``mlxnet`` (the ops' fast faces and their gradients, as ``mlxnet train detect`` runs),
``mlxnet-definitions`` (every op its MLX definition, MLX's own gradients) and ``ultralytics``
(DetectionModel + v8DetectionLoss, float32, where ultralytics is installed). Each row runs in a
fresh process; the median of --steps timed steps after two untimed ones.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ENV = {**os.environ, "YOLO_CONFIG_DIR": os.environ.get("YOLO_CONFIG_DIR", "/tmp/ultralytics-config"),
       "YOLO_OFFLINE": "1"}


def _boxes(batch: int, imgsz: int) -> list[list[list[float]]]:
    """Two boxes per image (x1, y1, x2, y2 in pixels), the same for both tools."""
    s = imgsz / 192
    return [[[10 * s, 10 * s, 60 * s, 80 * s], [50 * s, 60 * s, 150 * s, 120 * s]] for _ in range(batch)]


def run_mlxnet(model: str, imgsz: int, batch: int, steps: int, fast: bool) -> list[float]:
    import mlx.core as mx
    import numpy as np

    import mlxnet
    from mlxnet.device import use_kernels
    from mlxnet.models.yolo import build_variant
    from mlxnet.training.detect_loop import _for_training, _step_function
    from mlxnet.training.detection_loss import LossSettings, Targets, detection_loss

    mlxnet.tune_cpu()  # as the mlxnet command tunes its own process
    net = _for_training(build_variant(model, 80))
    images = mx.array(np.random.default_rng(0).random((batch, imgsz, imgsz, 3), dtype=np.float32))
    boxes = [np.array(b, np.float32) for b in _boxes(batch, imgsz)]
    t = Targets.from_lists(boxes, [np.array([1, 2], np.float32)] * batch, bucket=True)

    def loss_fn(m, x, targets, whole):
        return detection_loss(m.train_outputs(x), targets, (imgsz, imgsz), num_classes=80,
                              settings=LossSettings(), batch_size=whole)
    step = _step_function(net, loss_fn)
    times = []
    with use_kernels(fast):
        for _ in range(steps + 2):
            start = time.perf_counter()
            mx.eval(step(images, t.boxes, t.classes, batch))
            times.append(time.perf_counter() - start)
    return times[2:]


def run_ultralytics(model: str, imgsz: int, batch: int, steps: int) -> list[float]:
    from types import SimpleNamespace

    import torch
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils.loss import v8DetectionLoss

    net = DetectionModel(f"{model}.yaml", nc=80, verbose=False)
    net.train()
    net.args = SimpleNamespace(box=7.5, cls=0.5, dfl=1.5)
    loss = v8DetectionLoss(net)
    x = torch.rand(batch, 3, imgsz, imgsz, generator=torch.Generator().manual_seed(0))
    xyxy = torch.tensor(_boxes(batch, imgsz)).reshape(-1, 4) / imgsz
    targets = {"batch_idx": torch.arange(batch).repeat_interleave(2).float(),
               "cls": torch.tensor([1.0, 2.0]).repeat(batch),
               "bboxes": torch.cat([(xyxy[:, :2] + xyxy[:, 2:]) / 2, xyxy[:, 2:] - xyxy[:, :2]], 1)}
    times = []
    for _ in range(steps + 2):
        start = time.perf_counter()
        net.zero_grad(set_to_none=True)
        total, _ = loss(net(x), targets)
        total.sum().backward()
        times.append(time.perf_counter() - start)
    return times[2:]


def child(row: str, args: argparse.Namespace) -> list[float] | None:
    call = (f"run_ultralytics({args.model!r}, {args.imgsz}, {args.batch}, {args.steps})" if row == "ultralytics" else
            f"run_mlxnet({args.model!r}, {args.imgsz}, {args.batch}, {args.steps}, {row == 'mlxnet'})")
    code = (f"import json, sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
            f"import bench_train_step as b; print('RESULT ' + json.dumps(b.{call}))")
    proc = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True)
    if proc.returncode:
        if row == "ultralytics" and "No module named" in proc.stderr:
            print("ultralytics: not installed, row left out", file=sys.stderr)
            return None
        raise SystemExit(f"{row} failed:\n{proc.stderr[-3000:]}")
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="yolov8n")
    p.add_argument("--imgsz", type=int, default=192)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rows", nargs="+", default=["mlxnet", "mlxnet-definitions", "ultralytics"])
    p.add_argument("--json", default=None)
    args = p.parse_args()
    results = {}
    for row in args.rows:
        times = child(row, args)
        if times is not None:
            results[row] = {"step_ms": statistics.median(times) * 1000, "steps_ms": [t * 1000 for t in times]}
            print(f"{row:20s} {results[row]['step_ms']:8.0f} ms per step", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
