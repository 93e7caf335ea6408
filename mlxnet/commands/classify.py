"""`mlxnet classify`: ImageNet labels for images with a ResNet."""
from __future__ import annotations

import json
from typing import List, Optional

import typer

from mlxnet.errors import MlxnetError


def classify(
    images: List[str] = typer.Argument(..., help="Image files (any format Pillow reads)."),
    model: Optional[str] = typer.Option(None, "--model", "-m",
                                        help="resnet18|34|50|101|152 (default: what --weights holds, else resnet50)."),
    weights: Optional[str] = typer.Option(None, "--weights", "-w",
                                          help="Weights id or file (default: the model's hub weights)."),
    top: int = typer.Option(5, "--top", "-k", min=1, help="How many labels per image."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Print the top ImageNet labels and probabilities for each image."""
    from mlxnet import families

    classifier = families.for_task(model or "resnet50", "classify").predictor(weights, model)
    results = [classifier.predict(path, top) for path in images]
    if as_json:
        print(json.dumps([{"image": p, **r.to_dict()} for p, r in zip(images, results)], indent=1))
        return
    for path, result in zip(images, results):
        print(f"{path}\n{result.summary()}")
