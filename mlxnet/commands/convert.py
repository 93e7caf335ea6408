"""`mlxnet convert`: a PyTorch checkpoint into mlxnet safetensors, or (OUTPUT ending in .pt) a
YOLOv8 of mlxnet's back into an ultralytics checkpoint."""
from __future__ import annotations

from typing import Optional

import typer

from mlxnet.commands import grammar
from rich.console import Console


def convert(
    src: str = typer.Argument(..., metavar="SOURCE", help="PyTorch checkpoint (.pt/.pth/.ckpt, read without running pickled code), "
                              "safetensors file, or a model id to fetch from the Hub."),
    dst: str = typer.Argument(..., metavar="OUTPUT", help="Output .safetensors file (mlxnet layout); or a .pt: "
                              "a YOLOv8 (say, train detect's best.safetensors) as an ultralytics checkpoint, "
                              "where PyTorch and ultralytics are installed."),
    model: Optional[str] = typer.Option(None, "--model", "-m", metavar="ID",
                                        help="Weight spec id: the key table and layouts to apply (`mlxnet models`); "
                                             "default: the model the checkpoint says it holds."),
    dtype: str = typer.Option("float32", "--dtype", metavar="DTYPE",
                              help="Dtype of the written floats: float32 (default, whatever the checkpoint "
                                   "stores), float16 or bfloat16. Every step runs in float32; the cast is last."),
    fold_bn: bool = typer.Option(False, "--fold-bn", help="Fold BatchNorms into the convs the spec pairs them with "
                                                         "(in float32)."),
    labels: Optional[str] = typer.Option(None, "--labels",
                                         help="Class names to store with the weights: a file with one per line, "
                                              "or a JSON list / {index: name} object (default: the checkpoint's own)."),
    force: bool = grammar.force("Replace OUTPUT if it exists (without it, an existing file is refused)."),
    device: Optional[str] = grammar.device(),
) -> None:
    """Convert a PyTorch checkpoint into mlxnet safetensors (SOURCE is never modified)."""
    grammar.apply_device(device)
    from mlxnet.weights import convert_checkpoint, read_labels
    from mlxnet.weights.safetensors_io import load_safetensors_with_metadata

    if dst.lower().endswith(".pt"):
        from mlxnet.weights.ultralytics_export import write_ultralytics_checkpoint

        out = write_ultralytics_checkpoint(src, dst, force=force)
        Console().print(f"wrote {out} (ultralytics: YOLO({str(out)!r}))", soft_wrap=True)
        return
    names = read_labels(labels) if labels else None
    # without --model: the model the checkpoint says it holds
    out = convert_checkpoint(src, dst, model, dtype=dtype, fold_bn=fold_bn, force=force, names=names)
    weights, metadata = load_safetensors_with_metadata(out)
    size = sum(v.nbytes for v in weights.values())
    Console().print(f"wrote {out}: {len(weights)} tensors, {size / 2**20:.1f} MiB (model {metadata['model']})",
                    soft_wrap=True)
