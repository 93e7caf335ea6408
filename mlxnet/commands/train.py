"""`mlxnet train classify DATA_DIR`: fine-tune a ResNet on an ImageFolder tree; data-parallel
unchanged under `mlx.launch -n N mlxnet train classify ...`. `mlxnet train detect DATA`: fine-tune
a YOLOv8 on a YOLO-format data set at ultralytics' defaults."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from mlxnet.commands import grammar
from mlxnet.commands.guides import epilog

train = typer.Typer(name="train", no_args_is_help=True, rich_markup_mode=None, help="Fine-tune a model on your own images.",
                    epilog=epilog("train"))


@train.command("classify", epilog=epilog("train classify"))
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


@train.command("detect", epilog=epilog("train detect"))
def detect(
    data: Path = typer.Argument(..., metavar="DATA",
                                help="A YOLO-format data set: its data.yaml (path, train, val, names) or a folder "
                                     "holding one, as `val detect` reads it; or a COCO instances file (the val split: "
                                     "the file of the same name with 'val' for its last 'train')."),
    model: Optional[str] = typer.Option(None, "--model", "-m", metavar="ID",
                                        help="yolov8n|s|m|l|x, yolo11n-x; default: the checkpoint's, else yolov8n."),
    weights: Optional[str] = grammar.weights("the model's official weights; 'none': train from scratch"),
    output: Path = grammar.output("Run folder: the best and last weights (in weights/), results.csv and .png, "
                                  "and the state --resume reads.", Path("runs/detect")),
    epochs: int = typer.Option(100, "--epochs", min=1, metavar="N"),
    batch: int = grammar.batch(16, "Images per batch; gradients add up to the nominal batch 64."),
    imgsz: int = typer.Option(640, "--imgsz", min=64, metavar="N", help="Training image side (a multiple of 32)."),
    lr: float = typer.Option(0.01, "--lr", metavar="X", help="Initial learning rate (ultralytics' lr0; optimizer auto picks "
                                                "its own)."),
    lrf: float = typer.Option(0.01, "--lrf", metavar="X", help="Final learning rate, as a fraction of --lr."),
    optimizer: str = typer.Option("auto", "--optimizer", metavar="auto|sgd|adamw",
                                  help="auto: AdamW at a learning rate fitted to the class count for runs up to "
                                       "10,000 iterations, else SGD (ultralytics' rule)."),
    momentum: float = typer.Option(0.937, "--momentum", metavar="X", help="SGD momentum / AdamW beta1."),
    weight_decay: float = typer.Option(5e-4, "--weight-decay", metavar="X"),
    warmup_epochs: float = typer.Option(3.0, "--warmup-epochs", min=0, metavar="X"),
    close_mosaic: int = typer.Option(10, "--close-mosaic", min=0, metavar="N", help="Train the last N epochs without mosaic."),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, metavar="N", help="Data workers (decoding, augmentation): threads on the CPU, processes with a GPU step."),
    val: bool = typer.Option(True, "--val/--no-val", help="Measure mAP on the val split after every epoch."),
    dtype: str = typer.Option("auto", "--dtype", metavar="DTYPE",
                              help="auto (bfloat16 on a GPU, as ultralytics' AMP; float32 on the CPU), float32, "
                                   "or bfloat16 compute with float32 master weights."),
    seed: int = typer.Option(0, "--seed", metavar="N"),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in OUTPUT from its last finished epoch."),
    force: bool = grammar.force("Replace a run already in OUTPUT (without it, an existing run is refused)."),
    device: Optional[str] = grammar.device(),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", min=1, metavar="N",
                                            help="Stop after this many batches in all (a smoke run)."),
) -> None:
    """Fine-tune a YOLOv8 detector on your own labelled images at ultralytics' defaults (loss,
    augmentation, optimizer, warm-up, EMA); `mlxnet detect --weights OUTPUT/weights/best.safetensors`
    then finds your classes."""
    from mlxnet.training.detect_loop import OPS_PER_BUFFER, DetectTrainConfig, train_detector

    grammar.apply_device(device, ops_per_buffer=OPS_PER_BUFFER)
    train_detector(DetectTrainConfig(data=str(data), model=model, weights=weights, output=str(output), epochs=epochs,
                                     batch=batch, imgsz=imgsz, lr=lr, lrf=lrf, optimizer=optimizer, momentum=momentum,
                                     weight_decay=weight_decay, warmup_epochs=warmup_epochs, close_mosaic=close_mosaic,
                                     workers=workers, val=val, precision=dtype, seed=seed, resume=resume, force=force,
                                     max_steps=max_steps))
