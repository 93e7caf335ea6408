"""Segment-everything time and peak memory, whole processes: mlxnet against MobileSAM.

`mlxnet segment --everything` and MobileSAM's own ``SamAutomaticMaskGenerator`` on the same
image, with the same seeded weights, thresholds and threads:

    python scripts/bench/bench_sam_everything.py [--grid 8 32] [--image tests/fixtures/yolo/bus.jpg]
            [--threads 2] [--pred-iou-thresh 0.88] [--repeat N] [--mlxnet-root DIR] [--only RUN...]

Each run is a fresh process (so peaks do not mix), timed from start to exit (wall and CPU time):
imports, weight loading, the image embedding, the point grid, writing (mlxnet: the overlay and
label map; MobileSAM returns its records). Its peak resident set size comes from ``os.wait4``. Weights are the tests'
seeded ones (mlxnet/weights/seeded.py, seed and state-dict shapes from tests/fixtures/sam/): the
masks mean nothing, but both sides compute the same ones, and time and memory do not depend on the
values except through how many masks pass the thresholds (``--pred-iou-thresh 0`` lets every
mask through the first filter: the most upsampling work).

MobileSAM is found as in scripts/goldens/sam_reference.py: an installed ``mobile_sam`` or a copy
in ``.ref-sam/``. Its generator imports four torchvision functions; torchvision has no build for
this torch here, so where it cannot be imported a small stand-in (:func:`torchvision_stand_in`,
written for this script, not torchvision's code) supplies them.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "sam" / "sam_golden.json"


# --- the seeded weights, in PyTorch (mobile_sam.pt) keys ---------------------------------------------

def seeded_weights() -> dict:
    import importlib.util

    spec = importlib.util.spec_from_file_location("seeded", ROOT / "mlxnet" / "weights" / "seeded.py")
    seeded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(seeded)  # type: ignore[union-attr]
    meta = json.loads(FIXTURE.read_text())
    return seeded.seeded_state_dict([(k, tuple(s)) for k, s in meta["state_dict_shapes"]], meta["seed"])


# --- MobileSAM's side --------------------------------------------------------------------------------

def torchvision_stand_in() -> None:
    """Stand-in for the torchvision functions MobileSAM's generator and predictor import
    (``ops.boxes.batched_nms`` / ``box_area``, ``transforms.functional.resize`` / ``to_pil_image``),
    written for this benchmark from their documented behaviour: greedy NMS in descending score
    order (stable for ties) that drops boxes with IoU above the threshold, per category; PIL
    bilinear resizing of a uint8 image to (height, width)."""
    import types

    import numpy as np
    import torch
    from PIL import Image

    def box_area(boxes: torch.Tensor) -> torch.Tensor:
        return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])

    def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
        order = torch.argsort(scores, descending=True, stable=True)
        boxes, areas = boxes[order], box_area(boxes[order])
        suppressed = torch.zeros(len(order), dtype=torch.bool)
        keep = []
        for i in range(len(order)):
            if suppressed[i]:
                continue
            keep.append(i)
            lt = torch.maximum(boxes[i, :2], boxes[i + 1:, :2])
            rb = torch.minimum(boxes[i, 2:], boxes[i + 1:, 2:])
            inter = (rb - lt).clamp(min=0).prod(dim=1)
            suppressed[i + 1:] |= inter / (areas[i] + areas[i + 1:] - inter) > iou_threshold
        return order[torch.tensor(keep, dtype=torch.long)]

    def batched_nms(boxes, scores, idxs, iou_threshold):
        if boxes.numel() == 0:
            return torch.empty((0,), dtype=torch.int64)
        shifted = boxes + (idxs.to(boxes) * (boxes.max() + 1))[:, None]  # categories never overlap
        return nms(shifted, scores, iou_threshold)

    def to_pil_image(image):
        return Image.fromarray(np.asarray(image))

    def resize(image, size):
        return image.resize((size[1], size[0]), Image.BILINEAR)

    names = ["torchvision", "torchvision.ops", "torchvision.ops.boxes", "torchvision.transforms",
             "torchvision.transforms.functional"]
    modules = {n: types.ModuleType(n) for n in names}
    modules["torchvision.ops.boxes"].__dict__.update(batched_nms=batched_nms, box_area=box_area, nms=nms)
    modules["torchvision.transforms.functional"].__dict__.update(resize=resize, to_pil_image=to_pil_image)
    sys.modules.update(modules)


def mobile_sam_masks(image_path: str, weights_path: str, grid: int, settings: dict) -> list[dict]:
    """MobileSAM's generator on the image (``settings``: its keyword arguments but the grid)."""
    import numpy as np
    import torch
    from PIL import Image
    from safetensors.numpy import load_file

    try:
        import torchvision.ops.boxes  # noqa: F401
        import torchvision.transforms.functional  # noqa: F401
    except Exception:  # noqa: BLE001 - missing, or built for another torch
        torchvision_stand_in()
    sys.path.insert(0, str(ROOT / "scripts" / "goldens"))
    import sam_reference

    mobile_sam = sam_reference.package()
    sam = mobile_sam.sam_model_registry["vit_t"]()
    state = {k: torch.from_numpy(v) for k, v in load_file(weights_path).items()}
    missing, unexpected = sam.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing), (missing, unexpected)
    sam.eval()  # again after loading: TinyViT caches its attention biases in train(False)
    image = np.asarray(Image.open(image_path).convert("RGB"))
    generator = mobile_sam.SamAutomaticMaskGenerator(sam, points_per_side=grid, **settings)
    with torch.inference_mode():
        return generator.generate(image)


# --- one measured process ----------------------------------------------------------------------------

def measured(command: list[str], threads: int, scratch: Path, root: str) -> dict:
    """Wall time, CPU time and peak RSS of one whole process started in ``root`` (whose mlxnet
    it imports first), and the last line it printed."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MLXNET_DEVICE": "cpu", "PYTHONPATH": root}
    with open(scratch / "out.txt", "w+") as out, open(scratch / "err.txt", "w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=root)
        # wait4, not wait(): it returns this child's own resource usage (RUSAGE_CHILDREN would be
        # the largest of every child so far).
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - start
        out.seek(0), err.seek(0)
        lines, errors = out.read().strip().splitlines(), err.read().strip()
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {errors[-1500:]}"}
    # CPU time besides wall time: on a machine shared with other work the wall time waits for
    # cores; the CPU time does not (it still grows somewhat with contention: caches, hyperthreads).
    return {"seconds": round(seconds, 1), "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
            "peak_rss_gib": round(usage.ru_maxrss / 2**20, 2),  # Linux: KiB
            "output": lines[-1] if lines else ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", nargs="+", type=int, default=[8, 32], help="points per side")
    ap.add_argument("--image", default=str(ROOT / "tests" / "fixtures" / "yolo" / "bus.jpg"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pred-iou-thresh", type=float, default=0.88)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each, alternated")
    ap.add_argument("--only", nargs="+", metavar="RUN", help="run names: mlxnet, mobilesam, mlxnet@DIRNAME")
    ap.add_argument("--mlxnet-root", action="append", default=[], metavar="DIR",
                    help="also time the mlxnet of DIR, another revision's files (`git archive REV | tar -x -C "
                         "DIR`, then link DIR/mlxnet/models -> ../models and DIR/mlxnet/custom_kernels -> "
                         "../custom_kernels, as an install maps them); its run is named mlxnet@DIRNAME")
    ap.add_argument("--mobile-sam", nargs=4, metavar=("IMAGE", "WEIGHTS", "GRID", "IOU"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.mobile_sam:
        import torch

        torch.set_num_threads(a.threads)
        image, weights, grid, iou = a.mobile_sam
        settings = dict(points_per_batch=64, pred_iou_thresh=float(iou), stability_score_thresh=0.95,
                        stability_score_offset=1.0, box_nms_thresh=0.7)  # mlxnet segment's defaults
        print(f"{len(mobile_sam_masks(image, weights, int(grid), settings))} masks")
        return

    from safetensors.numpy import save_file

    with tempfile.TemporaryDirectory() as tmp:
        weights = str(Path(tmp) / "mobile_sam_seeded.safetensors")
        save_file(seeded_weights(), weights)
        print(f"image {a.image}, seeded weights, {a.threads} threads, pred_iou_thresh {a.pred_iou_thresh}",
              flush=True)
        roots = {"mlxnet": str(ROOT), **{f"mlxnet@{Path(r).name}": str(Path(r).resolve()) for r in a.mlxnet_root}}
        for grid in a.grid:
            runs = {name: ([sys.executable, "-m", "mlxnet", "segment", a.image, "--everything", "--json",
                            "--points-per-side", str(grid), "--pred-iou-thresh", str(a.pred_iou_thresh),
                            "-w", weights, "-o", str(Path(tmp) / f"everything_{grid}.png")], root)
                    for name, root in roots.items()}
            runs["mobilesam"] = ([sys.executable, __file__, "--threads", str(a.threads), "--mobile-sam", a.image,
                                  weights, str(grid), str(a.pred_iou_thresh)], str(ROOT))
            for _ in range(a.repeat):
                for name, (command, root) in runs.items():
                    if a.only and name not in a.only:
                        continue
                    report = measured(command, a.threads, Path(tmp), root)
                    if name.startswith("mlxnet") and "output" in report:
                        report["output"] = f"{len(json.loads(report['output'])['masks'])} masks"
                    print(json.dumps({"grid": f"{grid}x{grid}", "run": name, **report}), flush=True)


if __name__ == "__main__":
    main()
