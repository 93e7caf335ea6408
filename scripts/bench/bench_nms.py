"""NMS at evaluation settings: 8400 candidates of a 640² image, 80 classes, scores like conf 0.001's.

Prints which face of ``mlxnet.ops.nms`` runs on the back end in force (on a GPU back end the
kernel face, custom_kernels/nms.kern, timed beside the host definition), the mean time of
``mlxnet.ops.nms`` (class-aware, IoU 0.7, max_det 300), of the loop it
replaced (one kept box at a time against every remaining candidate, kept here to compare),
where torchvision imports of ``torchvision.ops.batched_nms`` on the same inputs (CPU tensors,
its result cut to max_det as ultralytics cuts it; the ratio and whether the kept indices are
identical; on a CUDA machine also with the tensors on the GPU, its CUDA kernel), and, given a file, of another definition:

    python scripts/bench/bench_nms.py [--against OLD_DEFINITION.py]

torchvision and MLX need not share an environment: with the same Python version, put the one
with torch first and MLX's after it, e.g. ``PYTHONPATH=src:MLX_SITE_PACKAGES TORCH_ENV/bin/python
scripts/bench/bench_nms.py``.
"""
from __future__ import annotations

import argparse
import importlib.util
import time

import mlx.core as mx
import numpy as np

import mlxnet
from mlxnet import ops
from mlxnet.ops.nms import nms


def candidates(n: int = 8400, classes: int = 80, seed: int = 0) -> tuple[mx.array, mx.array, mx.array]:
    rng = np.random.default_rng(seed)
    centre = rng.uniform(0, 640, (n, 2))
    size = rng.uniform(8, 200, (n, 2))
    boxes = np.concatenate([centre - size / 2, centre + size / 2], axis=1).astype(np.float32)
    scores = (rng.beta(0.5, 20, n) + 0.001).astype(np.float32)  # mostly tiny, a few confident
    return mx.array(boxes), mx.array(scores), mx.array(rng.integers(0, classes, n).astype(np.int32))


def one_at_a_time(boxes: mx.array, scores: mx.array, classes: mx.array, *, iou_threshold: float,
                  max_det: int, max_wh: float = 7680.0) -> np.ndarray:
    """The definition before the per-class matrices: torchvision's CPU loop in numpy."""
    b = np.array(boxes) + (np.array(classes).astype(np.float32) * np.float32(max_wh))[:, None]
    order = np.argsort(-np.array(scores), kind="stable")
    x1, y1, x2, y2 = b.T
    areas = (x2 - x1) * (y2 - y1)
    keep: list[int] = []
    while order.size and len(keep) < max_det:
        i, rest = order[0], order[1:]
        keep.append(int(i))
        w = np.maximum(np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]), np.float32(0))
        h = np.maximum(np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]), np.float32(0))
        inter = w * h
        order = rest[~((inter / (areas[i] + areas[rest] - inter)).astype(np.float64) > iou_threshold)]
    return np.asarray(keep, np.int32)


def torchvision_batched_nms():
    """torchvision's batched_nms on the same inputs (cut to max_det), or None where it does not import."""
    try:
        import torch
        import torchvision
    except Exception:  # noqa: BLE001 - not installed, or a torchvision built for another torch
        return None
    torch.set_num_threads(max(1, torch.get_num_threads()))

    def batched(boxes: mx.array, scores: mx.array, classes: mx.array, *, iou_threshold: float,
                max_det: int) -> np.ndarray:
        b, s, c = (torch.from_numpy(np.array(a)) for a in (boxes, scores, classes))
        return torchvision.ops.batched_nms(b, s, c, iou_threshold)[:max_det].numpy()

    return batched


def torchvision_batched_nms_cuda():
    """torchvision's batched_nms with the inputs already on the GPU (its CUDA kernel), the kept
    indices read back to the host as mlxnet's are; None without CUDA."""
    try:
        import torch
        import torchvision
    except Exception:  # noqa: BLE001
        return None
    if not torch.cuda.is_available():
        return None
    resident: dict = {}

    def batched(boxes: mx.array, scores: mx.array, classes: mx.array, *, iou_threshold: float,
                max_det: int) -> np.ndarray:
        key = id(boxes)
        if key not in resident:  # uploaded once, as the detector's outputs would already be there
            resident.clear()
            resident[key] = [torch.from_numpy(np.array(a)).cuda() for a in (boxes, scores, classes)]
        return torchvision.ops.batched_nms(*resident[key], iou_threshold)[:max_det].cpu().numpy()

    return batched


def timed(fn, args, repeat: int) -> tuple[float, np.ndarray]:
    out = np.array(fn(*args, iou_threshold=0.7, max_det=300))
    start = time.perf_counter()
    for _ in range(repeat):
        fn(*args, iou_threshold=0.7, max_det=300)
    return (time.perf_counter() - start) / repeat * 1e3, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="another definition.py whose nms() to time on the same inputs")
    parser.add_argument("--repeat", type=int, default=20)
    parsed = parser.parse_args()
    torchvision_nms = torchvision_batched_nms()
    if torchvision_nms is None:
        print("torchvision does not import here: its batched_nms is not timed")
    torchvision_cuda = torchvision_batched_nms_cuda()
    op = ops.get("nms")
    print(f"back end {mlxnet.backend()}: mlxnet.ops.nms runs its {op.face()} face"
          + ("" if op.face() == "definition" else " (the definition timed beside it)"))
    for n in (300, 8400):
        args = candidates(n)
        ms, kept = timed(nms, args, parsed.repeat)
        if op.face() != "definition":
            with mlxnet.use_kernels(False):
                def_ms, def_kept = timed(nms, args, parsed.repeat)
            same = "identical" if np.array_equal(kept, def_kept) else "DIFFERENT"
            print(f"nms {n} boxes, 80 classes, {op.face()} face: {ms:.2f} ms; definition on the host: "
                  f"{def_ms:.2f} ms ({same} indices)")
        loop_ms, loop_kept = timed(one_at_a_time, args, parsed.repeat)
        line = (f"nms {n} boxes, 80 classes: {ms:.2f} ms ({kept.size} kept); one box at a time: {loop_ms:.2f} ms "
                f"({'identical' if np.array_equal(kept, loop_kept) else 'DIFFERENT'} indices)")
        if torchvision_nms is not None:
            tv_ms, tv_kept = timed(torchvision_nms, args, parsed.repeat)
            same = "identical" if np.array_equal(kept, tv_kept) else "DIFFERENT"
            line += f"; torchvision batched_nms: {tv_ms:.2f} ms ({same} indices, mlxnet/torchvision {ms / tv_ms:.2f}x)"
        if torchvision_cuda is not None:
            tc_ms, tc_kept = timed(torchvision_cuda, args, parsed.repeat)
            same = "identical" if np.array_equal(kept, tc_kept) else "DIFFERENT"
            line += f"; torchvision batched_nms on CUDA: {tc_ms:.2f} ms ({same} indices, mlxnet/torchvision {ms / tc_ms:.2f}x)"
        if parsed.against:
            spec = importlib.util.spec_from_file_location("nms_other", parsed.against)
            other = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(other)  # type: ignore[union-attr]
            other_ms, other_kept = timed(other.nms, args, parsed.repeat)
            same = "identical" if np.array_equal(kept, other_kept) else "DIFFERENT"
            line += f"; {parsed.against}: {other_ms:.2f} ms ({same} indices)"
        print(line)


if __name__ == "__main__":
    main()
