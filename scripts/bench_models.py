"""Each landed model's latency: mlxnet vs PyTorch on the same device, in one run.

    python scripts/bench_models.py --device cpu [--only resnet50 ...] [--json out.json]
    python scripts/bench_models.py --device gpu        # Metal or CUDA; PyTorch on CUDA/MPS

Every entry builds both models with random weights (speed does not depend on the values)
and times one forward pass on the same input shape. Entries are plain functions in ENTRIES;
a model family adds one.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Callable

import mlxnet  # noqa: F401  (binds OpenBLAS before mlx.core on Linux)
from mlxnet import families
from mlxnet.env import switch
import mlx.core as mx
import numpy as np

Bench = tuple[Callable[[], object], Callable[[], object] | None, str]  # (mlx run, torch run, note)


def timeit_pair(a: Callable[[], object], sync_a: Callable[[], None],
                b: Callable[[], object] | None, sync_b: Callable[[], None],
                warmup: int = 2, reps: int = 5, pause: float = 0.25) -> tuple[float, float]:
    """Median wall times in ms of a() and b(), each call fully synchronised. The two alternate
    rep by rep, so a noisy (shared, virtual) machine slows both alike and their ratio holds;
    a pause before each call lets the other library's worker threads stop spinning (OpenMP
    spins ~200 ms after a parallel region), which would otherwise steal the cores."""
    def once(fn: Callable[[], object], sync: Callable[[], None]) -> float:
        time.sleep(pause)
        t = time.perf_counter()
        fn()
        sync()
        return (time.perf_counter() - t) * 1e3

    for _ in range(warmup):
        once(a, sync_a)
        if b is not None:
            once(b, sync_b)
    ta, tb = [], []
    for _ in range(reps):
        ta.append(once(a, sync_a))
        if b is not None:
            tb.append(once(b, sync_b))
    return statistics.median(ta), (statistics.median(tb) if tb else float("nan"))


def torch_device(device: str):
    import torch

    if device == "gpu":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
    return torch.device("cpu")


def torch_sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize()
    elif dev.type == "mps":
        torch.mps.synchronize()


# --- entries --------------------------------------------------------------------------------------

def resnet_entry(name: str, batch: int = 1, size: int = 224) -> Callable[[str], Bench]:
    def build(device: str) -> Bench:
        import torch

        from mlxnet.models import resnet

        model = resnet.resnet(name)
        model.eval()
        x = mx.random.normal((batch, size, size, 3))
        mx.eval(model.parameters(), x)
        run_mlx = lambda: mx.eval(model(x))  # noqa: E731
        try:
            import torchvision

            tmodel = getattr(torchvision.models, name)().eval()
            note = "torchvision"
        except Exception:  # torchvision missing or broken (PyPI's, against CPU torch here)
            tmodel = _torch_resnet(name).eval()
            note = "same architecture in plain torch (torchvision unavailable)"
        dev = torch_device(device)
        tmodel = tmodel.to(dev)
        tx = torch.randn(batch, 3, size, size, device=dev)

        def run_torch():
            with torch.no_grad():
                tmodel(tx)
        return run_mlx, run_torch, note
    return build


def _torch_resnet(name: str):
    """Timing stand-in for torchvision's ResNet where torchvision cannot be imported."""
    import torch.nn as tnn

    from mlxnet.models.resnet import CONFIGS, Bottleneck

    cfg = CONFIGS[name]
    bottleneck = cfg.block is Bottleneck

    class Block(tnn.Module):
        def __init__(self, cin, planes, stride):
            super().__init__()
            exp = 4 if bottleneck else 1
            if bottleneck:
                self.body = tnn.Sequential(
                    tnn.Conv2d(cin, planes, 1, bias=False), tnn.BatchNorm2d(planes), tnn.ReLU(),
                    tnn.Conv2d(planes, planes, 3, stride, 1, bias=False), tnn.BatchNorm2d(planes), tnn.ReLU(),
                    tnn.Conv2d(planes, planes * exp, 1, bias=False), tnn.BatchNorm2d(planes * exp))
            else:
                self.body = tnn.Sequential(
                    tnn.Conv2d(cin, planes, 3, stride, 1, bias=False), tnn.BatchNorm2d(planes), tnn.ReLU(),
                    tnn.Conv2d(planes, planes, 3, 1, 1, bias=False), tnn.BatchNorm2d(planes))
            self.short = (tnn.Sequential(tnn.Conv2d(cin, planes * exp, 1, stride, bias=False),
                                         tnn.BatchNorm2d(planes * exp))
                          if stride != 1 or cin != planes * exp else tnn.Identity())
            self.out = planes * exp

        def forward(self, x):
            return (self.body(x) + self.short(x)).relu()

    layers, cin = [tnn.Conv2d(3, 64, 7, 2, 3, bias=False), tnn.BatchNorm2d(64), tnn.ReLU(),
                   tnn.MaxPool2d(3, 2, 1)], 64
    for i, (planes, n) in enumerate(zip((64, 128, 256, 512), cfg.layers)):
        for j in range(n):
            b = Block(cin, planes, 2 if i > 0 and j == 0 else 1)
            layers.append(b)
            cin = b.out
    layers += [tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(cin, 1000)]
    return tnn.Sequential(*layers)


def yolo_entry(scale: str, size: int = 640) -> Callable[[str], Bench]:
    """YOLOv8 network forward (BN folded, as both predictors run it) on one 640x640 image, vs
    ultralytics' DetectionModel where the ultralytics package imports (it needs torchvision)."""
    def build(device: str) -> Bench:
        from mlxnet.models import yolo

        net = yolo.YOLOv8(scale).fuse()
        x = mx.random.uniform(shape=(1, size, size, 3))
        mx.eval(net.parameters(), x)
        run_mlx = lambda: mx.eval(net(x))  # noqa: E731
        try:
            import torch
            from ultralytics.nn.tasks import DetectionModel

            dev = torch_device(device)
            tmodel = DetectionModel(f"yolov8{scale}.yaml", verbose=False).eval().fuse(verbose=False).to(dev)
            tx = torch.rand(1, 3, size, size, device=dev)

            def run_torch():
                with torch.no_grad():
                    tmodel(tx)
            return run_mlx, run_torch, "ultralytics DetectionModel (fused)"
        except ImportError:  # ultralytics needs torchvision: time the same network in plain torch
            import sys
            from pathlib import Path

            import torch

            sys.path.insert(0, str(Path(__file__).parent))
            import yolo_torch

            dev = torch_device(device)
            tmodel = yolo_torch.YOLOv8(scale).eval().to(dev)
            tx = torch.rand(1, 3, size, size, device=dev)

            def run_plain():
                with torch.no_grad():
                    tmodel(tx)
            return run_mlx, run_plain, "same network in plain torch (scripts/yolo_torch.py; ultralytics unavailable)"
    return build


def yolo_nms_entry(candidates: int) -> Callable[[str], Bench]:
    """Postprocess (threshold + class-aware NMS, max_det 300) of one 640x640 head output (8400
    anchors) with about ``candidates`` boxes over the threshold, vs ultralytics' NMS."""
    def build(device: str) -> Bench:
        from mlxnet.models import yolo
        from mlxnet.models.yolo_process import postprocess

        pred = yolo.seeded("n")(mx.random.uniform(shape=(1, 640, 640, 3), key=mx.random.key(1)))[0]
        best = np.sort(np.array(pred[:, 4:].max(axis=-1)))[::-1]
        conf = float(best[min(candidates, len(best) - 1)])
        mx.eval(pred)
        run_mlx = lambda: postprocess(pred, conf=conf, iou=0.7)  # noqa: E731
        note = f"{len(postprocess(pred, conf=conf, iou=0.7))} kept of {candidates} candidates"
        try:
            import torch
            from ultralytics.utils.nms import non_max_suppression

            tpred = torch.from_numpy(np.array(pred).T[None].copy()).to(torch_device(device))
            return run_mlx, lambda: non_max_suppression(tpred, conf, 0.7), note + "; vs ultralytics NMS"
        except ImportError:
            return run_mlx, None, note
    return build


def sam_entry(part: str) -> Callable[[str], Bench]:
    """SAM-tiny: the TinyViT encoder on one 1024x1024 image ("encoder"), or one point prompt through
    the prompt encoder + mask decoder ("decoder", 3 masks), vs MobileSAM's modules (scripts/sam_reference.py)."""
    def build(device: str) -> Bench:
        from mlxnet.models import sam

        model = sam.sam_tiny()
        x = mx.random.normal((1, 1024, 1024, 3))
        emb = mx.random.normal((1, 64, 64, 256))
        pts, labels = mx.array([[[500.0, 400.0]]]), mx.array([[1]])
        mx.eval(model.parameters(), x, emb)

        def run_mlx():
            if part == "encoder":
                return mx.eval(model.image_encoder(x))
            sparse, dense = model.prompt_encoder((pts, labels), None, None)
            mx.eval(model.mask_decoder(emb, model.prompt_encoder.get_dense_pe(), sparse, dense, True))
        try:
            import sys
            from pathlib import Path

            import torch

            sys.path.insert(0, str(Path(__file__).parent))
            import sam_reference

            m = sam_reference.modeling()
        except ImportError as e:
            return run_mlx, None, str(e)
        dev = torch_device(device)
        enc = m.TinyViT(img_size=1024, embed_dims=[64, 128, 160, 320], depths=[2, 2, 6, 2], num_heads=[2, 4, 5, 10],
                        window_sizes=[7, 7, 14, 7], drop_path_rate=0.0, layer_lr_decay=0.8).eval().to(dev)
        penc = m.PromptEncoder(embed_dim=256, image_embedding_size=(64, 64), input_image_size=(1024, 1024),
                               mask_in_chans=16).eval().to(dev)
        dec = m.MaskDecoder(num_multimask_outputs=3, transformer=m.TwoWayTransformer(
            depth=2, embedding_dim=256, mlp_dim=2048, num_heads=8), transformer_dim=256).eval().to(dev)
        tx, temb = torch.randn(1, 3, 1024, 1024, device=dev), torch.randn(1, 256, 64, 64, device=dev)
        tpts, tlab = torch.tensor([[[500.0, 400.0]]], device=dev), torch.tensor([[1]], device=dev)

        def run_torch():
            with torch.no_grad():
                if part == "encoder":
                    return enc(tx)
                sparse, dense = penc((tpts, tlab), None, None)
                dec(temb, penc.get_dense_pe(), sparse, dense, True)
        return run_mlx, run_torch, "MobileSAM (github ChaoningZhang/MobileSAM)"
    return build


def lama_entry(size: int = 512, dtype: str = "float32") -> Callable[[str], Bench]:
    """LaMa (big-lama) generator on one size x size masked image + mask, vs the same generator in
    plain PyTorch (scripts/lama_torch.py, checked against advimman/lama by scripts/golden_lama.py).
    float16: the mlxnet model in float16 (FFTs stay float32); torch in float16 on CUDA, else float32."""
    def build(device: str) -> Bench:
        import sys
        from pathlib import Path

        import torch

        from mlxnet.models.lama import LaMa

        model = LaMa()
        if dtype != "float32":
            model.set_dtype(getattr(mx, dtype))
        x = mx.random.uniform(shape=(1, size, size, 4))
        mx.eval(model.parameters(), x)
        run_mlx = lambda: mx.eval(model(x))  # noqa: E731
        sys.path.insert(0, str(Path(__file__).parent))
        import lama_torch

        dev = torch_device(device)
        half = dtype != "float32" and dev.type == "cuda"
        tmodel = lama_torch.Generator().eval().to(dev)
        tx = torch.rand(1, 4, size, size, device=dev)
        if half:
            tmodel, tx = tmodel.half(), tx.half()

        def run_torch():
            with torch.no_grad():
                tmodel(tx)
        return run_mlx, run_torch, f"plain-torch big-lama ({'float16' if half else 'float32'})"
    return build


ENTRIES: dict[str, Callable[[str], Bench]] = {
    "resnet18": resnet_entry("resnet18"),
    "resnet50": resnet_entry("resnet50"),
    **{f"yolov8{s}": yolo_entry(s) for s in "nsmlx"},
    "yolov8-nms-300": yolo_nms_entry(300), "yolov8-nms-8400": yolo_nms_entry(8399),
    "lama-512": lama_entry(512), "lama-512-fp16": lama_entry(512, "float16"),
    "sam-tiny-encoder": sam_entry("encoder"), "sam-tiny-decoder": sam_entry("decoder"),
}


def family_entry(variant: str) -> Callable[[str], Bench]:
    """Any registered model variant, through the model interface (no PyTorch baseline)."""
    def build(device: str) -> Bench:
        family = families.family_of(variant)
        model = family.checked(family.build(variant))
        inputs = family.example_inputs(variant, family.default_size)
        mx.eval(model.parameters(), inputs)
        return lambda: mx.eval(model(*inputs)), None, "no PyTorch baseline in this script"
    return build


def entries() -> dict[str, Callable[[str], Bench]]:
    """The hand-made entries (with PyTorch baselines), then every other registered variant."""
    covered = {name.split("-encoder")[0].split("-decoder")[0].split("-512")[0] for name in ENTRIES}
    extra = {v: family_entry(v) for v in families.variants() if v not in covered and v not in ENTRIES}
    return {**ENTRIES, **extra}


def main() -> None:
    if switch("MLXNET_MALLOC") == "tuned":
        mlxnet.tune_cpu()  # as the mlxnet command does for its own process
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--list", action="store_true", help="list the entries and exit")
    a = ap.parse_args()
    if a.list:
        print("\n".join(entries()))
        return
    mlxnet.use_device(a.device)
    import torch

    dev = torch_device(a.device)
    # Build or load the CPU primitives before any timing.
    native = mlxnet.native_info(build=a.device == "cpu")
    print(f"mlxnet backend {mlxnet.backend()} ({mlxnet.blas_info()}; malloc "
          f"{mlxnet.malloc_info()}; CPU primitives {native}); torch {torch.__version__} on {dev}, "
          f"{torch.get_num_threads()} threads")
    print(f"{'model':24s} {'mlxnet ms':>10s} {'torch ms':>10s} {'mlxnet/torch':>13s}  note")
    rows = []
    for name, build in entries().items():
        if a.only and name not in a.only:
            continue
        run_mlx, run_torch, note = build(a.device)
        t_mlx, t_torch = timeit_pair(run_mlx, mx.synchronize, run_torch, lambda: torch_sync(dev), reps=a.reps)
        rows.append({"model": name, "mlxnet_ms": t_mlx, "torch_ms": t_torch, "note": note})
        print(f"{name:24s} {t_mlx:10.1f} {t_torch:10.1f} {t_mlx / t_torch:13.2f}  {note}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": a.device, "backend": mlxnet.backend(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    np.random.seed(0)
    main()
