"""Golden numbers of ``yolo val`` (ultralytics' DetectionValidator, rect batches) on a small
dataset that mlxnet's tests rebuild, for tests/test_val_rect.py.

Runs where ultralytics imports (torch, torchvision):

    python scripts/goldens/golden_yolo_val.py [WORKDIR]

What both sides rebuild, so that nothing big is stored:

- the images: :func:`make_images` cuts and rescales tests/fixtures/yolo/{bus,zidane}.jpg with a
  seeded NumPy generator (nearest-neighbour sampling in NumPy, saved as PNG: no library's resize
  or JPEG coder in between), 14 images from 180 to 1000 px a side, height/width ratios 0.42 to
  2.4, all different (so no tie in the sort decides which batch an image falls in);
- the weights: a 3-class YOLOv8n (``DetectionModel("yolov8n.yaml", nc=3)``) with
  mlxnet/weights/seeded.py's tensors, seed 1234, gains (2.5, 5.0) (mlxnet's
  ``seeded_torch_state("n", 1234, 2.5, 5.0, nc=3)``), in float32.

The labels are made here, once, from this model's own predictions (its scores are low, so the
labels are its top boxes per image): some copied exactly, some moved by 5-30 % of their size,
some with another class, a few of its top boxes left out, and a few labels where it found
nothing, so that mAP lands mid-range. They are stored in the golden file as label-file text.

Writes tests/fixtures/val_rect/golden.json: the image checksums, the labels, the rect batches
(each image's letterbox shape, in ultralytics' sorted order), and ``yolo val``'s mAP50-95,
mAP50, P and R, overall and per class (batch 4, conf 0.001, IoU 0.7, max_det 300, imgsz 640).
WORKDIR (default a temporary folder) keeps the dataset, the .pt and ultralytics' predictions
JSON, for looking into a difference.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
GOLDEN = FIXTURES / "val_rect" / "golden.json"
SEED = 1234
GAINS = (2.5, 5.0)  # (bn_gain, head_gain): spread-out scores on real images (as golden_yolo.py)
NC = 3
NAMES = ("alpha", "beta", "gamma")
IMAGES = 14
BATCH = 4
IMGSZ = 640


def _seeded_module():
    spec = importlib.util.spec_from_file_location("seeded", ROOT / "mlxnet/weights/seeded.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_images(folder: Path, seed: int = 0) -> list[Path]:
    """The dataset's images as ``folder/img_XX.png``: deterministic on any platform given the
    decoded fixtures (see :func:`pixel_digest`)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    sources = [np.asarray(Image.open(FIXTURES / "yolo" / f"{n}.jpg").convert("RGB")) for n in ("bus", "zidane")]
    # Ratios spread over 0.42...2.4, shuffled; sizes from small (upscaled by the val load) to big.
    ratios = np.exp(np.linspace(np.log(0.42), np.log(2.4), IMAGES))
    rng.shuffle(ratios)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, ratio in enumerate(ratios):
        src = sources[i % 2]
        h, w = src.shape[:2]
        long_side = int(rng.integers(180, 1000))
        out_h, out_w = (long_side, max(int(round(long_side / ratio)), 8)) if ratio >= 1 else \
            (max(int(round(long_side * ratio)), 8), long_side)
        # A crop of the source with about the output's ratio, sampled nearest-neighbour.
        crop_w = int(rng.integers(w // 2, w + 1))
        crop_h = min(h, max(8, int(round(crop_w * out_h / out_w))))
        crop_w = min(w, max(8, int(round(crop_h * out_w / out_h))))
        y0, x0 = int(rng.integers(0, h - crop_h + 1)), int(rng.integers(0, w - crop_w + 1))
        ys = y0 + (np.arange(out_h) * crop_h // out_h)
        xs = x0 + (np.arange(out_w) * crop_w // out_w)
        path = folder / f"img_{i:02d}.png"
        Image.fromarray(np.ascontiguousarray(src[ys][:, xs])).save(path)
        paths.append(path)
    return paths


def pixel_digest(path: Path) -> str:
    """The first 16 hex digits of the SHA-256 of the image's RGB pixels."""
    from PIL import Image

    return hashlib.sha256(np.asarray(Image.open(path).convert("RGB")).tobytes()).hexdigest()[:16]


def write_dataset(root: Path, labels: dict[str, str]) -> Path:
    """images/val/*.png, labels/val/*.txt and data.yaml under ``root``; returns the yaml."""
    images = make_images(root / "images" / "val")
    (root / "labels" / "val").mkdir(parents=True, exist_ok=True)
    for path in images:
        (root / "labels" / "val" / f"{path.stem}.txt").write_text(labels.get(path.stem, ""))
    names = "".join(f"  {i}: {n}\n" for i, n in enumerate(NAMES))
    (root / "data.yaml").write_text(f"path: {root}\ntrain: images/val\nval: images/val\nnames:\n{names}")
    return root / "data.yaml"


def seeded_model():
    import torch
    from ultralytics.nn.tasks import DetectionModel

    model = DetectionModel("yolov8n.yaml", nc=NC, verbose=False)
    shapes = [(k, tuple(v.shape)) for k, v in model.state_dict().items() if v.dtype.is_floating_point]
    state = _seeded_module().seeded_yolo_state(shapes, SEED, *GAINS)
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=False)
    assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing), (missing, unexpected)
    model.names = dict(enumerate(NAMES))
    return model.float().eval()


def run_val(pt: Path, yaml: Path, work: Path, name: str):
    """``yolo val`` as the golden records it; returns (metrics, validator)."""
    from ultralytics import YOLO

    seen = {}
    yolo = YOLO(str(pt), task="detect")
    yolo.add_callback("on_val_end", lambda v: seen.update(validator=v))
    metrics = yolo.val(data=str(yaml), batch=BATCH, rect=True, conf=0.001, iou=0.7, max_det=300, imgsz=IMGSZ,
                       plots=False, device="cpu", workers=0, save_json=True, project=str(work), name=name,
                       exist_ok=True, verbose=False)
    return metrics, seen["validator"]


def make_labels(predictions: list[dict], heights_widths: dict[str, tuple[int, int]]) -> dict[str, str]:
    """Label-file text per image stem, from ``yolo val``'s own predictions on the unlabelled
    dataset (a COCO results list; see the module)."""
    rng = np.random.default_rng(SEED)

    def inside(p: dict) -> bool:  # yolo val matches unclipped boxes: a clipped one is no copy
        x, y, bw, bh = p["bbox"]
        h, w = heights_widths[str(p["image_id"])]
        return x > 1 and y > 1 and x + bw < w - 1 and y + bh < h - 1

    # The highest-scoring boxes of the whole dataset, at most six an image: AP ranks all images'
    # predictions together, so labels from each image's own top would sit among the others' FPs.
    ranked = sorted((p for p in predictions if inside(p)), key=lambda p: -p["score"])
    chosen: dict[str, list[dict]] = {stem: [] for stem in heights_widths}
    for p in ranked[:400]:
        if len(chosen[str(p["image_id"])]) < 6:
            chosen[str(p["image_id"])].append(p)
    labels = {}
    for stem, (h, w) in sorted(heights_widths.items()):
        lines = []
        for p in chosen[stem]:
            x1, y1, bw, bh = p["bbox"]
            x2, y2 = x1 + bw, y1 + bh
            c = int(p["category_id"]) - 1  # ultralytics writes class + 1 for non-COCO data
            fate = rng.uniform()
            if fate < 0.15:
                continue  # left out: a false positive for the model
            if fate < 0.5:  # moved by 5-30 % of its size
                dx, dy = rng.uniform(0.05, 0.3, 2) * rng.choice([-1, 1], 2) * (bw, bh)
                x1, x2, y1, y2 = x1 + dx, x2 + dx, y1 + dy, y2 + dy
            elif fate < 0.6:
                c = (c + 1) % NC  # another class
            x1, x2 = np.clip([x1, x2], 0, w)
            y1, y2 = np.clip([y1, y2], 0, h)
            if x2 - x1 < 2 or y2 - y1 < 2:
                continue
            lines.append(f"{c} {(x1 + x2) / 2 / w:.6f} {(y1 + y2) / 2 / h:.6f} {(x2 - x1) / w:.6f} {(y2 - y1) / h:.6f}")
        for _ in range(int(rng.integers(0, 2))):  # an object the model misses
            cx, cy, bw, bh = rng.uniform(0.2, 0.8, 2).tolist() + rng.uniform(0.05, 0.3, 2).tolist()
            lines.append(f"{int(rng.integers(0, NC))} {cx:.6f} {cy:.6f} {bw:.6f} {bh:.6f}")
        labels[stem] = "".join(f"{line}\n" for line in lines)
    return labels


def main(work: Path) -> None:
    import torch
    import ultralytics

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    work.mkdir(parents=True, exist_ok=True)
    pt = work / "yolov8n-nc3-seeded.pt"
    # float32, not YOLO.save's fp16, so mlxnet's float32 seeded weights are the same numbers
    torch.save({"model": seeded_model(), "train_args": {"task": "detect"}}, pt)
    # Labels from the model's own predictions on the unlabelled dataset (a label-free first pass),
    # then the measured pass.
    from PIL import Image

    yaml = write_dataset(work / "data", {})
    _, _ = run_val(pt, yaml, work, "unlabelled")
    predictions = json.loads((work / "unlabelled" / "predictions.json").read_text())
    hw = {p.stem: Image.open(p).size[::-1] for p in (work / "data" / "images" / "val").glob("*.png")}
    labels = make_labels(predictions, hw)
    yaml = write_dataset(work / "data", labels)
    for cache in (work / "data" / "labels").glob("*.cache"):
        cache.unlink()  # the first pass's cache holds no labels
    metrics, validator = run_val(pt, yaml, work, "val")
    dataset = validator.dataloader.dataset
    files = [Path(f).stem for f in dataset.im_files]
    shapes = [[int(v) for v in dataset.batch_shapes[b]] for b in dataset.batch]
    box = metrics.box
    golden = {
        "ultralytics": ultralytics.__version__, "torch": torch.__version__,
        "settings": {"batch": BATCH, "imgsz": IMGSZ, "conf": 0.001, "iou": 0.7, "max_det": 300, "rect": True},
        "weights": {"model": "yolov8n", "nc": NC, "seed": SEED, "bn_gain": GAINS[0], "head_gain": GAINS[1]},
        "names": list(NAMES),
        "images": {p.stem: pixel_digest(p) for p in sorted((work / "data" / "images" / "val").glob("*.png"))},
        "labels": labels,
        "rect_order": files,  # ultralytics' sorted order
        "rect_shapes": dict(zip(files, shapes)),  # each image's letterbox (H, W)
        "metrics": {"map50_95": float(box.map), "map50": float(box.map50), "precision": float(box.mp),
                    "recall": float(box.mr),
                    "classes": {NAMES[int(c)]: {"map50_95": float(box.all_ap[i].mean()),
                                                "map50": float(box.all_ap[i, 0]), "precision": float(box.p[i]),
                                                "recall": float(box.r[i])}
                                for i, c in enumerate(box.ap_class_index)}},
    }
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(golden, indent=1) + "\n")
    print(json.dumps(golden["metrics"], indent=1))
    print(f"wrote {GOLDEN}; dataset, weights and predictions under {work}")


if __name__ == "__main__":
    os.environ.setdefault("YOLO_OFFLINE", "1")
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="golden-yolo-val-"))
    os.environ.setdefault("YOLO_CONFIG_DIR", str(target / "ultralytics-config"))
    main(target)
