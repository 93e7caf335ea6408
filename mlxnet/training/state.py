"""Training checkpoints: the model, the optimizer state and where the run stands, in one
safetensors file (never a pickle), written atomically by rank 0 after every epoch."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from ..errors import MlxnetError
from ..weights.safetensors_io import load_safetensors_with_metadata, save_safetensors

FORMAT = "mlxnet-train"


@dataclass
class TrainState:
    """``epoch``: epochs completed; ``step``: optimizer steps taken; ``run``: the settings a
    resumed run must share (model, classes, batch, seed, ...)."""
    model: dict[str, mx.array]
    optimizer: dict[str, mx.array]
    epoch: int
    step: int
    run: dict[str, Any]


def save_state(path: str | os.PathLike, model_arrays: Mapping[str, Any], optimizer_state: Mapping[str, Any],
               epoch: int, step: int, run: Mapping[str, Any]) -> Path:
    arrays = {f"model.{k}": v for k, v in tree_flatten(model_arrays)}
    arrays.update({f"optimizer.{k}": v for k, v in tree_flatten(optimizer_state) if isinstance(v, mx.array)})
    meta = {"format": FORMAT, "epoch": str(epoch), "step": str(step), "run": json.dumps(dict(run))}
    return save_safetensors(path, arrays, metadata=meta)


def load_state(path: str | os.PathLike) -> TrainState:
    path = Path(path)
    if not path.is_file():
        raise MlxnetError(f"{path}: no training checkpoint to resume from")
    arrays, meta = load_safetensors_with_metadata(path)
    if meta.get("format") != FORMAT:
        raise MlxnetError(f"{path}: not an mlxnet training checkpoint (format {meta.get('format')!r}, "
                          f"expected {FORMAT!r})")
    try:
        epoch, step, run = int(meta["epoch"]), int(meta["step"]), json.loads(meta["run"])
    except (KeyError, ValueError) as e:
        raise MlxnetError(f"{path}: damaged training metadata ({e})") from None

    def part(prefix: str) -> dict[str, mx.array]:
        return tree_unflatten([(k[len(prefix):], v) for k, v in arrays.items() if k.startswith(prefix)])
    return TrainState(part("model."), part("optimizer."), epoch, step, run)


def check_same_run(path: str | os.PathLike, saved: Mapping[str, Any], now: Mapping[str, Any]) -> None:
    """A resumed run must train the same thing the same way: every saved setting but the
    number of epochs must match."""
    for key, value in saved.items():
        if key != "epochs" and now.get(key) != value:
            raise MlxnetError(f"{path}: cannot resume: {key} was {value!r}, now {now.get(key)!r}")
