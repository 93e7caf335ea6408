"""The whole detection path on a folder of varied photos: `mlxnet detect` against ultralytics.

What a user runs, timed as whole processes from start to exit (imports, weights, decoding,
letterbox, forward, NMS, drawing, encoding, writing every annotated copy):

    python scripts/bench/bench_detect_path.py [--photos 200] [--model yolov8s] [--runs 2]
            [--device cpu|gpu] [--json FILE] [--only NAME...] [--keep DIR] [--records]

- the photos: crops and rescales of the test fixtures (bus.jpg, zidane.jpg), 0.5 to 1.7
  megapixels, many aspect ratios, seeded: the same folder every time;
- the weights: where ultralytics imports, a seeded ``YOLO("yolov8s.yaml")`` saved as an
  ultralytics ``.pt`` that both tools load (speed does not depend on the values, only on how many
  boxes pass the threshold, the same for both); otherwise mlxnet's ``--weights random``;
- runs, each in a fresh process, alternating the tools, ``--runs`` times:
  ``mlxnet`` (defaults: batch 8, float32), ``mlxnet-batch1``, ``ultralytics`` (its defaults:
  batch 1, float32, ``save=True, stream=True``) and, on a GPU, ``ultralytics-b8-half``
  (``batch=8, half=True``, its fastest documented settings);
- for each run: wall seconds, images/s, seconds from process start to the first result line
  (the line each tool prints per photo; with ``--records`` each result also as JSON, mlxnet's
  ``--json`` and ultralytics' ``Results.summary()``, mask outlines included) and, for mlxnet, where the
  time went (``MLXNET_TIMINGS=1``: read / model / write, summed over threads).

Each tool runs with caches of its own: empty for its first run ("cold": a fresh ``TMPDIR``,
where MLX keeps the kernels it compiles for each new shape, and a fresh ultralytics settings
folder), kept for the later runs ("warm"). mlxnet's
CPU helpers (``~/.cache/mlxnet/native``) are built once per installation, by the first command
after it, and are kept: that one-time build is not part of "cold" here.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = [ROOT / "tests" / "fixtures" / "yolo" / name for name in ("bus.jpg", "zidane.jpg")]

ULTRALYTICS_RUN = r"""
import json, sys, time
from ultralytics import YOLO
source, weights, out, device, batch, half, records = sys.argv[1:8]
model = YOLO(weights)
for r in model.predict(source, save=True, stream=True, project=out, name="run", exist_ok=True, verbose=False,
                       device=device, batch=int(batch), half=half == "1"):
    if records == "1":  # what mlxnet's --json gives: boxes, mask outlines, keypoints
        print(json.dumps({"path": r.path, "detections": r.summary()}), flush=True)
    else:
        print(f"{r.path} {len(r.boxes)}", flush=True)
"""

ULTRALYTICS_WEIGHTS = r"""
import sys, torch
from ultralytics import YOLO
torch.manual_seed(0)
model = YOLO(sys.argv[1] + ".yaml")
bias, gain = float(sys.argv[3]), float(sys.argv[4])
if bias == bias:  # not NaN: class 0's logits spread by ``gain`` around ``bias``, so that some boxes pass
    with torch.no_grad():
        for name, p in model.model.named_parameters():
            if ".cv3." in name and ".2." in name and "one2one" not in name:
                if name.endswith(".bias"):
                    p[0] = bias
                else:
                    p[0] *= gain
model.save(sys.argv[2])
"""


def make_photos(folder: Path, count: int, seed: int = 0) -> list[Path]:
    """``count`` JPEGs cut and scaled from the fixtures: 0.5-1.7 MP, aspect 0.5-2."""
    from PIL import Image

    rng = random.Random(seed)
    sources = [Image.open(p).convert("RGB") for p in FIXTURES]
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        src = sources[i % len(sources)]
        w, h = src.size
        cw, ch = rng.randint(w // 2, w), rng.randint(h // 2, h)
        x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
        crop = src.crop((x, y, x + cw, y + ch))
        megapixels = rng.uniform(0.5, 1.7)
        aspect = min(max(cw / ch * rng.uniform(0.8, 1.25), 0.5), 2.0)
        new_h = int((megapixels * 1e6 / aspect) ** 0.5)
        new_w = int(new_h * aspect)
        path = folder / f"photo_{i:04d}.jpg"
        crop.resize((new_w, new_h), Image.BILINEAR).save(path, quality=90)
        paths.append(path)
    return paths


def has_ultralytics(python: str) -> bool:
    return subprocess.run([python, "-c", "import ultralytics, torchvision"], capture_output=True).returncode == 0


def timed(cmd: list[str], env: dict[str, str]) -> dict:
    """Run ``cmd``; wall seconds, seconds to its first stdout line, lines, and its stderr tail."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    first, lines, found = None, 0, 0
    assert proc.stdout is not None
    for line in proc.stdout:
        count = _detections_in(line)
        if count is None:  # a message (ultralytics' settings notes, "Results saved to ..."), not a result
            continue
        lines += 1
        found += count
        if first is None:
            first = time.perf_counter() - start
    err = proc.stderr.read() if proc.stderr is not None else ""
    code = proc.wait()
    wall = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"{' '.join(cmd[:4])}... failed ({code}):\n{err[-2000:]}")
    timings = [line for line in err.splitlines() if line.startswith("timings:")]
    return {"wall_s": round(wall, 3), "first_result_s": round(first or wall, 3), "results": lines,
            "detections_per_image": round(found / max(lines, 1), 2), "timings": timings[-1] if timings else None}


def _detections_in(line: str) -> int | None:
    """Detections on one result line: a JSON record (``--records``), the ultralytics script's
    "path count" or mlxnet's summary line "path: 3 person, 1 bus -> output"; None for any other
    line."""
    if line.startswith("{"):
        record = json.loads(line)
        return len(record["detections"]) if "detections" in record else None
    if " -> " in line and ": " in line:
        counts = line.rsplit(" -> ", 1)[0].rsplit(": ", 1)[1]
        return 0 if counts.strip() == "nothing" else sum(int(part.split()[0]) for part in counts.split(", "))
    parts = line.split()
    return int(parts[-1]) if len(parts) == 2 and parts[-1].isdigit() else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--photos", type=int, default=200)
    ap.add_argument("--model", default="yolov8s")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--device", choices=["cpu", "gpu"], default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--records", action="store_true",
                    help="Each result also as a JSON record (mlxnet's --json; ultralytics' Results.summary(): "
                         "boxes, mask outlines, keypoints); default: both tools' default commands, which save "
                         "the annotated photos and print a line each.")
    ap.add_argument("--keep", type=Path, default=None, help="Work folder to keep (default: a temporary one).")
    ap.add_argument("--class-gain", type=float, default=1.0,
                    help="With --class-bias: scale class 0's weights by this, spreading its scores.")
    ap.add_argument("--class-bias", type=float, default=float("nan"),
                    help="Set class 0's logit bias in the seeded checkpoint (e.g. -1.5), so that boxes (and a "
                         "segment or pose model's masks or keypoints) pass the threshold; default: ultralytics' "
                         "initialisation, under which few or none do.")
    ap.add_argument("--ultralytics-python", default=sys.executable,
                    help="The Python that runs ultralytics (default: this one), e.g. a virtual environment's "
                         "where torchvision matches its torch.")
    args = ap.parse_args()

    work = args.keep or Path(tempfile.mkdtemp(prefix="mlxnet-detect-path-"))
    photos = work / "photos"
    if not photos.is_dir() or len(list(photos.glob("*.jpg"))) != args.photos:
        shutil.rmtree(photos, ignore_errors=True)
        make_photos(photos, args.photos)
    import mlx.core as mx

    on_gpu = args.device == "gpu" or (args.device is None and mx.default_device() == mx.gpu)
    upy = args.ultralytics_python
    ultralytics = has_ultralytics(upy)
    weights = ["--weights", "random", "--model", args.model]
    if ultralytics:
        pt = work / f"{args.model}-seeded-{args.class_bias}-{args.class_gain}.pt"
        if not pt.exists():
            subprocess.run([upy, "-c", ULTRALYTICS_WEIGHTS, args.model, str(pt), str(args.class_bias),
                            str(args.class_gain)], check=True, capture_output=True)
        weights = ["--weights", str(pt)]
    device = ["--device", "gpu" if on_gpu else "cpu"]
    runs: dict[str, list[str]] = {
        "mlxnet": [sys.executable, "-m", "mlxnet", "detect", str(photos), "-o", str(work / "out-mlxnet"),
                   *(["--json"] if args.records else []), *weights, *device],
    }
    runs["mlxnet-batch1"] = runs["mlxnet"] + ["--batch", "1"]
    if ultralytics:
        udev = "0" if on_gpu else "cpu"
        base = [upy, "-c", ULTRALYTICS_RUN, str(photos), str(pt), str(work / "out-ultralytics"), udev]
        records = "1" if args.records else "0"
        runs["ultralytics"] = base + ["1", "0", records]
        if on_gpu:
            runs["ultralytics-b8-half"] = base + ["8", "1", records]
    if args.only:
        runs = {k: v for k, v in runs.items() if k in args.only}

    results: dict[str, list[dict]] = {name: [] for name in runs}
    cold = Path(tempfile.mkdtemp(prefix="mlxnet-cold-"))
    for round_ in range(args.runs):
        for name, cmd in runs.items():
            # Each tool's own caches, empty for its first run and kept for the later ones.
            own = cold / name
            (own / "tmp").mkdir(parents=True, exist_ok=True)
            env = dict(os.environ, MLXNET_TIMINGS="1", YOLO_OFFLINE="1", TMPDIR=str(own / "tmp"),
                       YOLO_CONFIG_DIR=str(own / "ultralytics"))
            r = timed(cmd, env)
            r["cache"] = "cold" if round_ == 0 else "warm"
            r["images_per_s"] = round(args.photos / r["wall_s"], 2)
            results[name].append(r)
            print(f"{name:22s} {r['cache']}: {r['wall_s']:7.2f} s  {r['images_per_s']:6.1f} img/s  "
                  f"first result {r['first_result_s']:6.2f} s  {r['detections_per_image']:.1f} found/image  "
                  f"{r['timings'] or ''}", flush=True)
    shutil.rmtree(cold, ignore_errors=True)

    summary = {name: {"median_wall_s": statistics.median(r["wall_s"] for r in rs),
                      "best_wall_s": min(r["wall_s"] for r in rs)} for name, rs in results.items() if rs}
    if "mlxnet" in summary and "ultralytics" in summary:
        print(f"ultralytics / mlxnet (median wall): "
              f"{summary['ultralytics']['median_wall_s'] / summary['mlxnet']['median_wall_s']:.2f}x")
    report = {"photos": args.photos, "model": args.model, "device": "gpu" if on_gpu else "cpu",
              "class_bias": None if args.class_bias != args.class_bias else args.class_bias,
              "class_gain": args.class_gain, "records": args.records,
              "weights": "seeded ultralytics .pt" if ultralytics else "mlxnet --weights random",
              "runs": results, "summary": summary}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
