"""Interactive latencies: click-to-mask and the image embedding against MobileSAM, and erasing a
12-megapixel photo (time and peak memory), on this machine.

    python scripts/bench/bench_app.py [--image tests/fixtures/yolo/bus.jpg] [--point 150,650]
            [--repeat 20] [--threads 2] [--erase-size 4000x3000] [--only click erase]

click: the server's work for one click on an image whose embedding is cached,
``SamPredictor.predict_best`` (prompt encoder, mask decoder, the best mask upsampled to the
image), and its PNG encoding for the page; beside it mlxnet's ``SamPredictor.predict`` (three
masks upsampled, as SAM's predictor does) and MobileSAM's ``SamPredictor.predict`` (PyTorch, three
masks, ``multimask_output=True``), each the median of ``--repeat`` calls after two warm-up calls;
and the embedding (``set_image``, median of 3) on both sides. MobileSAM runs in its own process
(two thread pools in one process would share the cores). Weights: the tests' seeded ones
(mobile_sam.pt's keys, tests/fixtures/sam/), the same on both sides. mlxnet's side runs as the
``mlxnet`` command (so ``mlxnet app``) runs: glibc keeps freed memory for reuse
(:func:`mlxnet.tune_cpu`) unless ``MLXNET_MALLOC=system``, which times the library in a plain
Python process instead (every large array then page-faults afresh); its record says which.

erase: whole ``mlxnet erase`` processes on the photo resized to ``--erase-size``, with the seeded
SAM weights and LaMa's random ones (speed does not depend on the values): once with a point
(SAM's mask for it, then LaMa on the crop; with these seeded weights the mask covers the whole
photo, so LaMa's crop is the photo resized to 1024 px: the largest case) and once with a fixed
mask of a person's size (a third of the photo's height, a sixth of its width), each timed from
start to exit with the process's peak resident set (``os.wait4``) and MLX's peak allocation
(``mx.get_peak_memory`` at exit: on a GPU, the device memory the resident set does not show).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "bench"))
sys.path.insert(0, str(ROOT / "scripts" / "goldens"))


def median_ms(call, repeat: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1000, 1)


def mlxnet_side(image_path: str, weights: str, point: list[float], repeat: int, device: str) -> dict:
    import numpy as np

    import mlxnet
    from mlxnet import env
    from mlxnet.app.server import png_bytes
    from mlxnet.image import load_image
    from mlxnet.models.sam import SamPredictor

    if env.switch("MLXNET_MALLOC") == "tuned":  # as the mlxnet command does for its process
        mlxnet.tune_cpu()
    mlxnet.use_device(device)
    image = load_image(image_path)
    predictor = SamPredictor.from_pretrained(weights)
    embed = median_ms(lambda: predictor.set_image(image), 3, warmup=1)
    coords, labels = np.array([point]), np.array([1])
    mask, _ = predictor.predict_best(coords, labels)
    return {"image": f"{image.shape[1]}x{image.shape[0]}", "malloc": mlxnet.malloc_info(), "embed_ms": embed,
            "click_ms": median_ms(lambda: predictor.predict_best(coords, labels), repeat),
            "click_png_ms": median_ms(lambda: png_bytes(mask), repeat),
            "predict_3_masks_ms": median_ms(lambda: predictor.predict(coords, labels, multimask_output=True), repeat)}


def mobile_sam_side(image_path: str, weights: str, point: list[float], repeat: int, threads: int,
                    device: str) -> dict:
    import numpy as np
    import torch
    from PIL import Image
    from safetensors.numpy import load_file

    from bench_sam_everything import torchvision_stand_in

    torch.set_num_threads(threads)
    try:
        import torchvision.transforms.functional  # noqa: F401
    except Exception:  # noqa: BLE001 - missing, or built for another torch
        torchvision_stand_in()
    import sam_reference

    mobile_sam = sam_reference.package()
    sam = mobile_sam.sam_model_registry["vit_t"]()
    missing, unexpected = sam.load_state_dict({k: torch.from_numpy(v) for k, v in load_file(weights).items()},
                                              strict=False)
    assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing), (missing, unexpected)
    sam.eval()
    cuda = device == "gpu" and torch.cuda.is_available()
    if cuda:
        sam.to("cuda")
    predictor = mobile_sam.SamPredictor(sam)

    def embed_image() -> None:  # set_image leaves its features on the GPU: wait for them
        predictor.set_image(image)
        if cuda:
            torch.cuda.synchronize()

    image = np.asarray(Image.open(image_path).convert("RGB"))
    coords, labels = np.array([point]), np.array([1])
    with torch.inference_mode():
        embed = median_ms(embed_image, 3, warmup=1)
        click = median_ms(lambda: predictor.predict(coords, labels, multimask_output=True), repeat)
    return {"embed_ms": embed, "predict_3_masks_ms": click, "device": "cuda" if cuda else "cpu"}


def child_env(threads: int, device: str) -> dict:
    """The children's environment: the threads and device asked for, mlxnet importable from
    this checkout after whatever the caller's PYTHONPATH already gives."""
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MLXNET_DEVICE": device, "PYTHONPATH": path}


# ``python -m mlxnet ...`` that also reports MLX's peak allocation at exit (on a GPU, device
# memory, which the resident set does not show), on stderr.
WITH_MLX_PEAK = ("import atexit, runpy, sys; import mlx.core as mx; "
                 "atexit.register(lambda: print('mlx-peak-bytes', mx.get_peak_memory(), file=sys.stderr)); "
                 "sys.argv[0] = 'mlxnet'; runpy.run_module('mlxnet', run_name='__main__', alter_sys=True)")


def measured_rss(command: list[str], threads: int, device: str, cwd: str) -> dict:
    """Wall time, peak RSS and MLX's peak allocation of one whole process (its last stdout line:
    erase's JSON record)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(command, stdout=out, stderr=err, env=child_env(threads, device), cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        out.seek(0), err.seek(0)
        if os.waitstatus_to_exitcode(status) != 0:
            return {"error": err.read()[-1500:]}
        record = json.loads(out.read().strip().splitlines()[-1])
        peaks = [int(line.split()[1]) for line in err.read().splitlines() if line.startswith("mlx-peak-bytes ")]
    return {"seconds": round(seconds, 1), "erase_seconds": record["seconds"],
            "peak_rss_gib": round(usage.ru_maxrss / 2**20, 2),  # Linux: KiB
            "mlx_peak_gib": round(peaks[-1] / 2**30, 2) if peaks else None,
            "crop": record["crop"], "lama_size": record["lama_size"], "filled_pixels": record["filled_pixels"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", default=str(ROOT / "tests" / "fixtures" / "yolo" / "bus.jpg"))
    ap.add_argument("--point", default="150,650", help="the click, X,Y in the image's pixels")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--erase-size", default="4000x3000", help="WIDTHxHEIGHT of the photo to erase in")
    ap.add_argument("--only", nargs="+", choices=["click", "erase"], default=["click", "erase"])
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                    help="where both sides run (MobileSAM on CUDA for gpu, where PyTorch has it)")
    ap.add_argument("--side", nargs=3, metavar=("SIDE", "WEIGHTS", "REPEAT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    point = [float(v) for v in a.point.split(",")]
    if a.side:
        side, weights, repeat = a.side
        result = (mlxnet_side(a.image, weights, point, int(repeat), a.device) if side == "mlxnet"
                  else mobile_sam_side(a.image, weights, point, int(repeat), a.threads, a.device))
        print(json.dumps(result))
        return

    from safetensors.numpy import save_file

    from bench_sam_everything import seeded_weights

    with tempfile.TemporaryDirectory() as tmp:
        weights = str(Path(tmp) / "mobile_sam_seeded.safetensors")
        save_file(seeded_weights(), weights)
        print(f"image {a.image}, click {a.point}, seeded weights, {a.threads} threads, {a.device}", flush=True)
        if "click" in a.only:
            for side in ("mlxnet", "mobilesam"):
                out = subprocess.run([sys.executable, __file__, "--image", a.image, "--point", a.point,
                                      "--threads", str(a.threads), "--device", a.device, "--side", side, weights,
                                      str(a.repeat)],
                                     capture_output=True, text=True, env=child_env(a.threads, a.device), cwd=tmp)
                report = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else \
                    {"error": out.stderr[-1500:]}
                print(json.dumps({"run": f"click/{side}", **report}), flush=True)
        if "erase" in a.only:
            from PIL import Image

            w, h = (int(v) for v in a.erase_size.split("x"))
            photo = Path(tmp) / f"photo_{w}x{h}.jpg"
            source = Image.open(a.image).convert("RGB")
            sx, sy = w / source.width, h / source.height
            source.resize((w, h), Image.BICUBIC).save(photo, quality=92)
            mask = Path(tmp) / "mask.png"
            rect = Image.new("L", (w, h))
            rect.paste(255, (w // 2 - w // 12, h // 3, w // 2 + w // 12, 2 * h // 3))
            rect.save(mask)
            base = [sys.executable, "-c", WITH_MLX_PEAK, "erase", str(photo), "--sam-weights", weights,
                    "--lama-weights", "random", "--json"]
            runs = {"point": ["--point", f"{point[0] * sx:.0f},{point[1] * sy:.0f}"], "mask": ["--mask", str(mask)]}
            for name, args in runs.items():
                report = measured_rss([*base, *args, "-o", str(Path(tmp) / f"erased_{name}.png")], a.threads,
                                      a.device, tmp)
                print(json.dumps({"run": f"erase/{name}", "photo": f"{w}x{h}", **report}), flush=True)


if __name__ == "__main__":
    main()
