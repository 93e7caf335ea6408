"""`mlxnet classify`: the most probable labels of images with a ResNet."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from mlxnet.commands import grammar
from mlxnet.commands.images import Job, expand_inputs, load_model
from mlxnet.commands.pipeline import run_jobs


def classify(
    images: List[str] = grammar.sources(),
    model: Optional[str] = grammar.model("resnet18|34|50|101|152", "resnet50"),
    weights: Optional[str] = grammar.weights(),
    labels: Optional[Path] = typer.Option(None, "--labels",
                                          help="Class names: one per line, or a JSON list or {index: name} "
                                               "(default: the checkpoint's, else ImageNet's)."),
    top: int = typer.Option(5, "--top", "-k", min=1, help="How many labels per image."),
    batch: int = grammar.batch(8),
    dtype: str = grammar.dtype(),
    device: Optional[str] = grammar.device(),
    as_json: bool = grammar.json_lines(),
) -> None:
    """Print the top labels and probabilities for each image."""
    grammar.apply_device(device)
    grammar.check_dtype(dtype)
    from mlxnet import families
    from mlxnet.image import load_image
    from mlxnet.weights import read_labels

    family = families.for_task(model or "resnet50", "classify")
    names = read_labels(labels) if labels is not None else None
    jobs = [Job(source) for source in expand_inputs(images)]
    run_jobs(
        jobs, batch, what="classify", as_json=as_json,
        load=lambda: load_model(lambda: family.predictor(weights, model, dtype, names=names)),
        prepare=lambda job: family.prepare(load_image(job.source.path)),  # resized and cropped on a reader thread
        predict=lambda classifier, items: classifier.predict_prepared(items, top),
        finish=lambda job, _pixels, result: (result.to_dict(), f"{job.name}\n{result.summary()}"))
