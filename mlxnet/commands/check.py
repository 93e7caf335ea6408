"""`mlxnet check`: compare a model on two configurations, layer by layer."""
from __future__ import annotations

import json
from typing import Callable, Optional

import mlx.core as mx
import mlx.nn as nn
import typer

from mlxnet.errors import MlxnetError

# name -> (weights id or path or None, image path or None, size) -> (model, inputs).
# Each model family adds its builder here.
Builder = Callable[[Optional[str], Optional[str], int], tuple]


def _resnet(name: str) -> Builder:
    def build(weights, image, size):
        import mlx.core as mx

        from mlxnet.image import load_image
        from mlxnet.models import resnet

        net = resnet.from_pretrained(weights, model=name) if weights else resnet.resnet(name)
        net.eval()
        x = resnet.preprocess(load_image(image)) if image else mx.random.normal((1, size, size, 3),
                                                                                 key=mx.random.key(0))
        return net, [x]
    return build


def _yolo(name: str) -> Builder:
    def build(weights, image, size):
        import mlx.core as mx

        from mlxnet.image import load_image
        from mlxnet.models import yolo, yolo_process

        net = yolo.YOLO.from_pretrained(weights, model=name, fuse=False).net if weights else yolo.YOLOv8(name[-1])
        if image:
            x = mx.array(yolo_process.letterbox(load_image(image), size)[None]) / 255
        else:
            side = max(32, size // 32 * 32)
            x = mx.random.uniform(shape=(1, side, side, 3), key=mx.random.key(0))
        return net, [x]
    return build


class SamPointPrompt(nn.Module):
    """SAM-tiny end to end on one image and one centre point: encoder, prompt encoder, decoder."""

    def __init__(self, sam: nn.Module) -> None:
        super().__init__()
        self.sam = sam

    def __call__(self, pixels: mx.array) -> mx.array:
        emb = self.sam.image_encoder(self.sam.preprocess(pixels))
        points = (mx.array([[[512.0, 512.0]]]), mx.array([[1]]))
        sparse, dense = self.sam.prompt_encoder(points, None, None)
        low_res, _ = self.sam.mask_decoder(emb, self.sam.prompt_encoder.get_dense_pe(), sparse, dense, True)
        return low_res


def _sam(weights, image, size):
    import mlx.core as mx

    from mlxnet.image import load_image, resize_pil
    from mlxnet.models import sam

    model = sam.from_pretrained(weights) if weights else sam.sam_tiny()
    if image:
        img = load_image(image)
        h, w = sam.preprocess_shape(*img.shape[:2], 1024)
        x = mx.array(resize_pil(img, (w, h))[None]).astype(mx.float32)
    else:
        x = mx.random.uniform(0, 255, (1, 1024, 1024, 3), key=mx.random.key(0))
    return SamPointPrompt(model), [x]


def _lama(name: str) -> Builder:
    def build(weights, image, size):
        import mlx.core as mx

        from mlxnet.models import lama

        net = lama.LaMa.from_pretrained(weights, model=name) if weights else lama.LaMa(lama.CONFIGS[name])
        if image:
            raise MlxnetError("check lama: use --size (LaMa needs an image and a mask; random ones are used)")
        side = max(8, size // 8 * 8)
        img = mx.random.uniform(shape=(1, side, side, 3), key=mx.random.key(0))
        mask = (mx.random.uniform(shape=(1, side, side, 1), key=mx.random.key(1)) > 0.7).astype(mx.float32)
        return net, [mx.concatenate([img * (1 - mask), mask], axis=-1)]
    return build


MODELS: dict[str, Builder] = {
    **{n: _resnet(n) for n in ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")},
    **{f"yolov8{s}": _yolo(f"yolov8{s}") for s in "nsmlx"},
    "sam-tiny": _sam,
    "lama": _lama("lama"),
    "lama-fourier": _lama("lama-fourier"),
}


def check(
    model: str = typer.Argument(..., help="Model name (see `mlxnet check --help`)."),
    image: Optional[str] = typer.Option(None, "--image", help="Run on this image (default: random input)."),
    weights: Optional[str] = typer.Option(None, "--weights", "-w", help="Weights id or file (default: random)."),
    dtype: str = typer.Option("float32", "--dtype", help="float32|float16|bfloat16 for the tested run."),
    against: str = typer.Option("cpu", "--against", help="Baseline: 'cpu' (every op's definition "
                                "on the CPU) or 'definitions' (definitions on this device)."),
    size: int = typer.Option(224, "--size", help="Side of the random input image."),
    show_all: bool = typer.Option(False, "--all", help="List every layer, not only failures."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Compare MODEL on this device (CPU fast paths or GPU kernels, DTYPE) against the ops'
    definitions in float32, layer by layer; exit 1 when a layer is beyond tolerance, naming
    the first one."""
    import mlx.core as mx

    from mlxnet import check as parity

    if model not in MODELS:
        raise MlxnetError(f"unknown model {model!r}; checkable: {', '.join(sorted(MODELS))}")
    mx.random.seed(0)
    net, inputs = MODELS[model](weights, image, size)
    report = parity.compare(net, inputs, against=against, dtype=dtype)  # type: ignore[arg-type]
    if as_json:
        print(json.dumps(report.to_dict(), indent=1, default=float))
    else:
        _print(report, show_all)
    if not report.passed:
        raise typer.Exit(1)


def _print(report, show_all: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{report.tested} vs {report.baseline}")
    for col in ("layer", "shape", "max abs", "max rel", "cosine", "flags", ""):
        table.add_column(col)
    rows = report.layers if show_all else [l for l in report.layers if not l.ok] + [report.layers[-1]]
    for l in rows:
        table.add_row(l.path, "×".join(map(str, l.shape)), f"{l.max_abs:.3g}", f"{l.max_rel:.3g}",
                      f"{l.cosine:.6f}", ",".join(l.flags), "ok" if l.ok else "[red]FAIL[/red]")
    console = Console()
    console.print(table)
    if report.passed:
        console.print(f"[green]passed[/green]: {len(report.layers)} layer outputs within {report.dtype} tolerance")
    else:
        bad = sum(not l.ok for l in report.layers)
        console.print(f"[red]failed[/red]: first diverging layer [bold]{report.first_failure}[/bold] "
                      f"({bad} of {len(report.layers)} outputs beyond tolerance)")
