"""`mlxnet val classify DIR`: a classifier's top-1 and top-5 accuracy on an ImageFolder tree
(one sub-folder per class, as `mlxnet train classify` reads it), as timm's validate script
measures it, through the image pipeline and the family's own preprocessing.

The folders are the checkpoint's classes by name: every folder must be one of its class names
(the checkpoint's own, else ImageNet's for a 1000-class model). A checkpoint that carries no
names, with as many classes as there are folders, takes them in sorted order instead (what
torchvision's ImageFolder and timm do: ImageNet's val tree has synset ids for folders)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import typer

from mlxnet.commands import grammar
from mlxnet.errors import MlxnetError


def class_indices(folder: Path, folders: Sequence[str], model_names: Sequence[str] | None, classes: int,
                  own_names: bool) -> list[int]:
    """The model's class index of each class folder (see the module's doc)."""
    if model_names is not None:
        index: dict[str, int] = {}
        for i, name in enumerate(model_names):
            index.setdefault(name, i)  # ImageNet names a few classes twice ("crane"): the first
        missing = [f for f in folders if f not in index]
        if not missing:
            return [index[f] for f in folders]
    else:
        missing = list(folders)
    if not own_names and len(folders) == classes:
        print(f"note: {folder}: the folders are not the model's class names; taking them in sorted order as "
              f"classes 0..{classes - 1}", file=sys.stderr, flush=True)
        return list(range(classes))
    shown = ", ".join(repr(m) for m in missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    known = "" if model_names is None else " (" + ", ".join(model_names[:5]) + (", ..." if classes > 5 else "") + ")"
    raise MlxnetError(f"{folder}: class folder{'s' if len(missing) > 1 else ''} {shown} not among the model's "
                      f"{classes} class names{known}")


def table(rows: list[dict], overall: dict, k: int) -> str:
    head = f"{'Class':>22}{'Images':>11}{'top-1':>11}{f'top-{k}':>11}"
    lines = [head, f"{'all':>22}{overall['images']:>11}{overall['top1']:>11.4g}{overall['top5']:>11.4g}"]
    lines += [f"{r['name']:>22}{r['images']:>11}{r['top1']:>11.4g}{r['top5']:>11.4g}" for r in rows]
    return "\n".join(lines)


def classify(
    data: Path = typer.Argument(..., metavar="DIR",
                                help="An ImageFolder tree: DIR/<class>/**/<image>, the folder names the "
                                     "checkpoint's class names."),
    model: Optional[str] = grammar.model("resnet18|34|50|101|152", "resnet50"),
    weights: Optional[str] = grammar.weights(),
    batch: int = grammar.batch(32),
    dtype: str = grammar.dtype(),
    device: Optional[str] = grammar.device(),
    as_json: bool = grammar.json_lines("Print JSON Lines: one object per image, then the metrics and speed."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Text output: also a line per image."),
) -> None:
    """Top-1 and top-5 accuracy, overall and per class, of a classifier on an ImageFolder tree,
    and the speed: images/s, decode / forward / top-k per image."""

    from mlxnet import distributed, families
    from mlxnet.commands.images import Job, Source, load_model
    from mlxnet.commands.pipeline import run_jobs
    from mlxnet.evaluation.speed import Speed
    from mlxnet.image import load_image
    from mlxnet.training.data import scan

    grammar.apply_device(device)
    grammar.check_dtype(dtype)
    if distributed.size() > 1:
        raise MlxnetError("val runs in one process: its metrics are over every image (not under mlx.launch)")
    family = families.for_task(model or "resnet50", "classify")
    tree = scan(data)
    classifier = load_model(lambda: family.predictor(weights, model, dtype))
    classes = classifier.classes
    names = classifier.label_names
    wanted = class_indices(data, tree.classes, names, classes, classifier.names is not None)
    label_of = {str(s.path): wanted[s.label] for s in tree.samples}
    shown = names or tuple(str(i) for i in range(classes))
    k = min(5, classes)
    speed = Speed(("decode", "forward", "topk"))
    hits = {c: [0, 0, 0] for c in sorted(set(wanted))}  # class -> images, top-1 right, top-k right

    def prepare(job: Job) -> Any:
        with speed.timed("decode"):
            return family.prepare(load_image(job.source.path))

    def predict(_classifier: Any, items: list) -> list:
        with speed.timed("forward"):
            scores = classifier.logits(items)
        with speed.timed("topk"):
            # Stable: of equal logits the lower class index ranks first.
            return list(np.argsort(-scores, axis=1, kind="stable")[:, :k])

    def finish(job: Job, _item: Any, top: np.ndarray) -> tuple[dict, str | None]:
        label = label_of[job.source.name]
        one, some = bool(top[0] == label), bool(label in top)
        counts = hits[label]
        counts[0], counts[1], counts[2] = counts[0] + 1, counts[1] + one, counts[2] + some
        record = {"label": shown[label], "top": [shown[i] for i in top.tolist()], "top1": one, "top5": some}
        line = f"{job.name}: {shown[label]} -> {shown[int(top[0])]}{'' if one else ' (wrong)'}"
        return record, line if verbose else None

    jobs = [Job(Source(str(s.path), s.path.relative_to(data))) for s in tree.samples]
    failed: typer.Exit | None = None
    try:
        run_jobs(jobs, batch, what="val", as_json=as_json, load=lambda: classifier, prepare=prepare,
                 predict=predict, finish=finish)
    except typer.Exit as e:
        if not e.exit_code or not any(c[0] for c in hits.values()):
            raise
        failed = e  # reported per image; the accuracy of the others still prints
    speed.stop()
    rows = [{"class": c, "name": shown[c], "images": n, "top1": one / n, "top5": some / n}
            for c, (n, one, some) in hits.items() if n]
    measured = sum(n for n, _, _ in hits.values())
    overall = {"images": measured, "top1": sum(c[1] for c in hits.values()) / max(measured, 1),
               "top5": sum(c[2] for c in hits.values()) / max(measured, 1), "k": k}
    if as_json:
        print(json.dumps({"metrics": {**overall, "classes": rows}, "speed": speed.summary(measured)}), flush=True)
    else:
        print(table(rows, overall, k), flush=True)
        print(speed.line(measured), flush=True)
    if failed is not None:
        raise failed
