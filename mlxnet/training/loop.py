"""The fine-tuning loop of ``mlxnet train classify``, data-parallel under ``mlx.launch``.

One optimizer step takes a global batch of ``batch`` images in the epoch's order; rank r of N
reads its N-th of it, and the gradients (of the mean loss over each rank's share) are averaged
over the ranks (``mlx.nn.average_gradients``), so N ranks take the step one process would take
on the whole batch.

BatchNorm (``--batchnorm``): by default ("frozen") it keeps its pretrained statistics (the
layers run in inference mode while their scale and shift train), as is usual when fine-tuning
with small per-device batches; every rank then computes the function one process would, so N
ranks take exactly its step. "train" normalises with batch statistics, which a rank can only
take over its own share of the batch (what it would be on N machines; MLX has no synchronised
BatchNorm): the steps then differ slightly from one process's, and the running statistics each
rank gathers are averaged over the ranks after every epoch, so that all ranks, and the files,
hold one model. Use it to train from random weights, whose statistics mean nothing.

Only rank 0 writes checkpoints, the final model and the log.
"""
from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_map, tree_unflatten

from .. import distributed
from ..device import differentiating
from ..errors import MlxnetError
from ..image import check_output_path
from ..progress import progress_bar
from ..weights import save_converted
from . import data as D
from .state import check_same_run, load_state, save_state

PRECISIONS = {"float32": mx.float32, "bfloat16": mx.bfloat16}
BATCHNORM = ("frozen", "train")
OPTIMIZERS = ("sgd", "adamw")
SCHEDULES = ("cosine", "step", "constant")


@dataclass
class TrainConfig:
    data: str
    model: str = "resnet18"
    weights: str | None = None  # id or file; None: the model's hub weights; "none": random
    output: str = "runs/classify"
    epochs: int = 10
    batch: int = 32  # global: split over the ranks
    lr: float = 0.01
    optimizer: str = "sgd"
    momentum: float = 0.9
    weight_decay: float = 1e-4
    schedule: str = "cosine"
    warmup: float = 0.0  # epochs
    size: int = 224
    val_split: float = 0.1
    val_dir: str | None = None
    precision: str = "float32"
    batchnorm: str = "frozen"  # see the module docstring
    seed: int = 0
    resume: bool = False
    force: bool = False  # start over in a folder that holds a run
    max_steps: int | None = None
    log: Callable[[str], None] = field(default=print, repr=False)

    def run_settings(self, classes: tuple[str, ...]) -> dict:
        """What a resumed run must share with the one it continues."""
        keep = ("model", "epochs", "batch", "lr", "optimizer", "momentum", "weight_decay", "schedule",
                "warmup", "size", "val_split", "precision", "batchnorm", "seed")
        return {**{k: v for k, v in asdict(self).items() if k in keep}, "classes": list(classes)}


@dataclass
class EpochReport:
    epoch: int  # epochs completed
    step: int  # optimizer steps taken
    partial: bool  # stopped inside an epoch (--max-steps)
    loss: float
    val_accuracy: float | None
    images_per_s: float


def _datasets(cfg: TrainConfig) -> tuple[D.ImageFolder, D.ImageFolder | None]:
    data = D.scan(cfg.data)
    if cfg.val_dir is not None:
        val = D.scan(cfg.val_dir)
        D.same_classes(data, val, cfg.val_dir)
        return data, val
    if cfg.val_split == 0:
        return data, None
    return D.split(data, cfg.val_split, cfg.seed)


def _network(cfg: TrainConfig, classes: tuple[str, ...]) -> nn.Module:
    """The ResNet to fine-tune: pretrained (its head replaced unless it already has these
    classes) or random; every rank builds the same one (seeded)."""
    from ..models import resnet
    from ..weights.hub import UnknownSource

    mx.random.seed(cfg.seed)
    if cfg.weights is not None and cfg.weights.lower() == "none" or cfg.resume:
        return resnet.resnet(cfg.model, num_classes=len(classes))  # resume: the checkpoint fills it
    try:
        net, names = resnet.load(cfg.weights or cfg.model, model=cfg.model)
    except UnknownSource as e:  # training takes one source more than the other commands
        raise MlxnetError(f"{e}, or 'none' (an untrained network)") from None
    if names is None or tuple(names) != classes:
        net.fc = nn.Linear(net.fc.weight.shape[1], len(classes))
    return net


def _schedule(cfg: TrainConfig, steps_per_epoch: int) -> optim.schedulers.Callable | float:
    total = max(1, cfg.epochs * steps_per_epoch)
    warm = min(total - 1, round(cfg.warmup * steps_per_epoch))
    if cfg.schedule == "cosine":
        main = optim.cosine_decay(cfg.lr, total - warm)
    elif cfg.schedule == "step":  # ×0.1 at a third and two thirds of the run
        main = optim.step_decay(cfg.lr, 0.1, max(1, (total - warm) // 3))
    else:  # constant (_check knows the names)
        main = lambda step: mx.array(cfg.lr)  # noqa: E731
    if warm == 0:
        return main
    return optim.join_schedules([optim.linear_schedule(cfg.lr / 100, cfg.lr, warm), main], [warm])


def _optimizer(cfg: TrainConfig, steps_per_epoch: int) -> optim.Optimizer:
    lr = _schedule(cfg, steps_per_epoch)
    if cfg.optimizer == "sgd":
        return optim.SGD(learning_rate=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    return optim.AdamW(learning_rate=lr, weight_decay=cfg.weight_decay)  # _check knows the names


def _train_mode(net: nn.Module, batchnorm: str) -> None:
    net.train()
    if batchnorm == "frozen":
        for _, m in net.named_modules():
            if isinstance(m, nn.BatchNorm):
                m.eval()  # pretrained statistics (see the module docstring)


def running_statistics(net: nn.Module) -> dict[str, mx.array]:
    """The BatchNorm running statistics, by parameter path."""
    return {k: v for k, v in tree_flatten(net.parameters()) if k.endswith((".running_mean", ".running_var"))}


def _share_statistics(net: nn.Module) -> None:
    """Average the running statistics each rank gathered from its own share of the batches, so
    every rank holds the same model (``--batchnorm train``)."""
    if distributed.size() > 1:
        shared = distributed.average(running_statistics(net))
        mx.eval(shared)  # now, on every rank: a rank that never reads them would skip the all-reduce
        net.update(tree_unflatten(list(tree_flatten(shared))))


def _check(cfg: TrainConfig, n_train: int) -> None:
    if cfg.precision == "float16":
        raise MlxnetError("--dtype float16 is not offered: without loss scaling its small gradients flush to "
                          "zero; use bfloat16 (float32's range, float32 master weights)")
    if cfg.precision not in PRECISIONS:
        raise MlxnetError(f"unknown --dtype {cfg.precision!r}: expected {' or '.join(PRECISIONS)}")
    for option, value, known in (("--batchnorm", cfg.batchnorm, BATCHNORM), ("--optimizer", cfg.optimizer, OPTIMIZERS),
                                 ("--schedule", cfg.schedule, SCHEDULES)):
        if value not in known:
            raise MlxnetError(f"unknown {option} {value!r}: expected {', '.join(known[:-1])} or {known[-1]}")
    if cfg.batch % distributed.size():
        raise MlxnetError(f"--batch {cfg.batch} must be a multiple of the {distributed.size()} processes")
    if cfg.batch > n_train:
        raise MlxnetError(f"--batch {cfg.batch} is larger than the {n_train} training images")
    if cfg.epochs < 1:
        raise MlxnetError(f"--epochs must be at least 1, got {cfg.epochs}")


def _check_outputs(cfg: TrainConfig, out: Path) -> None:
    """Before any work: a run already in the folder is continued (--resume) or replaced
    (--force), never silently overwritten; both files can be written there, and neither is the
    file we start from."""
    start = [Path(cfg.weights)] if cfg.weights and Path(cfg.weights).is_file() else []
    for name in ("last.safetensors", "model.safetensors"):
        check_output_path(out / name, start, kind="file")
    held = [name for name in ("model.safetensors", "last.safetensors") if (out / name).exists()]
    if held and not (cfg.resume or cfg.force):
        state = "a finished run" if held[0] == "model.safetensors" else "an unfinished run"
        raise MlxnetError(f"{out} holds {state} ({held[0]}); pass --resume to continue it, --force to "
                          f"replace it, or another -o")


def train(cfg: TrainConfig) -> list[EpochReport]:
    """Fine-tune; write ``output/last.safetensors`` after every epoch and ``output/model.safetensors``
    (the classifier with its class names) at the end. Returns each epoch's report."""
    train_set, val_set = _datasets(cfg)
    _check(cfg, len(train_set))
    out = Path(cfg.output)
    if distributed.is_main():
        _check_outputs(cfg, out)
    settings = cfg.run_settings(train_set.classes)
    steps_per_epoch = len(train_set) // cfg.batch
    net = _network(cfg, train_set.classes)
    opt = _optimizer(cfg, steps_per_epoch)
    dtype = PRECISIONS[cfg.precision]
    state = load_state(out / "last.safetensors") if cfg.resume else None
    if state is not None:
        check_same_run(out / "last.safetensors", state.run, settings)
        net.update(state.model)
    master = tree_map(lambda p: p.astype(mx.float32), net.trainable_parameters())
    opt.init(master)
    if state is not None:
        opt.state = state.optimizer
    epoch, step = (state.epoch, state.step) if state is not None else (0, 0)
    mx.eval(net.parameters(), master, opt.state)
    _train_mode(net, cfg.batchnorm)

    def loss_fn(model: nn.Module, x: mx.array, y: mx.array) -> mx.array:
        return nn.losses.cross_entropy(model(x).astype(mx.float32), y, reduction="mean")

    grad_fn = nn.value_and_grad(net, loss_fn)
    local = cfg.batch // distributed.size()
    rank = distributed.rank()
    reports = []
    while epoch < cfg.epochs:
        order = D.epoch_order(len(train_set), cfg.seed, epoch)
        start, losses, seen = time.perf_counter(), [], 0
        first = step - epoch * steps_per_epoch  # > 0: resuming a run stopped inside this epoch
        # Rank 0's bar, erased at the epoch's end, where _log_epoch writes the epoch's line.
        with progress_bar(f"epoch {epoch + 1}/{cfg.epochs}", steps_per_epoch - first, quiet=not distributed.is_main(),
                          status=True, transient=True) as bar:
            for s in range(first, steps_per_epoch):
                if cfg.max_steps is not None and step >= cfg.max_steps:
                    break
                mine = order[s * cfg.batch + rank * local: s * cfg.batch + (rank + 1) * local]
                images, labels = D.batch_of(train_set, mine, cfg.size, epoch=epoch, seed=cfg.seed)
                # The compute copy of the weights (float32: the master weights themselves).
                net.update(master if dtype == mx.float32 else tree_map(lambda p: p.astype(dtype), master))
                with differentiating():  # ops pick their cheaper-backward forms
                    loss, grads = grad_fn(net, mx.array(images).astype(dtype), mx.array(labels))
                grads = distributed.average(tree_map(lambda g: g.astype(mx.float32), grads))
                master = opt.apply_gradients(grads, master)
                mx.eval(master, opt.state, loss, running_statistics(net))  # statistics: each step's, not a growing graph
                losses.append(float(loss))
                step, seen = step + 1, seen + cfg.batch
                bar.advance(f"loss {losses[-1]:.4f}  {seen / (time.perf_counter() - start):.1f} images/s")
        stopped = cfg.max_steps is not None and step >= cfg.max_steps and step < (epoch + 1) * steps_per_epoch
        net.update(master)
        if stopped and not losses:
            break
        if cfg.batchnorm == "train":
            _share_statistics(net)
        if not stopped:
            epoch += 1
        report = EpochReport(epoch, step, stopped, float(distributed.total(float(np.mean(losses)))) / distributed.size(),
                             _accuracy(net, val_set, cfg) if val_set is not None else None,
                             seen / (time.perf_counter() - start))
        reports.append(report)
        _log_epoch(cfg, report)
        if distributed.is_main():
            save_state(out / "last.safetensors", dict(tree_flatten(net.parameters())), opt.state, epoch, step, settings)
        _train_mode(net, cfg.batchnorm)
        if stopped:
            break
    net.update(master)
    net.eval()
    if distributed.is_main():
        save_converted(out / "model.safetensors", dict(tree_flatten(net.parameters())), cfg.model,
                       {"num_classes": len(train_set.classes)}, train_set.classes, source=f"mlxnet train {cfg.data}")
        cfg.log(f"wrote {out / 'model.safetensors'} (mlxnet classify --weights {out / 'model.safetensors'})")
    return reports


def _accuracy(net: nn.Module, val_set: D.ImageFolder, cfg: TrainConfig) -> float:
    """Top-1 accuracy on the validation set, each rank scoring its share."""
    net.eval()
    mine = distributed.shard(range(len(val_set)))
    correct = 0
    for i in range(0, len(mine), 64):
        images, labels = D.batch_of(val_set, mine[i:i + 64], cfg.size, epoch=None, seed=cfg.seed)
        logits = net(mx.array(images).astype(PRECISIONS[cfg.precision]))
        correct += int((np.array(mx.argmax(logits, axis=-1)) == labels).sum())
    return distributed.total(correct) / len(val_set)


def _log_epoch(cfg: TrainConfig, r: EpochReport) -> None:
    if not distributed.is_main():
        return
    val = f"  val accuracy {r.val_accuracy:.1%}" if r.val_accuracy is not None else ""
    where = (f"step {r.step} (stopped in epoch {r.epoch + 1}/{cfg.epochs})" if r.partial
             else f"epoch {r.epoch}/{cfg.epochs}")
    cfg.log(f"{where}  loss {r.loss:.4f}{val}  {r.images_per_s:.1f} images/s"
            + (f"  ({distributed.size()} processes)" if distributed.size() > 1 else ""))
    sys.stdout.flush()
