"""Peak memory where users feel it: big-lama on a large image, segment-everything on a 12 MP photo.

    python scripts/bench/memory_paths.py [lama] [amg] [--device cpu|gpu] [--lama-size 2048 ...]
            [--amg-size 3000x4000] [--dtype float32] [--repeat N] [--gpu-memory default|low|min]

Each measurement runs in a fresh process (so peaks do not mix) and prints one JSON line:
MLX's peak allocation (``mx.get_peak_memory``, reset just before the measured call) and the
process's peak resident set size (``ru_maxrss``: the whole process, imports and weights included).

- ``lama``: big-lama (``mlxnet.models.lama``, random weights: memory does not depend on the values)
  inpainting a random size×size image with a centred square hole (a quarter of the area), as
  ``mlxnet inpaint`` runs it: ``LaMa.inpaint`` in the model's dtype (float32 by default; half
  precision computes in float32 on the CPU, as the CLI's loader does).
- ``amg``: ``mlxnet segment --everything`` with its defaults (32×32 points, 64 a batch, predicted
  IoU 0.88, stability 0.95 at offset 1, box NMS 0.7) on tests/fixtures/yolo/bus.jpg resized to
  ``--amg-size`` (width×height; 3000×4000 keeps the photo's 3:4 shape, 12 MP), with the tests'
  seeded sam-tiny weights (scripts/bench/bench_sam_everything.py). ``seconds``: the embedding and
  the mask generator (``SamFamily.segment_everything``); ``finish_*``: the CLI's writing after it
  (the overlay, the label map, both PNGs), with the peaks over the whole run.

On a CUDA machine: ``python scripts/bench/memory_paths.py --device gpu``.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUS = ROOT / "tests" / "fixtures" / "yolo" / "bus.jpg"


def _rss_gib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)  # Linux: KiB


def _gib(n: int) -> float:
    return round(n / 2**30, 2)


def _machine(mx, mlxnet) -> dict:
    out = {"backend": mlxnet.backend(), "mlx": mx.__version__}
    try:
        info = mx.device_info() if hasattr(mx, "device_info") else mx.metal.device_info()
        out["device_name"] = str(info.get("device_name", ""))
    except Exception:  # noqa: BLE001 - informative only
        pass
    return out


def measure_lama(size: int, dtype: str, device: str) -> dict:
    import mlxnet

    mlxnet.use_device(device)
    import mlx.core as mx
    import numpy as np

    from mlxnet.dtypes import compute_dtype
    from mlxnet.models.lama import LaMa

    net = LaMa().fuse()  # as LaMa.from_pretrained loads it
    target = compute_dtype(dtype)  # as LaMa.from_pretrained: half precision computes in float32 on the CPU
    if target is not None and target != mx.float32:
        net.set_dtype(target)
    mx.eval(net.parameters())
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    mask = np.zeros((size, size), np.uint8)
    mask[size // 4:3 * size // 4, size // 4:3 * size // 4] = 255
    mx.reset_peak_memory()
    start = time.perf_counter()
    out = net.inpaint(image, mask)
    seconds = time.perf_counter() - start
    assert out.shape == image.shape
    return {"path": "lama", "size": f"{size}x{size}", "dtype": str(net.dtype).split(".")[-1],
            **_machine(mx, mlxnet), "seconds": round(seconds, 2),
            "mlx_peak_gib": _gib(mx.get_peak_memory()), "peak_rss_gib": _rss_gib(),
            "output_sum": int(out.astype(np.int64).sum())}


def measure_amg(size: tuple[int, int], dtype: str, device: str, sam_weights: str, grid: int = 32,
                pred_iou_thresh: float = 0.88, stability_thresh: float = 0.95) -> dict:
    import mlxnet

    mlxnet.use_device(device)
    import mlx.core as mx
    import numpy as np
    from PIL import Image
    from safetensors.numpy import save_file

    from mlxnet import families
    from mlxnet.image import load_image, save_image

    sys.path.insert(0, str(ROOT / "scripts" / "bench"))
    from bench_sam_everything import seeded_weights

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        photo = tmp / "photo.jpg"
        Image.open(BUS).convert("RGB").resize(size, Image.BICUBIC).save(photo, quality=95)
        weights = Path(sam_weights) if sam_weights != "seeded" else tmp / "mobile_sam_seeded.safetensors"
        if sam_weights == "seeded":
            save_file(seeded_weights(), str(weights))
        # As `mlxnet segment PHOTO --everything` (mlxnet/commands/segment.py) with its defaults.
        family = families.for_task("sam-tiny", "segment")
        predictor = family.predictor(str(weights), "sam-tiny", dtype)
        pixels = load_image(str(photo))
        mx.reset_peak_memory()
        start = time.perf_counter()
        result = family.segment_everything(
            predictor, pixels, points_per_side=grid, points_per_batch=64, pred_iou_thresh=pred_iou_thresh,
            stability_score_thresh=stability_thresh, stability_score_offset=1.0, box_nms_thresh=0.7, progress=None)
        seconds = time.perf_counter() - start
        mlx_peak, rss = mx.get_peak_memory(), _rss_gib()
        start = time.perf_counter()
        save_image(result.render(pixels), tmp / "out.png")
        save_image(result.mask_image(), tmp / "out.mask.png")
        finish = time.perf_counter() - start
        masks = result.to_dict()["masks"]
    return {"path": "amg", "size": f"{size[0]}x{size[1]}", "dtype": dtype, **_machine(mx, mlxnet),
            "weights": "seeded" if sam_weights == "seeded" else Path(sam_weights).name,
            "points_per_side": grid, "pred_iou_thresh": pred_iou_thresh, "stability_thresh": stability_thresh,
            "masks": len(masks), "areas": sum(m["area"] for m in masks),
            "seconds": round(seconds, 2), "mlx_peak_gib": _gib(mlx_peak), "peak_rss_gib": rss,
            "finish_seconds": round(finish, 2), "finish_mlx_peak_gib": _gib(mx.get_peak_memory()),
            "finish_peak_rss_gib": _rss_gib()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", metavar="lama|amg", help="which to measure (default: both)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    ap.add_argument("--lama-size", nargs="+", type=int, default=[2048], metavar="SIDE")
    ap.add_argument("--amg-size", default="3000x4000", metavar="WxH")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--sam-weights", default="seeded", metavar="FILE",
                    help="amg: MobileSAM's mobile_sam.pt (or safetensors); default: the tests' seeded weights, "
                         "with which no mask passes the default thresholds (nothing is upscaled)")
    ap.add_argument("--points-per-side", type=int, default=32, help="amg: as mlxnet segment's")
    ap.add_argument("--pred-iou-thresh", type=float, default=0.88, help="amg: as mlxnet segment's (0: every "
                    "mask is upscaled, the most upscaling work)")
    ap.add_argument("--stability-thresh", type=float, default=0.95, help="amg: as mlxnet segment's")
    ap.add_argument("--repeat", type=int, default=1, help="fresh processes of each")
    ap.add_argument("--gpu-memory", default="default", choices=["default", "low", "min"],
                    help="as the command's MLXNET_GPU_MEMORY (mlxnet.tune_gpu; min holds on the CPU too)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # child process: "lama:SIDE" or "amg:WxH"
    a = ap.parse_args()
    if set(a.paths) - {"lama", "amg"}:
        ap.error(f"paths: lama and/or amg, got {a.paths}")
    if a.one:
        import mlxnet

        mlxnet.tune_gpu(**mlxnet.GPU_MEMORY_SETTINGS[a.gpu_memory])  # before any MLX work, as the command
        what, arg = a.one.split(":")
        if what == "lama":
            report = measure_lama(int(arg), a.dtype, a.device)
        else:
            w, h = (int(v) for v in arg.split("x"))
            report = measure_amg((w, h), a.dtype, a.device, a.sam_weights, a.points_per_side,
                                 a.pred_iou_thresh, a.stability_thresh)
        print(json.dumps({**report, "gpu_memory": a.gpu_memory}))
        return
    runs = [f"lama:{s}" for s in a.lama_size] if "lama" in a.paths or not a.paths else []
    runs += [f"amg:{a.amg_size}"] if "amg" in a.paths or not a.paths else []
    for _ in range(a.repeat):
        for run in runs:
            out = subprocess.run([sys.executable, __file__, "--one", run, "--dtype", a.dtype, "--device", a.device,
                                  "--sam-weights", a.sam_weights, "--points-per-side", str(a.points_per_side),
                                  "--pred-iou-thresh", str(a.pred_iou_thresh),
                                  "--stability-thresh", str(a.stability_thresh), "--gpu-memory", a.gpu_memory],
                                 capture_output=True, text=True)
            line = out.stdout.strip().splitlines()[-1:] if out.returncode == 0 else []
            print(line[0] if line else json.dumps({"run": run, "error": out.stderr.strip()[-800:]}), flush=True)


if __name__ == "__main__":
    main()
