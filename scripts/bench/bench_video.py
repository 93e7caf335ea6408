"""Video throughput of `mlxnet detect`: frames/s on a 1080p clip for YOLOv8 n/s/m, against the
ceiling of decoding + encoding alone, and against ultralytics where it is given.

    python scripts/bench/bench_video.py [--device cpu|gpu] [--frames 300] [--models yolov8n yolov8s yolov8m]
            [--batch 8] [--imgsz 640] [--ultralytics-python PATH] [--out docs/bench/video-gpu.json] [--keep DIR]

- the clip: ``--frames`` frames of 1920x1080 at 30 frames/s, made from the test fixtures (zidane.jpg
  panned and zoomed as a background, bus.jpg sliding across it), H.264 (libx264, CRF 18), seeded:
  the same file every time;
- ``ceiling``: the video pipeline of `mlxnet detect` (mlxnet/commands/video.py: a decoding
  thread, a drawing and encoding thread) with a model that takes no time and finds nothing: what
  decoding + encoding the clip costs, the most any model can reach. ``decode`` alone, for scale;
- ``in-process``: the same pipeline with each model, its weights loaded and its forward traced on
  one batch first (what a long video sees: frames / wall seconds of the run);
- ``process``: `mlxnet detect clip.mp4 -o DIR --json` as a whole process, from start to exit
  (imports, weights, first-forward compilation, every frame), and its steady rate: frames after
  the first / seconds between the first and the last JSON line;
- ``ultralytics`` (with ``--ultralytics-python``, a Python where ultralytics and torchvision
  import): ``YOLO(weights).predict(clip, stream=True, save=True)`` with its defaults (batch 1,
  float32), as a whole process, and its steady rate from its per-frame lines. Both tools then load
  the same seeded ultralytics ``.pt`` (``YOLO("yolov8n.yaml")`` saved with torch's seed 0);
  without it mlxnet runs ``--weights random`` (seeded).

Speed does not depend on the weights' values, except through how many boxes pass the threshold
(reported as boxes/frame). Prints a table; ``--out`` writes the figures as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "yolo"

ULTRALYTICS_RUN = r"""
import sys, time
from ultralytics import YOLO
source, weights, out, device, imgsz = sys.argv[1:6]
model = YOLO(weights)
for r in model.predict(source, save=True, stream=True, project=out, name="run", exist_ok=True, verbose=False,
                       device=device, imgsz=int(imgsz)):
    print(len(r.boxes), flush=True)
"""

ULTRALYTICS_WEIGHTS = r"""
import sys, torch
from ultralytics import YOLO
torch.manual_seed(0)
YOLO(sys.argv[1] + ".yaml").save(sys.argv[2])
"""


def make_clip(path: Path, frames: int, width: int = 1920, height: int = 1080, fps: int = 30) -> Path:
    """The fixtures in motion: a slow pan and zoom over zidane.jpg, bus.jpg sliding across."""
    import av
    import cv2
    from PIL import Image

    ground = np.asarray(Image.open(FIXTURES / "zidane.jpg").convert("RGB"))
    bus = np.asarray(Image.open(FIXTURES / "bus.jpg").convert("RGB"))
    bus = cv2.resize(bus, (int(bus.shape[1] * height * 0.6 / bus.shape[0]), int(height * 0.6)),
                     interpolation=cv2.INTER_AREA)
    tmp = path.with_suffix(".part.mp4")
    container = av.open(str(tmp), "w")
    stream = container.add_stream("libx264", rate=Fraction(fps))
    stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
    stream.options = {"crf": "18", "preset": "veryfast"}
    for t in range(frames):
        phase = t / max(frames - 1, 1)
        zoom = 1.0 + 0.25 * np.sin(np.pi * phase)  # in and out again
        crop_w, crop_h = int(ground.shape[1] / zoom), int(ground.shape[0] / zoom)
        x0 = int((ground.shape[1] - crop_w) * phase)
        y0 = (ground.shape[0] - crop_h) // 2
        frame = cv2.resize(ground[y0:y0 + crop_h, x0:x0 + crop_w], (width, height), interpolation=cv2.INTER_LINEAR)
        bx = int((width - bus.shape[1]) * (1 - phase))
        by = height - bus.shape[0] - 20
        frame[by:by + bus.shape[0], bx:bx + bus.shape[1]] = bus
        for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")):
            container.mux(packet)
    for packet in stream.encode(None):
        container.mux(packet)
    container.close()
    tmp.rename(path)
    return path


# --- In-process: the pipeline of `mlxnet detect` -----------------------------------------------------

class _Nothing:
    """Detections of a model that finds nothing (what the ceiling's frames carry)."""

    boxes = np.zeros((0, 4))
    scores = np.zeros(0)
    classes = np.zeros(0, np.int64)
    names: tuple[str, ...] = ()

    def to_list(self) -> list:
        return []

    def render(self, image: np.ndarray) -> np.ndarray:
        return image.copy()  # as drawing no box costs: a copy


def _job(clip: Path, out: Path):
    from mlxnet.commands.images import Job, Source

    return Job(Source(str(clip), Path(clip.name)), (out / clip.name,))


def _quiet_run(jobs, **kw) -> float:
    """run_videos' wall seconds, its one line per video kept off the table."""
    import contextlib
    import io

    from mlxnet.commands.video import run_videos

    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        failed = run_videos(jobs, what="bench", as_json=False, **kw)
    if failed:
        raise SystemExit("the video failed in the bench")
    return time.perf_counter() - start


def decode_only(clip: Path) -> float:
    from mlxnet.video import VideoReader

    start = time.perf_counter()
    with VideoReader(clip) as reader:
        count = sum(1 for _ in reader.frames())
    return count / (time.perf_counter() - start)


def ceiling(clip: Path, frames: int, work: Path, batch: int) -> float:
    wall = _quiet_run([_job(clip, work / "out-ceiling")], batch=batch, model=lambda: None,
                      prepare=lambda rgb: None, predict=lambda _, items: [_Nothing() for _ in items])
    return frames / wall


def in_process(clip: Path, frames: int, work: Path, model: str, weights: str, batch: int, imgsz: int
               ) -> tuple[float, float]:
    """(frames/s, boxes per frame) of the detect pipeline with a loaded, traced model."""
    import contextlib

    import mlx.core as mx

    import mlxnet
    from mlxnet import families
    from mlxnet.video import VideoReader

    family = families.for_task(model, "detect")
    detector = family.predictor(weights, model if weights == "random" else None, "float32")
    fixed_batch = batch if batch > 1 and mlxnet.backend() != "cpu" else None
    boxes = [0]

    def predict(det, items):
        found = det.predict_prepared(items, conf=0.25, iou=0.7, max_det=300, batch_size=fixed_batch)
        boxes[0] += sum(len(d) for d in found)
        return found

    builtins = mlxnet.backend() == "cuda" and "MLXNET_KERNELS" not in os.environ  # as detect runs
    with mlxnet.use_kernels(False) if builtins else contextlib.nullcontext():
        with VideoReader(clip) as reader:  # trace the forward at the video's shape and batch first
            first = next(iter(reader.frames())).rgb
        prepared = family.prepare(first, imgsz=imgsz)
        predict(detector, [prepared] * batch)
        mx.synchronize()
        boxes[0] = 0
        wall = _quiet_run([_job(clip, work / f"out-{model}")], batch=batch, model=lambda: detector,
                          prepare=lambda rgb: family.prepare(rgb, imgsz=imgsz), predict=predict)
    return frames / wall, boxes[0] / frames


# --- Whole processes -----------------------------------------------------------------------------

def timed_process(cmd: list[str], env: dict[str, str]) -> dict:
    """Wall seconds of ``cmd`` and the steady rate between its first and last stdout lines."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    err: list[str] = []
    drain = threading.Thread(target=lambda: err.append(proc.stderr.read()))  # type: ignore[union-attr]
    drain.start()
    stamps = []
    assert proc.stdout is not None
    for _ in proc.stdout:
        stamps.append(time.perf_counter() - start)
    code = proc.wait()
    drain.join()
    wall = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"{' '.join(cmd[:5])}... failed ({code}):\n{''.join(err)[-2000:]}")
    steady = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 2 and stamps[-1] > stamps[0] else None
    return {"wall_s": round(wall, 2), "first_frame_s": round(stamps[0], 2) if stamps else None,
            "frames": len(stamps), "steady_fps": round(steady, 2) if steady else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cpu", "gpu"], default=None)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--models", nargs="+", default=["yolov8n", "yolov8s", "yolov8m"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--ultralytics-python", default=None,
                    help="A Python where ultralytics and torchvision import: adds ultralytics' rows.")
    ap.add_argument("--runs", type=int, default=1,
                    help="Run each measurement this many times and keep the fastest (a shared machine's noise).")
    ap.add_argument("--no-process", action="store_true", help="Skip the whole-process runs.")
    ap.add_argument("--out", type=Path, default=None, help="Write the figures as JSON here.")
    ap.add_argument("--keep", type=Path, default=None, help="Work folder to keep (the clip is reused).")
    args = ap.parse_args()

    import mlx.core as mx

    import mlxnet
    from mlxnet import _cuda_graphs

    # In-process runs get what the mlxnet command gives itself on CUDA: MLX's settings read when
    # its library loads (this script starts again once with them) and direct kernel launches.
    missing = _cuda_graphs.missing_load_time_settings()
    if missing:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**os.environ, **missing})
    mlxnet.tune_gpu()
    if args.device:
        try:
            mlxnet.use_device(args.device)
        except mlxnet.MlxnetError as e:  # a GPU that MLX does not see: its one line, no traceback
            raise SystemExit(f"error: {e}") from None
    on_gpu = mx.default_device() == mx.gpu
    work = args.keep or Path(tempfile.mkdtemp(prefix="mlxnet-bench-video-"))
    work.mkdir(parents=True, exist_ok=True)
    clip = work / f"clip-1080p-{args.frames}.mp4"
    if not clip.exists():
        print(f"making {clip.name} ...", file=sys.stderr, flush=True)
        make_clip(clip, args.frames)

    rows: list[dict] = []

    def row(**r) -> None:
        rows.append(r)
        fps = f"{r['fps']:8.2f}" if r.get("fps") else "       -"
        ratio = f"{r['fps'] / rows[1]['fps']:6.0%}" if r.get("fps") and len(rows) > 1 and r is not rows[1] else "     -"
        print(f"{r['what']:34s} {fps}  {ratio}  {r.get('note', '')}", flush=True)

    print(f"{'':34s} {'frames/s':>8s}  {'of ceiling':>6s}", flush=True)
    def best(measure, faster=lambda r: r):
        """The fastest of ``--runs`` measurements (``faster``: the key to maximise)."""
        return max((measure() for _ in range(args.runs)), key=faster)

    row(what="decode only", fps=round(best(lambda: decode_only(clip)), 2))
    row(what="ceiling: decode + encode", fps=round(best(lambda: ceiling(clip, args.frames, work, args.batch)), 2),
        note="detect's pipeline, a model that takes no time")

    upy = args.ultralytics_python
    weights = {m: "random" for m in args.models}
    if upy:
        for m in args.models:
            pt = work / f"{m}-seeded.pt"
            if not pt.exists():
                subprocess.run([upy, "-c", ULTRALYTICS_WEIGHTS, m, str(pt)], check=True, capture_output=True,
                               env=dict(os.environ, YOLO_CONFIG_DIR=str(work / "ultralytics-config")))
            weights[m] = str(pt)
    for m in args.models:
        fps, per_frame = best(lambda: in_process(clip, args.frames, work, m, weights[m], args.batch, args.imgsz),
                              lambda r: r[0])
        row(what=f"{m} mlxnet in-process", fps=round(fps, 2), model=m, kind="in-process",
            boxes_per_frame=round(per_frame, 1), note=f"batch {args.batch}, {per_frame:.0f} boxes/frame")
    if not args.no_process:
        env = dict(os.environ, MLXNET_DEVICE="gpu" if on_gpu else "cpu", YOLO_OFFLINE="1",
                   YOLO_CONFIG_DIR=str(work / "ultralytics-config"))
        for m in args.models:
            w = ["--weights", weights[m]] + (["--model", m] if weights[m] == "random" else [])
            cmd = [sys.executable, "-m", "mlxnet", "detect", str(clip), "-o", str(work / "out-process"), "--json",
                   "--batch", str(args.batch), "--imgsz", str(args.imgsz), *w]
            r = best(lambda: timed_process(cmd, env), lambda r: -r["wall_s"])
            row(what=f"{m} mlxnet detect (process)", fps=round(args.frames / r["wall_s"], 2), model=m,
                kind="process", **r, note=f"{r['wall_s']} s whole, steady {r['steady_fps']} frames/s")
            if upy:
                u = best(lambda: timed_process([upy, "-c", ULTRALYTICS_RUN, str(clip), weights[m],
                                                str(work / "out-ultralytics"), "0" if on_gpu else "cpu",
                                                str(args.imgsz)], env), lambda r: -r["wall_s"])
                row(what=f"{m} ultralytics (process)", fps=round(args.frames / u["wall_s"], 2), model=m,
                    kind="ultralytics", **u, note=f"{u['wall_s']} s whole, steady {u['steady_fps']} frames/s")
    report = {"device": "gpu" if on_gpu else "cpu", "backend": mlxnet.backend(), "machine": platform.machine(),
              "cpus": os.cpu_count(), "frames": args.frames, "size": "1920x1080", "imgsz": args.imgsz,
              "batch": args.batch, "runs": args.runs,
              "weights": "seeded ultralytics .pt" if upy else "mlxnet --weights random", "rows": rows}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
