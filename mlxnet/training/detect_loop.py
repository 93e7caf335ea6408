"""``mlxnet train detect``: fine-tune a YOLOv8 on a YOLO-format data set (or a COCO instances
file), as ultralytics trains; data-parallel under ``mlx.launch`` (each process a share of every
batch, BatchNorm synchronised, gradients summed: one process's steps).

One epoch: the training images in a seeded order, in batches of ``batch`` (the last one shorter,
as ultralytics' loader), each augmented on worker threads (:mod:`.detect_data`: mosaic, affine,
HSV, flip; mosaic closed for the last ``close_mosaic`` epochs); per batch a forward in training
mode (BatchNorm on batch statistics), ultralytics' v8 loss (:mod:`.detection_loss`) and its
gradient, added up until ``accumulate`` batches (the nominal batch 64) make one optimizer step
(:mod:`.detect_optim`: groups, warm-up, schedule, clipping, EMA). After each epoch the EMA
weights are measured on the val split as ``mlxnet val detect`` measures them, a row goes to
``results.csv`` (and ``results.png``), the EMA weights to ``weights/last.safetensors`` (and
``weights/best.safetensors`` when the fitness, 0.1·mAP50 + 0.9·mAP50-95, is the best yet), and
everything a resumed run needs to ``state.safetensors``.

A loss that is not finite stops the run at once with the step and the batch's files, before
anything of that epoch is written; every file is written atomically, so a run killed at any
moment, or a full disk, leaves the previous epoch's files whole, and ``--resume`` continues
from the last completed epoch with the same data order and augmentation draws.
"""
from __future__ import annotations

import csv
import io
import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from .. import distributed
from ..device import backend, compile_enabled, current_device, differentiating
from ..errors import MlxnetError
from ..image import atomic_write_bytes, check_output_path
from ..progress import progress_bar
from ..weights import save_converted
from ..weights.safetensors_io import host_copies, load_safetensors_with_metadata, save_safetensors
from . import detect_data as D
from . import detect_optim as O
from .data import epoch_order
from .loop import running_statistics
from .detection_loss import LossSettings, Targets, detection_loss
from .writer import BackgroundWriter

PRECISIONS = {"float32": mx.float32, "bfloat16": mx.bfloat16}
AUTO_PRECISION = "auto"
# `mlxnet train detect`'s kernels per MLX command buffer on CUDA (mlxnet.tune_gpu): MLX's 100
# keeps every buffer a hundred kernels read alive until they all ran. With the compiled step, one
# kernel per buffer measured the same epoch time as 10, at a peak below ultralytics' where 10 came
# within 1% of it (docs/train-detect.md, "Kernels per command buffer").
OPS_PER_BUFFER = 1


def resolve_precision(name: str) -> str:
    """``auto`` as ultralytics' ``amp=True``: half-precision compute (bfloat16, which needs no
    loss scaling) on float32 master weights where the step runs on a GPU, float32 on the CPU
    (whose bfloat16 arithmetic is emulated); any other name as it is."""
    if name != AUTO_PRECISION:
        return name
    return "bfloat16" if current_device() == "gpu" else "float32"


OPTIMIZERS = ("auto", "sgd", "adamw")
STATE_FORMAT = "mlxnet-train-detect"
LOSS_NAMES = ("box_loss", "cls_loss", "dfl_loss")


@dataclass
class DetectTrainConfig:
    """The run's settings; every default is ultralytics' (its name in the comment where it differs)."""

    data: str
    model: str | None = None  # yolov8n..x, yolo11n..x; default: the checkpoint's, else yolov8n
    weights: str | None = None  # hub id or file; None: the model's official weights; "none": from scratch
    output: str = "runs/detect"
    epochs: int = 100
    batch: int = 16
    imgsz: int = 640
    lr: float = 0.01  # lr0
    lrf: float = 0.01
    optimizer: str = "auto"
    momentum: float = 0.937
    weight_decay: float = 5e-4
    warmup_epochs: float = 3.0
    warmup_momentum: float = 0.8
    warmup_bias_lr: float = 0.1
    nbs: int = 64
    loss: LossSettings = field(default_factory=LossSettings)  # box, cls, dfl gains; the assigner's settings
    close_mosaic: int = 10
    precision: str = AUTO_PRECISION  # or float32, bfloat16 (resolve_precision)
    seed: int = 0
    resume: bool = False
    force: bool = False
    max_steps: int | None = None  # stop after this many batches in all (a smoke run)
    workers: int | None = None
    val: bool = True
    log: Callable[[str], None] = field(default=print, repr=False)

    def run_settings(self, names: tuple[str, ...]) -> dict:
        """What a resumed run must share with the one it continues."""
        skip = {"data", "weights", "output", "epochs", "resume", "force", "max_steps", "workers", "val", "log"}
        return {**{k: v for k, v in asdict(self).items() if k not in skip}, "names": list(names)}


@dataclass
class EpochRow:
    epoch: int
    elapsed: float  # seconds since the run began (validation included), ultralytics' `time`
    seconds: float  # this epoch's training time
    losses: tuple[float, float, float]
    precision: float
    recall: float
    map50: float
    map50_95: float
    lr: tuple[float, float, float]
    images_per_s: float
    data_wait: float  # share of the epoch's training time spent waiting for batches

    def csv_row(self) -> dict[str, float]:
        return {"epoch": self.epoch, "time": round(self.elapsed, 3),
                **{f"train/{n}": round(v, 5) for n, v in zip(LOSS_NAMES, self.losses)},
                "metrics/precision(B)": round(self.precision, 5), "metrics/recall(B)": round(self.recall, 5),
                "metrics/mAP50(B)": round(self.map50, 5), "metrics/mAP50-95(B)": round(self.map50_95, 5),
                **{f"lr/pg{i}": v for i, v in enumerate(self.lr)}}


def fitness(row: EpochRow) -> float:
    """ultralytics' detection fitness: 0.1·mAP50 + 0.9·mAP50-95."""
    return 0.1 * row.map50 + 0.9 * row.map50_95


# --- the network ---------------------------------------------------------------------------------

# The families whose loss is ultralytics' v8DetectionLoss (DFL over 16 bins): YOLO26's end-to-end
# loss (one-to-one head, no DFL) is another.
TRAINABLE_FAMILIES = ("yolov8", "yolo11")


def _fresh_class_head(new: nn.Module) -> None:
    """ultralytics' Detect.bias_init for the class convs of ``new`` (box biases 1, class biases
    log(5 / nc / (640 / stride)²)); their weights keep PyTorch's default uniform initialisation."""
    from ..models.yolo import STRIDES

    for level, s in enumerate(STRIDES):
        conv = new.head.cv3[level][2]
        fan_in = conv.weight.shape[1] * conv.weight.shape[2] * conv.weight.shape[3]
        bound = 1 / math.sqrt(fan_in)
        conv.weight = mx.random.uniform(-bound, bound, conv.weight.shape)
        conv.bias = mx.full(conv.bias.shape, math.log(5 / new.nc / (640 / s) ** 2))


def _trainable(variant: str | None, source: str) -> None:
    from ..models.yolo import MODELS

    trainable = [m for m in MODELS if m.startswith(TRAINABLE_FAMILIES) and "-" not in m]
    if variant is not None and variant in MODELS and variant not in trainable:
        why = ("segment and pose losses are not in mlxnet yet" if "-" in variant else
               "YOLO26's end-to-end loss is not in mlxnet yet")
        raise MlxnetError(f"{source}: a {variant}; train detect trains {', '.join(trainable)} ({why}; "
                          "detect, track and val load it)")


def build_network(cfg: DetectTrainConfig, names: tuple[str, ...],
                  log: Callable[[str], None] | None = None) -> tuple[nn.Module, str]:
    """The YOLOv8 / YOLO11 to train, for ``names``: the checkpoint's weights (its class convs
    replaced when its classes are not the data set's, a class of the same name keeping its row),
    or a fresh network. Returns it and its variant."""
    from ..models.yolo import YOLO, build_variant

    mx.random.seed(cfg.seed)
    nc = len(names)
    _trainable(cfg.model, cfg.model or "")
    if cfg.weights is not None and cfg.weights.lower() == "none":
        variant = cfg.model or "yolov8n"
        net = build_variant(variant, nc)
        _fresh_class_head(net)
        for level in range(3):  # ultralytics' box-branch bias: 1
            box = net.head.cv2[level][2]
            box.bias = mx.ones(box.bias.shape)
        return _for_training(net), variant
    source = cfg.weights or cfg.model or "yolov8n"
    yolo = YOLO.from_pretrained(source, model=cfg.model, dtype="float32", fuse=False)
    net = yolo.net
    variant = f"{net.family}{net.scale}"
    _trainable(variant, source)
    if tuple(yolo.names) == names:
        return _for_training(net), variant
    new = build_variant(variant, nc)
    weights = dict(tree_flatten(net.parameters()))
    row = len(net.model) - 1
    head = {f"model.{row}.cv3.{i}.2.{p}" for i in range(3) for p in ("weight", "bias")}
    new.update(tree_unflatten([(k, v) for k, v in weights.items() if k not in head]))
    _fresh_class_head(new)
    kept = [(j, list(yolo.names).index(n)) for j, n in enumerate(names) if n in yolo.names]
    for level in range(3):
        old, conv = net.head.cv3[level][2], new.head.cv3[level][2]
        if kept:
            rows, src = mx.array([j for j, _ in kept]), mx.array([i for _, i in kept])
            conv.weight[rows] = old.weight[src]
            conv.bias[rows] = old.bias[src]
    (log or cfg.log)(f"note: {source} has {len(yolo.names)} classes; training for the data set's {nc} "
            f"({len(kept)} kept by name, the others start fresh)")
    return _for_training(new), variant


def _for_training(net: nn.Module) -> nn.Module:
    """BatchNorm at ultralytics' momentum 0.03; the DFL bins fixed."""
    for _, m in net.named_modules():
        if isinstance(m, nn.BatchNorm):
            m.momentum = 0.03
    net.head.dfl.freeze()
    net.train()
    return net


class Validator:
    """One fused inference network for the whole run, its weights replaced by each epoch's EMA
    weights: a compiled forward (GPUs) is traced once per input shape for the run, not again
    every epoch."""

    def __init__(self, variant: str, nc: int, names: tuple[str, ...], dtype: mx.Dtype = mx.float32) -> None:
        from ..evaluation.detect import PreparedImages
        from ..models.yolo import YOLO, build_variant

        self.dtype = dtype
        self.unfused = build_variant(variant, nc)  # the trained network's structure: which BatchNorms fold where
        self.yolo = YOLO(build_variant(variant, nc).fuse(), names)
        self.prepared = PreparedImages()  # the validation images, decoded and letterboxed once for the run

    def load(self, arrays: dict[str, mx.array]) -> Any:
        """The :class:`mlxnet.models.yolo.YOLO` holding ``arrays``, BatchNorms folded."""
        fused = self.unfused.fused_parameters(arrays)
        # In the training's compute precision, as ultralytics validates in half under AMP.
        self.yolo.net.update(tree_unflatten([(k, v.astype(self.dtype)) for k, v in fused.items()]))
        self.yolo.net.eval()
        return self.yolo


# --- files ---------------------------------------------------------------------------------------

def _check_outputs(cfg: DetectTrainConfig, out: Path) -> None:
    start = [Path(cfg.weights)] if cfg.weights and Path(cfg.weights).is_file() else []
    for name in ("weights/last.safetensors", "weights/best.safetensors", "state.safetensors", "results.csv"):
        check_output_path(out / name, start, kind="file")
    held = [n for n in ("state.safetensors", "results.csv", "weights/last.safetensors") if (out / n).exists()]
    if held and not (cfg.resume or cfg.force):
        raise MlxnetError(f"{out} holds a run ({held[0]}); pass --resume to continue it, --force to replace it, "
                          f"or another -o")
    if cfg.force and not cfg.resume:
        for n in ("state.safetensors", "results.csv", "results.png", "weights/last.safetensors",
                  "weights/best.safetensors"):
            (out / n).unlink(missing_ok=True)


def _save_weights(path: Path, arrays: dict[str, mx.array], variant: str, names: tuple[str, ...], data: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_converted(path, arrays, variant, {"nc": len(names)}, names, source=f"mlxnet train detect {data}")


def _write_results(out: Path, rows: list[EpochRow]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0].csv_row()))
    writer.writeheader()
    for r in rows:
        writer.writerow(r.csv_row())
    atomic_write_bytes(out / "results.csv", buffer.getvalue().encode())
    from .plots import plot_results

    atomic_write_bytes(out / "results.png", plot_results([r.csv_row() for r in rows]))


def _read_results(out: Path) -> list[EpochRow]:
    path = out / "results.csv"
    if not path.is_file():
        return []
    rows = []
    for r in csv.DictReader(path.read_text().splitlines()):
        rows.append(EpochRow(int(r["epoch"]), float(r["time"]), 0.0, tuple(float(r[f"train/{n}"]) for n in LOSS_NAMES),
                             float(r["metrics/precision(B)"]), float(r["metrics/recall(B)"]),
                             float(r["metrics/mAP50(B)"]), float(r["metrics/mAP50-95(B)"]),
                             tuple(float(r[f"lr/pg{i}"]) for i in range(3)), 0.0, 0.0))
    return rows


# --- the run -------------------------------------------------------------------------------------

@dataclass
class _Progress:
    """Where the run stands, saved after every epoch."""

    epoch: int = 0  # epochs completed
    last_opt_step: int = -1
    best_fitness: float = -1.0


def _save_state(path: Path, model: dict, ema: dict, ema_updates: int, optimizer: dict, pending: dict | None,
                progress: _Progress, run: dict) -> None:
    arrays = {f"model.{k}": v for k, v in model.items()}
    arrays.update({f"ema.{k}": v for k, v in ema.items()})
    arrays.update({f"optimizer.{k}": v for k, v in optimizer.items()})
    if pending is not None:
        arrays.update({f"pending.{k}": v for k, v in pending.items()})
    meta = {"format": STATE_FORMAT, "run": json.dumps(run), "ema_updates": str(ema_updates),
            "progress": json.dumps(asdict(progress))}
    save_safetensors(path, arrays, metadata=meta)


def _load_state(path: Path) -> tuple[dict, dict, dict, dict | None, int, _Progress, dict]:
    if not path.is_file():
        raise MlxnetError(f"{path}: no training state to resume from")
    arrays, meta = load_safetensors_with_metadata(path)
    if meta.get("format") != STATE_FORMAT:
        raise MlxnetError(f"{path}: not an mlxnet detection training state (format {meta.get('format')!r})")
    try:
        run, updates, progress = json.loads(meta["run"]), int(meta["ema_updates"]), _Progress(**json.loads(meta["progress"]))
    except (KeyError, ValueError, TypeError) as e:
        raise MlxnetError(f"{path}: damaged training metadata ({e})") from None

    def part(prefix: str) -> dict:
        return {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
    pending = part("pending.") or None
    return part("model."), part("ema."), part("optimizer."), pending, updates, progress, run


def _check(cfg: DetectTrainConfig, n_train: int) -> None:
    if cfg.precision != AUTO_PRECISION and cfg.precision not in PRECISIONS:
        raise MlxnetError(f"unknown --dtype {cfg.precision!r}: expected auto, {' or '.join(PRECISIONS)} (float16 needs "
                          "loss scaling, which training does not do)")
    if cfg.optimizer not in OPTIMIZERS:
        raise MlxnetError(f"unknown --optimizer {cfg.optimizer!r}: expected {', '.join(OPTIMIZERS)}")
    if cfg.imgsz < 64 or cfg.imgsz % 32:
        raise MlxnetError(f"--imgsz must be a multiple of 32 of at least 64, got {cfg.imgsz}")
    if cfg.epochs < 1:
        raise MlxnetError(f"--epochs must be at least 1, got {cfg.epochs}")
    if cfg.batch < 2:
        raise MlxnetError(f"--batch must be at least 2 (BatchNorm trains on batch statistics), got {cfg.batch}")
    if n_train < 2:
        raise MlxnetError(f"{cfg.data}: {n_train} training image(s); training needs at least 2")


def _check_shares(batch: int, n: int, world: int) -> None:
    """Data-parallel, every batch splits into equal shares, one per process."""
    if world > 1 and (batch % world or (n % batch) % world):
        raise MlxnetError(f"--batch {batch} over {world} processes: every batch (the last one has {n % batch or batch} of "
                          f"the {n} images) must split into {world} equal shares; pick a --batch that divides both")


def train_detector(cfg: DetectTrainConfig) -> list[EpochRow]:
    """Run (or resume) the training; returns every epoch's row (the earlier ones' of a resumed run too)."""
    train_set = D.load_split(cfg.data, "train")
    val_set = D.load_split(cfg.data, "val") if cfg.val else None
    train_labels = D.read_all_labels(train_set)  # a bad label fails here, before any step
    if val_set is not None:
        D.read_all_labels(val_set)
        if val_set.names != train_set.names:
            raise MlxnetError(f"{val_set.source}: classes {list(val_set.names)} differ from the training split's "
                              f"{list(train_set.names)} ({train_set.source})")
    _check(cfg, len(train_set.images))
    world, main = distributed.size(), distributed.is_main()
    log = cfg.log if main else (lambda line: None)
    out = Path(cfg.output)
    if main:
        _check_outputs(cfg, out)
    names = train_set.names
    nc = len(names)
    n = len(train_set.images)
    batch = min(cfg.batch, n)
    _check_shares(batch, n, world)
    nb = math.ceil(n / batch)
    nominal = max(round(cfg.nbs / batch), 1)
    weight_decay = cfg.weight_decay * batch * nominal / cfg.nbs
    nominal = min(nominal, nb * cfg.epochs)
    iterations = math.ceil(n / max(batch, cfg.nbs)) * cfg.epochs
    choice = O.choose(cfg.optimizer, lr=cfg.lr, momentum=cfg.momentum, warmup_bias_lr=cfg.warmup_bias_lr,
                      nc=nc, iterations=iterations)
    if choice.note:
        log(f"note: {choice.note}")
    run = cfg.run_settings(names)
    run["precision"] = resolve_precision(cfg.precision)
    state = _load_state(out / "state.safetensors") if cfg.resume else None
    if state is not None:
        saved = state[6]
        if cfg.precision == AUTO_PRECISION and saved.get("precision") in PRECISIONS:
            run["precision"] = saved["precision"]  # a resumed run keeps the precision it began with
        for key, value in saved.items():
            if key != "model" and run.get(key) != value:
                raise MlxnetError(f"{out / 'state.safetensors'}: cannot resume: {key} was {value!r}, now {run.get(key)!r}")
        variant = saved["model"]
        from ..models.yolo import build_variant
        net = _for_training(build_variant(variant, nc))
        net.update(tree_unflatten(list(state[0].items())))
    else:
        net, variant = build_network(cfg, names, log)
    if world > 1:  # every process normalises with the whole batch's statistics
        for _, m in net.named_modules():
            if isinstance(m, nn.BatchNorm):
                m.synchronised = True
    run["model"] = variant
    dtype = PRECISIONS[run["precision"]]
    master = dict(tree_flatten(net.trainable_parameters()))
    compiled = compile_training()
    opt = O.GroupedOptimizer(choice.name, master, lr=choice.lr, momentum=choice.momentum, weight_decay=weight_decay,
                             compiled=compiled)
    # The weights, their gradients, the optimizer's and the EMA's state live packed in vectors
    # (opt.layout): a few kernels per step instead of hundreds.
    layout = opt.layout
    weights = layout.pack(master)
    ema = O.EMA(dict(tree_flatten(net.parameters())), compiled=compiled, lead=layout)
    pending: mx.array | None = None
    progress = _Progress()
    rows: list[EpochRow] = []
    if state is not None:
        opt.load_state(state[2])
        ema = O.EMA(state[1], updates=state[4], compiled=compiled, lead=layout)
        pending = None if state[3] is None else layout.pack(state[3])
        progress = state[5]
        rows = _read_results(out)[:progress.epoch]
    mx.eval(net.parameters(), weights, opt.flat_state, ema.flat)
    settings = cfg.loss
    hw = (cfg.imgsz, cfg.imgsz)
    warmup = O.warmup_iterations(cfg.warmup_epochs, cfg.epochs, nb)

    def loss_fn(model: nn.Module, images: mx.array, targets: Targets, whole: int) -> tuple[mx.array, mx.array]:
        # Data-parallel: this process's share of the one-process loss (detection_loss)
        return detection_loss(model.train_outputs(images), targets, hw, num_classes=nc, settings=settings,
                              total=distributed.all_sum if world > 1 else None, batch_size=whole)

    # Data-parallel steps stay eager: a compiled step around the processes' sums is untested.
    step_compiled = compiled and world == 1
    step_fn = _step_function(net, loss_fn, compiled=step_compiled, pack=layout.pack)
    in_net: mx.array | None = None  # the weights vector whose values the network holds now

    def hold(flat: mx.array) -> mx.array:
        """The network computes with ``flat``'s values in the compute precision (views of the returned vector)."""
        computed = flat if dtype == mx.float32 else flat.astype(dtype)
        net.update(tree_unflatten(list(layout.unpack(computed, keep_dtype=False).items())))
        return computed
    if step_compiled and backend() == "cuda":
        log(COMPILE_NOTE)
    note = plan_cache_note()
    if note:
        log(note)
    validator = Validator(variant, nc, names, dtype)
    steps_done = progress.epoch * nb
    # results.csv's time, as ultralytics counts it: wall seconds since training began (each
    # epoch's saving and plotting in the next epoch's), continued from the rows of a resumed run.
    began, before = time.perf_counter(), (rows[-1].elapsed if rows else 0.0)
    writer = BackgroundWriter()  # an epoch's files go to disk while the next one trains

    def epoch_plan(epoch: int) -> tuple[bool, list[np.ndarray], list[np.ndarray]]:
        """Whether ``epoch`` is a mosaic epoch, its batches (dataset indices), and this process's share of each."""
        order = epoch_order(n, cfg.seed, epoch)
        groups = [order[i:i + batch] for i in range(0, n, batch)]
        if cfg.max_steps is not None:
            groups = groups[:max(0, cfg.max_steps - steps_done)]
        return (epoch < cfg.epochs - cfg.close_mosaic, groups,
                [np.array_split(g, world)[distributed.rank()] for g in groups])

    processes = _sample_processes(cfg, train_set, train_labels)
    try:
        while progress.epoch < cfg.epochs:
            epoch = progress.epoch
            mosaic, groups, mine = epoch_plan(epoch)
            if not groups:
                break
            net.train()
            start, waited, seen = time.perf_counter(), 0.0, 0
            sums = np.zeros(3)
            step_settings = None
            unread: tuple | None = None  # (parts, batch index, batch) of the step whose losses are not read yet
            updated: tuple = ()  # an optimizer update's arrays, not yet sent to the device

            def read_losses(parts: mx.array, i: int, b: D.Batch) -> None:
                """Waits for step i's losses, stops on a non-finite one, adds them to the epoch's."""
                nonlocal sums, seen
                values = np.array(parts.astype(mx.float32))
                if not np.isfinite(values).all():
                    files = ", ".join(str(p) for p in b.paths)
                    share = " (this process's share)" if world > 1 else ""
                    raise MlxnetError(f"the loss is not finite at epoch {epoch + 1}, batch {i + 1} "
                                      f"(box, cls, dfl = {', '.join(f'{v:g}' for v in values)}); the batch's images{share}: "
                                      f"{files}. Nothing of this epoch was written; {out / 'weights/best.safetensors'} "
                                      "is untouched")
                sums += values
                seen += len(groups[i])
                mean = sums / (i + 1)
                bar.advance(f"box {mean[0]:.4g}  cls {mean[1]:.4g}  dfl {mean[2]:.4g}  "
                            f"{seen / (time.perf_counter() - start):.1f} images/s")

            with progress_bar(f"epoch {epoch + 1}/{cfg.epochs}", len(groups), status=True, transient=True,
                              quiet=not main) as bar:
                for i, b in enumerate(D.batches(train_set, train_labels, mine, imgsz=cfg.imgsz, seed=cfg.seed,
                                                epoch=epoch, mosaic=mosaic, workers=cfg.workers,
                                                processes=processes)):
                    waited += b.wait_seconds
                    ni = i + nb * epoch
                    step_settings = O.settings_at(ni, epoch, warmup=warmup, accumulate=nominal, lr0=choice.lr,
                                                  epochs=cfg.epochs, lrf=cfg.lrf, momentum=choice.momentum,
                                                  warmup_momentum=cfg.warmup_momentum,
                                                  warmup_bias_lr=choice.warmup_bias_lr, sgd=choice.name == "sgd")
                    if weights is not in_net:  # a run's first step
                        hold(weights)
                        in_net = weights
                    targets = Targets.from_lists(b.boxes, b.classes, bucket=True)
                    images = mx.array(b.images).astype(dtype) / 255
                    parts, packed = step_fn(images, targets.boxes, targets.classes, len(groups[i]))
                    if world > 1:  # each process's gradient is its share's: their sum is the batch's
                        packed, parts = distributed.all_sum(packed), distributed.all_sum(parts)
                    pending = packed if pending is None else pending + packed
                    # Each step evaluated on its own (not a growing graph): its graph is built
                    # while the device runs the previous step, whose end is awaited before this
                    # one is sent. MLX frees a buffer only once the device has run every
                    # kernel that reads it, so two steps in flight would hold both steps'
                    # activations: the peak would be nearly two steps', not one. A pending
                    # optimizer update goes with this step, for the same reason.
                    mx.synchronize()
                    mx.async_eval(parts, pending, running_statistics(net), *updated)
                    updated = ()
                    if unread is not None:
                        read_losses(*unread)
                    unread = (parts, i, b)
                    if ni - progress.last_opt_step >= step_settings.accumulate:
                        opt.lr.update(step_settings.lr)
                        opt.momentum.update(step_settings.momentum)
                        weights = opt.step(weights, pending, max_norm=O.MAX_GRAD_NORM)
                        ema.update(dict(tree_flatten(net.parameters())), packed=weights)
                        # The network's copy in the compute precision, evaluated with the update:
                        # a cast left for the next step to evaluate would keep the update's
                        # inputs (the previous weights and moments) alive with it.
                        in_net = weights
                        updated = (weights, opt.flat_state, ema.flat, hold(weights))
                        pending, progress.last_opt_step = None, ni
                if unread is not None:
                    read_losses(*unread)
                mx.eval(*updated)
            steps_done += len(groups)
            seconds = time.perf_counter() - start
            partial = len(groups) < nb
            if processes is not None and not partial and epoch + 1 < cfg.epochs:
                # The next epoch's first batches are made while this one validates and saves.
                next_mosaic, _, next_mine = epoch_plan(epoch + 1)
                processes.prefetch([i for g in next_mine[:D.AHEAD] for i in g], cfg.seed, epoch + 1, next_mosaic)
            metrics = (0.0, 0.0, 0.0, 0.0)
            if val_set is not None and not partial and main:
                metrics = _validate(validator, ema.arrays, names, val_set, cfg)
            lr = step_settings.lr if step_settings else dict.fromkeys(O.GROUPS, 0.0)
            elapsed = before + time.perf_counter() - began
            row = EpochRow(epoch + 1, elapsed, seconds, tuple(sums / len(groups)), *metrics,
                           tuple(lr[g] for g in ("weight", "bn", "bias")), seen / seconds, waited / seconds)
            if main:
                _log_epoch(cfg, row, partial)
            if partial:
                break
            progress.epoch += 1
            rows.append(row)
            best = fitness(row) > progress.best_fitness
            if best:
                progress.best_fitness = fitness(row)
            if not main:  # rank 0 alone writes the run's files
                continue
            # Host copies, made here: the writer thread then never enters MLX while the next
            # epoch's steps are being dispatched from this one. A packed vector crosses in one
            # copy (hundreds of per-array copies each wait on the device).
            # The trained weights as the optimizer holds them (float32), whatever the network computes in;
            # the network's own arrays for the rest (BatchNorm statistics).
            rest = {k: v for k, v in tree_flatten(net.parameters()) if k not in layout.sizes}
            mx.eval(rest)
            model_arrays = {**host_copies(rest), **layout.host_unpack(weights)}
            averaged, opt_state = ema.host_arrays(), opt.host_state()
            kept = None if pending is None else layout.host_unpack(pending, keep_dtype=False)
            writer.wait()  # the previous epoch's files are whole on disk (or their failure raised)
            writer.submit(_save_weights, out / "weights/last.safetensors", averaged, variant, names, cfg.data)
            if best:
                writer.submit(_save_weights, out / "weights/best.safetensors", averaged, variant, names, cfg.data)
            writer.submit(_write_results, out, list(rows))
            writer.submit(_save_state, out / "state.safetensors", model_arrays, averaged, ema.updates, opt_state, kept,
                          replace(progress), run)
            # The writer holds these until written; kept here they would hold this epoch's
            # weights, EMA and moments through the whole next epoch (their views pin whole vectors).
            del rest, model_arrays, averaged, opt_state, kept
    except BaseException:
        writer.close(raise_errors=False)
        raise
    finally:
        if processes is not None:
            processes.close()
    writer.close()
    if rows:
        log(f"wrote {out / 'weights/best.safetensors'} (mlxnet detect --weights {out / 'weights/best.safetensors'})")
    return rows


def _sample_processes(cfg: DetectTrainConfig, train_set: D.DetectionSet,
                      labels: list[D.Labels]) -> D.SampleProcesses | None:
    """Worker processes for the run's samples where the step runs on a GPU: there the main
    thread mostly builds graphs, which data threads' Python would hold up; on the CPU the step
    keeps the cores busy and threads cost less memory."""
    workers = D.default_workers() if cfg.workers is None else cfg.workers
    if workers == 0 or backend() == "cpu":
        return None
    return D.SampleProcesses(train_set, labels, imgsz=cfg.imgsz, workers=workers)


def plan_cache_note() -> str | None:
    """On CUDA, in a process that MLX loaded with its 128 cuDNN plans (a library caller that did
    not set MLX_CUDA_CONV_CACHE_SIZE before starting Python; the ``mlxnet`` command sets it): a
    training step and its validation use more plans than that, so every epoch would rebuild them."""
    from .._cuda_graphs import LOAD_TIME_SETTINGS, unset_load_time_settings

    if backend() != "cuda" or "MLX_CUDA_CONV_CACHE_SIZE" not in unset_load_time_settings():
        return None
    return ("note: MLX keeps 128 cuDNN plans in this process; a training step and its validation use more, so each "
            "epoch rebuilds them (a fifth of an epoch of yolov8n): start Python with MLX_CUDA_CONV_CACHE_SIZE="
            f"{LOAD_TIME_SETTINGS['MLX_CUDA_CONV_CACHE_SIZE']}, as the mlxnet command runs")


COMPILE_NOTE = ("note: the training step runs compiled; the first time this machine trains this model, its first step "
                "compiles the step's GPU code (minutes; MLX caches it for later runs). MLXNET_COMPILE=off trains "
                "without compiling, each step about twice as slow")


def compile_training() -> bool:
    """Whether the training step (forward, loss, backward), the optimizer update and the EMA
    run compiled: fused elementwise chains, a graph replayed instead of built op by op from
    Python (half a small model's step time on a GPU). By default where models compile
    (:func:`mlxnet.device.compile_enabled`: GPU back ends), CUDA included: there MLX's
    run-time compiler takes minutes for a step's fused kernels the first time a machine trains
    a given model (MLX caches them), which a training run of any length wins back, unlike an
    image command (:mod:`mlxnet.commands.quick_start`). ``MLXNET_COMPILE=off`` trains eagerly.
    The weights, the optimizer's and the EMA's state are packed vectors, so their eager update
    is a dozen kernels a step."""
    return compile_enabled()


def _step_function(net: nn.Module, loss_fn: Callable, compiled: bool = False,
                   pack: Callable[[dict[str, mx.array]], mx.array] | None = None) -> Callable:
    """(images, target boxes, target classes, images in the whole batch) -> (loss parts,
    gradients), the BatchNorm statistics updated in ``net``. Compiled, it is traced once per
    input shape (targets are padded to a few bucketed sizes for that reason). ``pack``: the
    gradients come as one vector (:meth:`FlatLayout.pack` of their flat dict), packed inside the
    step, so that a compiled step's graph holds the packing too."""
    grad_fn = nn.value_and_grad(net, loss_fn)

    def step(images: mx.array, boxes: mx.array, classes: mx.array, whole: int) -> tuple[mx.array, Any]:
        with differentiating():
            (_, parts), grads = grad_fn(net, images, Targets(boxes, classes), whole)
        return parts, (grads if pack is None else pack(dict(tree_flatten(grads))))
    if not compiled:
        return step
    state = [net.state]  # the parameters read and the running statistics written
    return mx.compile(step, inputs=state, outputs=state)


def _validate(validator: Validator, arrays: dict, names: tuple[str, ...], val_set: D.DetectionSet,
              cfg: DetectTrainConfig) -> tuple[float, float, float, float]:
    from ..evaluation.detect import evaluate

    yolo = validator.load(arrays)
    with progress_bar("validation", len(val_set.images), transient=True) as bar:
        result = evaluate(yolo, val_set.images, val_set.labels, imgsz=cfg.imgsz, batch=max(cfg.batch * 2, 1),
                          progress=lambda k: bar.advance(count=k), prepared=validator.prepared)
    return result.mp, result.mr, result.map50, result.map


def _log_epoch(cfg: DetectTrainConfig, r: EpochRow, partial: bool) -> None:
    where = f"epoch {r.epoch}/{cfg.epochs}" + (" (stopped by --max-steps)" if partial else "")
    val = (f"  P {r.precision:.3g}  R {r.recall:.3g}  mAP50 {r.map50:.3g}  mAP50-95 {r.map50_95:.3g}"
           if cfg.val and not partial else "")
    cfg.log(f"{where}  box {r.losses[0]:.4g}  cls {r.losses[1]:.4g}  dfl {r.losses[2]:.4g}{val}  "
            f"{r.images_per_s:.1f} images/s  data wait {r.data_wait:.0%}")
