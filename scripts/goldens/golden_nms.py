"""Golden NMS results: the indices torchvision keeps, for ``tests/test_val_nms.py``.

Runs where torchvision imports:  python scripts/goldens/golden_nms.py [OUT.npz]
(default tests/fixtures/nms/nms_golden.npz). The detections are generated here from seeds with
NumPy alone (:func:`cases`, which the test imports too), so the file holds only what torchvision
kept (``batched_nms``, class-aware, and ``nms``, class-agnostic: the indices in torchvision's
order; for the 8400-box case the first 300 and a bit mask of all) and a SHA-256 of each case's
inputs, which the test checks before comparing: a few KB, not the boxes.

Cases: ``ties`` (integer boxes on a coarse grid, scores of a few levels: equal scores, duplicate
boxes and IoUs exactly at the threshold), ``random`` (uniform boxes and scores), ``real``
(detections as a detector gives them: a few objects, each with jittered copies at falling
scores, some under another class) and ``eval`` (8400 candidates in 80 classes, as at conf 0.001;
over 4000 boxes torchvision's batched_nms takes its per-class path instead of the offset trick).
"""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
THRESHOLDS = {"ties": (0.5, 0.7), "random": (0.5, 0.7), "real": (0.45, 0.7), "eval": (0.7,)}


def _ties(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = 300
    xy = rng.integers(0, 12, (n, 2)) * 8
    wh = rng.integers(1, 5, (n, 2)) * 8
    boxes = np.concatenate([xy, xy + wh], axis=1).astype(np.float32)
    boxes[n // 2:n // 2 + 20] = boxes[:20]  # exact duplicates, later indices
    scores = rng.integers(1, 6, n).astype(np.float32) / 8  # five levels: many equal scores
    return boxes, scores, rng.integers(0, 4, n).astype(np.int64)


def _random(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = 500
    xy = rng.uniform(0, 300, (n, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(5, 80, (n, 2))], axis=1).astype(np.float32)
    return boxes, rng.uniform(0, 1, n).astype(np.float32), rng.integers(0, 6, n).astype(np.int64)


def _real(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    boxes, scores, classes = [], [], []
    for _ in range(12):  # objects
        xy = rng.uniform(0, 560, 2)
        wh = rng.uniform(20, 300, 2)
        cls = int(rng.integers(0, 80))
        top = rng.uniform(0.3, 0.95)
        copies = int(rng.integers(20, 60))
        for _ in range(copies):
            jitter = rng.normal(0, 0.08, 4) * np.concatenate([wh, wh])
            box = np.concatenate([xy, xy + wh]) + jitter
            boxes.append(np.clip(box, 0, 640))
            scores.append(top * rng.uniform(0.02, 1.0))
            classes.append(cls if rng.uniform() < 0.8 else int(rng.integers(0, 80)))
    return (np.array(boxes, np.float32), np.array(scores, np.float32), np.array(classes, np.int64))


def _eval(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = 8400
    centre = rng.uniform(0, 640, (n, 2))
    size = rng.uniform(8, 200, (n, 2))
    boxes = np.concatenate([centre - size / 2, centre + size / 2], axis=1).astype(np.float32)
    scores = (rng.beta(0.5, 20, n) + 0.001).astype(np.float32)
    return boxes, scores, rng.integers(0, 80, n).astype(np.int64)


def cases() -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each case's (boxes (N, 4) xyxy float32, scores (N,) float32, classes (N,) int64)."""
    makers = {"ties": _ties, "random": _random, "real": _real, "eval": _eval}
    return {name: make(np.random.default_rng(seed)) for seed, (name, make) in enumerate(makers.items())}


def digest(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray) -> str:
    return hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in (boxes, scores, classes))).hexdigest()


def main(out: Path) -> None:
    import torch
    import torchvision

    found: dict[str, np.ndarray] = {}
    for name, (boxes, scores, classes) in cases().items():
        found[f"{name}/sha256"] = np.array(digest(boxes, scores, classes))
        b, s, c = torch.from_numpy(boxes), torch.from_numpy(scores), torch.from_numpy(classes)
        for iou in THRESHOLDS[name]:
            for op, kept in (("batched_nms", torchvision.ops.batched_nms(b, s, c, iou)),
                             ("nms", torchvision.ops.nms(b, s, iou))):
                kept = kept.numpy()
                # In full, in torchvision's order; for the large case (thousands kept) the first
                # 300 in order and the whole kept set as a bit mask, to stay a few KB.
                found[f"{name}/{iou}/{op}"] = kept[:300 if len(boxes) > 1000 else None].astype(np.int16)
                if len(boxes) > 1000:
                    mask = np.zeros(len(boxes), bool)
                    mask[kept] = True
                    found[f"{name}/{iou}/{op}/mask"] = np.packbits(mask)
    found["versions"] = np.array(f"torch {torch.__version__}, torchvision {torchvision.__version__}")
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, **found)
    print(f"wrote {out} ({out.stat().st_size} bytes): " +
          ", ".join(f"{k} {len(v)}" for k, v in found.items() if v.ndim == 1 and not k.endswith("mask")))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests" / "fixtures" / "nms" / "nms_golden.npz")
