"""`mlxnet convert`: a PyTorch checkpoint into mlxnet safetensors."""
from __future__ import annotations

from typing import Optional

import typer
from rich.console import Console


def convert(
    src: str = typer.Argument(..., help="PyTorch checkpoint (.pt/.pth/.ckpt, read without running pickled code), "
                              "safetensors file, or a model id to fetch from the Hub."),
    dst: str = typer.Argument(..., help="Output .safetensors file (mlxnet layout)."),
    model: str = typer.Option(..., "--model", help="Weight spec id: the key table and layouts to apply."),
    dtype: str = typer.Option("float32", "--dtype",
                              help="Dtype of the written floats: float32 (default, whatever the checkpoint "
                                   "stores), float16 or bfloat16. Every step runs in float32; the cast is last."),
    fold_bn: bool = typer.Option(False, "--fold-bn", help="Fold BatchNorms into the convs the spec pairs them with "
                                                         "(in float32)."),
    labels: Optional[str] = typer.Option(None, "--labels",
                                         help="Class names to store with the weights: a file with one per line, "
                                              "or a JSON list / {index: name} object (default: the checkpoint's own)."),
    force: bool = typer.Option(False, "--force", help="Overwrite DST if it exists."),
) -> None:
    """Convert a PyTorch checkpoint into mlxnet safetensors (SRC is never modified)."""
    from mlxnet.weights import convert_checkpoint, load_safetensors, read_labels

    names = read_labels(labels) if labels else None
    out = convert_checkpoint(src, dst, model, dtype=dtype, fold_bn=fold_bn, force=force, names=names)
    weights = load_safetensors(out)
    size = sum(v.nbytes for v in weights.values())
    Console().print(f"wrote {out}: {len(weights)} tensors, {size / 2**20:.1f} MiB (model {model})", soft_wrap=True)
