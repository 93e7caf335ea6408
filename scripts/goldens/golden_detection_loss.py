"""Golden losses and gradients of YOLOv8's detection loss, from ultralytics itself (8.4:
DetectionModel in training mode, v8DetectionLoss, its default gains).

Runs where ultralytics imports (it needs a torchvision that matches the installed torch):

    python scripts/goldens/golden_detection_loss.py OUTDIR

The model: yolov8n built from ultralytics' yolov8n.yaml for NC classes, with
mlxnet/weights/seeded.py tensors (seed SEED, BatchNorm gain 1, head gain HEAD_GAIN: enough spread
that no two anchors tie in the assigner), run in float64: the reference values themselves, not
one float32 rounding of them (PyTorch's own float32 gradients differ from them by up to 4e-5
relative on this model and batch; the tests state each precision's tolerance). Each batch case (``cases()``: the tests load this file and
rebuild them from the same seeds) is one forward in training mode (BatchNorm on batch statistics) and
one backward of the loss ultralytics back-propagates (the three parts' sum times the batch size).

Writes OUTDIR/detection_loss_golden.safetensors (float64):

  <case>.raw                 (B, A, 64 + NC) the head's raw outputs (box bins, class logits)
  <case>.parts               (3,) box, cls, dfl as ultralytics logs them (gains applied)
  <case>.loss                (1,) what is back-propagated
  <case>.d_raw               (B, A, 64 + NC) the loss's gradient with respect to the raw outputs
  <case>.grad.<key>          a parameter's gradient, for those under SMALL elements
  <case>.gnorm.<key>         (1,) the gradient's L2 norm, every parameter
  <case>.gproj.<key>         (PROJECTIONS,) its dot products with seeded standard-normal tensors
                             (projection_vectors), every parameter

and OUTDIR/detection_loss_golden.json: the cases' labels and settings.
"""
from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference import ROOT, load_seeded  # noqa: E402  (also keeps ultralytics offline)

SEED = 1234
NC = 3
HEAD_GAIN = 2.0
SMALL = 4096  # parameters with fewer elements are stored whole
PROJECTIONS = 3


def cases() -> dict[str, tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]]:
    """name -> (images (B, H, W, 3) float32, per image xyxy pixel boxes (n, 4), classes (n,)).

    mixed: an empty image, one box, many boxes (overlapping), tiny boxes (sides under the
    assigner's 16-pixel minimum) and boxes on the border; empty: a batch without objects."""
    rng = np.random.default_rng(2024)
    h, w = 128, 160

    def boxes(n: int, lo: float, hi: float) -> np.ndarray:
        size = rng.uniform(lo, hi, (n, 2))
        corner = rng.uniform(0, 1, (n, 2)) * (np.array([w, h]) - size)
        return np.concatenate([corner, corner + size], 1).astype(np.float32)

    border = np.array([[0, 0, 37.3, 41.9], [121.7, 88.2, w, h], [0, 60.4, 52.5, h], [133.1, 0, w, 17.7]], np.float32)
    mixed_boxes = [np.zeros((0, 4), np.float32), boxes(1, 30, 90), boxes(18, 12, 70),
                   np.concatenate([boxes(5, 3, 14), border])]
    mixed_classes = [rng.integers(0, NC, len(b)).astype(np.int64) for b in mixed_boxes]
    images = {name: rng.uniform(0, 1, (n, h, w, 3)).astype(np.float32) for name, n in (("mixed", 4), ("empty", 2))}
    return {"mixed": (images["mixed"], mixed_boxes, mixed_classes),
            "empty": (images["empty"], [np.zeros((0, 4), np.float32)] * 2, [np.zeros(0, np.int64)] * 2)}


def projection_vectors(key: str, shape: tuple[int, ...]) -> np.ndarray:
    """(PROJECTIONS, *shape) float64, PyTorch layout, from the key alone."""
    rng = np.random.default_rng([77, zlib.crc32(key.encode())])
    return rng.standard_normal((PROJECTIONS, *shape))


def seeded_model():
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel

    model = load_seeded(DetectionModel("yolov8n.yaml", nc=NC, verbose=False), SEED, 1.0, HEAD_GAIN)
    model.double()
    model.args = get_cfg()  # the default hyperparameters: box 7.5, cls 0.5, dfl 1.5
    model.train()
    return model


def run_case(model, images: np.ndarray, boxes: list[np.ndarray], classes: list[np.ndarray]) -> dict[str, np.ndarray]:
    import torch

    b, h, w, _ = images.shape
    img = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous().double()
    rows = [(i, c, bx) for i, (bb, cc) in enumerate(zip(boxes, classes)) for bx, c in zip(bb, cc)]
    xywh = np.array([[(x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h]
                     for _, _, (x1, y1, x2, y2) in rows], np.float64).reshape(-1, 4)
    batch = {"img": img, "batch_idx": torch.tensor([r[0] for r in rows], dtype=torch.float64),
             "cls": torch.tensor([[float(r[1])] for r in rows], dtype=torch.float64).reshape(-1, 1),
             "bboxes": torch.from_numpy(xywh).double()}
    model.zero_grad()
    preds = model(img)
    preds["boxes"].retain_grad()
    preds["scores"].retain_grad()
    loss, items = model.loss(batch, preds)
    loss.sum().backward()
    raw = torch.cat([preds["boxes"], preds["scores"]], 1).permute(0, 2, 1)
    d_raw = torch.cat([preds["boxes"].grad, preds["scores"].grad], 1).permute(0, 2, 1)
    out = {"raw": raw.detach().numpy(),
           "parts": torch.stack(list(items.values())).numpy(), "loss": loss.sum().detach().numpy().reshape(1),
           "d_raw": d_raw.numpy()}
    for key, p in model.named_parameters():
        if p.grad is None:
            continue
        g = p.grad.detach().double().numpy()
        if g.size < SMALL:
            out[f"grad.{key}"] = g
        out[f"gnorm.{key}"] = np.array([np.linalg.norm(g)])
        out[f"gproj.{key}"] = projection_vectors(key, g.shape).reshape(PROJECTIONS, -1) @ g.ravel()
    return out


def main(outdir: str) -> None:
    import torch
    from safetensors.numpy import save_file

    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the loss's own buffers too; restored for the caller
    try:
        model = seeded_model()
        arrays, meta = {}, {"seed": SEED, "nc": NC, "head_gain": HEAD_GAIN, "cases": {}}
        for name, (images, boxes, classes) in cases().items():
            for k, v in run_case(model, images, boxes, classes).items():
                arrays[f"{name}.{k}"] = np.ascontiguousarray(v)
            meta["cases"][name] = {"objects": [len(b) for b in boxes], "parts": arrays[f"{name}.parts"].tolist(),
                                   "loss": float(arrays[f"{name}.loss"][0])}
    finally:
        torch.set_default_dtype(default)
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(arrays, str(out / "detection_loss_golden.safetensors"))
    (out / "detection_loss_golden.json").write_text(json.dumps(meta, indent=1))
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "tests/fixtures/train"))
