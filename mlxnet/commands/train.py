"""`mlxnet train classify DATA_DIR`: fine-tune a ResNet on an ImageFolder tree; data-parallel
unchanged under `mlx.launch -n N mlxnet train classify ...`."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from mlxnet.commands import grammar

train = typer.Typer(name="train", no_args_is_help=True, help="Fine-tune a model on your own images.")


@train.command("classify")
def classify(
    data: Path = typer.Argument(..., metavar="DATA_DIR",
                                help="ImageFolder tree: DATA_DIR/<class>/<images> (sub-folders allowed)."),
    model: str = typer.Option("resnet18", "--model", "-m", metavar="ID", help="resnet18|34|50|101|152."),
    weights: Optional[str] = grammar.weights("the model's ImageNet weights from the hub; 'none': untrained"),
    output: Path = grammar.output("Folder for last.safetensors (resumable state) and model.safetensors.",
                                  Path("runs/classify")),
    epochs: int = typer.Option(10, "--epochs", min=1),
    batch: int = grammar.batch(32, "Global batch: split over the processes."),
    lr: float = typer.Option(0.01, "--lr", help="Peak learning rate."),
    optimizer: str = typer.Option("sgd", "--optimizer", help="sgd (momentum) or adamw."),
    momentum: float = typer.Option(0.9, "--momentum"),
    weight_decay: float = typer.Option(1e-4, "--weight-decay"),
    schedule: str = typer.Option("cosine", "--schedule", help="cosine, step (x0.1 at 1/3 and 2/3) or constant."),
    warmup: float = typer.Option(0.0, "--warmup", min=0, help="Linear warm-up, in epochs."),
    size: int = typer.Option(224, "--size", min=16, help="Training crop side in pixels."),
    val_split: float = typer.Option(0.1, "--val-split", min=0, max=0.99,
                                    help="Fraction of each class held out for validation (0: none)."),
    val: Optional[Path] = typer.Option(None, "--val", help="A validation ImageFolder instead of --val-split."),
    dtype: str = typer.Option("float32", "--dtype", "--precision", metavar="DTYPE",
                              help="float32, or bfloat16 compute with float32 master weights."),
    batchnorm: str = typer.Option("frozen", "--batchnorm",
                                  help="frozen: keep the statistics (fine-tuning; N processes take one "
                                       "process's steps); train: batch statistics per process, averaged "
                                       "after each epoch (training from random weights)."),
    seed: int = typer.Option(0, "--seed"),
    resume: bool = typer.Option(False, "--resume", help="Continue from OUTPUT/last.safetensors."),
    force: bool = grammar.force("Replace a run already in OUTPUT (without it, an existing run is refused)."),
    device: Optional[str] = grammar.device(),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", min=1,
                                            help="Stop after this many optimizer steps in all (a smoke run)."),
) -> None:
    """Fine-tune a ResNet classifier; `mlxnet classify --weights OUTPUT/model.safetensors` then
    labels images with your class names. Runs data-parallel under `mlx.launch -n N mlxnet train
    classify ...` (the same options; --batch stays the global batch)."""
    from mlxnet.training.loop import TrainConfig, train as run

    grammar.apply_device(device)
    run(TrainConfig(data=str(data), model=model, weights=weights, output=str(output), epochs=epochs, batch=batch,
                    lr=lr, optimizer=optimizer, momentum=momentum, weight_decay=weight_decay, schedule=schedule,
                    warmup=warmup, size=size, val_split=val_split, val_dir=str(val) if val else None,
                    precision=dtype, batchnorm=batchnorm, seed=seed, resume=resume, force=force,
                    max_steps=max_steps))
