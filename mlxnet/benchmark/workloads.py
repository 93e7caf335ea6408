"""What ``mlxnet bench`` times: each model's default forward at a batch size and dtype, with
random weights (speed does not depend on the values), and its PyTorch baseline where asked.

A workload's PyTorch side is built only when a comparison asks for it, so the benchmark runs
without torch installed. Baselines: torchvision's ResNets, ultralytics' DetectionModel and
MobileSAM's modules where they import, else the plain-torch twins in :mod:`.torch_twins`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import mlx.core as mx

from .. import families
from .measure import torch_device


@dataclass
class TorchSide:
    """A PyTorch module (or plain function) with its inputs, on the device, and what it is."""
    module: Any
    inputs: tuple
    note: str
    dtype: str = "float32"


@dataclass
class Workload:
    """One model at one batch size and dtype: ``forward()`` builds the outputs (unevaluated);
    ``torch()`` builds the baseline."""
    forward: Callable[[], Any]
    torch: Callable[[], TorchSide] | None = None
    note: str = ""


Build = Callable[[str, int, str], Workload]  # (device, batch, dtype) -> Workload


@dataclass
class Entry:
    build: Build
    size: str = ""


def _torch_ready(module: Any, inputs: tuple, device: str, dtype: str, note: str) -> TorchSide:
    """Module and inputs on the device, in float16 where the device runs it (CUDA, MPS)."""
    dev = torch_device(device)
    half = dtype == "float16" and dev.type != "cpu"
    module = module.eval().to(dev)
    inputs = tuple(x.to(dev) for x in inputs)
    if half:
        module = module.half()
        inputs = tuple(x.half() if x.is_floating_point() else x for x in inputs)
    return TorchSide(module, inputs, note, "float16" if half else "float32")


def _build(variant: str) -> Any:
    """A registered model with random weights, through the model interface."""
    return families.family_of(variant).build(variant)


def _mlx_ready(model: Any, dtype: str) -> Any:
    model.eval()
    if dtype != "float32":
        model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
    return model


def resnet(name: str, size: int = 224) -> Entry:
    def build(device: str, batch: int, dtype: str) -> Workload:
        model = _mlx_ready(_build(name).fuse(), dtype)  # BatchNorms folded, as the classifier runs
        x = mx.random.normal((batch, size, size, 3)).astype(getattr(mx, dtype))

        def torch_side() -> TorchSide:
            import torch

            try:
                import torchvision

                tmodel, note = getattr(torchvision.models, name)(), "torchvision"
            except Exception:  # noqa: BLE001 - missing, or not matching this torch
                from .torch_twins.resnet import resnet as twin

                tmodel, note = twin(name), "plain-torch twin (torchvision unavailable)"
            return _torch_ready(tmodel, (torch.randn(batch, 3, size, size),), device, dtype, note)
        return Workload(lambda: model(x), torch_side)
    return Entry(build, size=f"{size}²")


def yolo(variant: str, size: int = 640) -> Entry:
    """A YOLO network's forward (BN folded, as both predictors run it) on size² images: every
    output the predictor reads (a segment model's prototypes and mask coefficients, a pose
    model's keypoints), against ultralytics' own model of the same yaml where it is installed
    (a plain-torch twin of YOLOv8's detectors otherwise)."""
    def build(device: str, batch: int, dtype: str) -> Workload:
        net = _mlx_ready(_build(variant).fuse(), dtype)
        x = mx.random.uniform(shape=(batch, size, size, 3)).astype(getattr(mx, dtype))

        def torch_side() -> TorchSide:
            import torch

            try:
                from ultralytics.nn import tasks

                kind = {"segment": tasks.SegmentationModel, "pose": tasks.PoseModel}.get(net.task, tasks.DetectionModel)
                tmodel = kind(f"{variant}.yaml", verbose=False).eval().fuse(verbose=False)
                note = f"ultralytics {kind.__name__} (fused)"
            except ImportError:  # ultralytics needs torchvision
                if not variant.startswith("yolov8") or "-" in variant:
                    raise
                from .torch_twins.yolo import YOLOv8

                tmodel, note = YOLOv8(variant[-1]), "plain-torch twin (ultralytics unavailable)"
            return _torch_ready(tmodel, (torch.rand(batch, 3, size, size),), device, dtype, note)
        forward = (lambda: net(x)) if net.task == "detect" else (lambda: list(net.task_outputs(x).values()))
        has_twin = variant.startswith("yolov8") and "-" not in variant
        return Workload(forward, torch_side if has_twin or _ultralytics_installed() else None,
                        note="" if has_twin or _ultralytics_installed() else "no PyTorch baseline (needs ultralytics)")
    return Entry(build, size=f"{size}²")


def _ultralytics_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("ultralytics") is not None


def sam_encoder(size: int = 1024) -> Entry:
    """SAM-tiny's TinyViT image encoder on size² images."""
    def build(device: str, batch: int, dtype: str) -> Workload:
        encoder = _mlx_ready(_build("sam-tiny").image_encoder.fuse(), dtype)  # as from_pretrained loads it
        x = mx.random.normal((batch, size, size, 3)).astype(getattr(mx, dtype))

        def torch_side() -> TorchSide:
            import torch

            from .torch_twins import mobile_sam

            m = mobile_sam.modeling()
            tmodel = m.TinyViT(img_size=size, embed_dims=[64, 128, 160, 320], depths=[2, 2, 6, 2],
                               num_heads=[2, 4, 5, 10], window_sizes=[7, 7, 14, 7], drop_path_rate=0.0,
                               layer_lr_decay=0.8)
            return _torch_ready(tmodel, (torch.randn(batch, 3, size, size),), device, dtype, "MobileSAM TinyViT")
        return Workload(lambda: encoder(x), torch_side)
    return Entry(build, size=f"{size}²")


def sam_decoder() -> Entry:
    """SAM-tiny's prompt encoder + mask decoder: ``batch`` one-point prompts on one image's
    embedding (3 masks each)."""
    def build(device: str, batch: int, dtype: str) -> Workload:
        model = _mlx_ready(_build("sam-tiny"), dtype)
        emb = mx.random.normal((1, 64, 64, 256)).astype(getattr(mx, dtype))
        pts = mx.random.uniform(0, 1024, (batch, 1, 2))
        labels = mx.ones((batch, 1), mx.int32)
        pe = model.prompt_encoder.get_dense_pe()

        def forward() -> Any:
            sparse, dense = model.prompt_encoder((pts, labels), None, None)
            return model.mask_decoder(emb, pe, sparse, dense, True)

        def torch_side() -> TorchSide:
            import torch

            from .torch_twins import mobile_sam

            m = mobile_sam.modeling()

            class Decoder(torch.nn.Module):
                def __init__(self) -> None:
                    super().__init__()
                    self.penc = m.PromptEncoder(embed_dim=256, image_embedding_size=(64, 64),
                                                input_image_size=(1024, 1024), mask_in_chans=16)
                    self.dec = m.MaskDecoder(num_multimask_outputs=3, transformer=m.TwoWayTransformer(
                        depth=2, embedding_dim=256, mlp_dim=2048, num_heads=8), transformer_dim=256)

                def half(self):  # the prompt encoder's positional encoding stays float32, as in mlxnet
                    self.dec.half()
                    return self

                def forward(self, emb, pts, labels):
                    sparse, dense = self.penc((pts, labels), None, None)
                    return self.dec(emb, self.penc.get_dense_pe().to(emb.dtype), sparse.to(emb.dtype),
                                    dense.to(emb.dtype), True)
            side = _torch_ready(Decoder(), (torch.randn(1, 256, 64, 64), torch.rand(batch, 1, 2) * 1024,
                                            torch.ones(batch, 1, dtype=torch.int64)), device, dtype,
                                "MobileSAM prompt encoder + mask decoder")
            temb, tpts, tlab = side.inputs
            side.inputs = (temb, tpts.float(), tlab)  # the positional encoding runs in float32
            return side
        return Workload(forward, torch_side)
    return Entry(build, size="64² embedding")


def lama(size: int = 512) -> Entry:
    """The big-lama generator on size² masked images + masks. float16: mlxnet's FourierUnits stay
    float32 (as LaMa.set_dtype does); the torch twin runs all float16."""
    def build(device: str, batch: int, dtype: str) -> Workload:
        model = _mlx_ready(_build("lama").fuse(), dtype)  # as from_pretrained loads it
        x = mx.random.uniform(shape=(batch, size, size, 4))

        def torch_side() -> TorchSide:
            import torch

            from .torch_twins.lama import Generator

            return _torch_ready(Generator(), (torch.rand(batch, 4, size, size),), device, dtype,
                                "plain-torch big-lama")
        return Workload(lambda: model(x), torch_side)
    return Entry(build, size=f"{size}²")


def family(variant: str) -> Entry:
    """Any registered model variant through the model interface (no PyTorch baseline)."""
    fam = families.family_of(variant)

    def build(device: str, batch: int, dtype: str) -> Workload:
        model = _mlx_ready(fam.checked(fam.build(variant)), dtype)
        inputs = [mx.concatenate([a] * batch) for a in fam.example_inputs(variant, fam.default_size)]
        mx.eval(inputs)
        return Workload(lambda: model(*inputs), note="no PyTorch baseline")
    return Entry(build, size=f"{fam.default_size}²")


def entries() -> dict[str, Entry]:
    """Every benchmark id: the hand-made workloads (with PyTorch baselines), then every other
    registered model variant through the model interface."""
    made = {
        **{v: resnet(v) for v in families.variants() if v.startswith("resnet")},
        **{v: yolo(v) for v in families.variants() if v.startswith(("yolov8", "yolo11", "yolo26"))},
        "sam-tiny-encoder": sam_encoder(), "sam-tiny-decoder": sam_decoder(),
        "lama-512": lama(512),
    }
    rest = {v: family(v) for v in families.variants() if v not in made and v not in ALIASES}
    return {**made, **rest}


# A registered model's id stands for the workloads that time its parts.
ALIASES = {"sam-tiny": ("sam-tiny-encoder", "sam-tiny-decoder"), "lama": ("lama-512",)}
DEFAULT = ("resnet50", "yolov8n", "yolov8s", "sam-tiny-encoder", "sam-tiny-decoder", "lama-512")
