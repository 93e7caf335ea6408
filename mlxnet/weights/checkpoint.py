"""A weights file as read, and what it says about itself: which variant, which configuration
(class count, ...), which class names.

Three kinds of file load into an mlxnet model:

- a file written by ``mlxnet convert`` (safetensors, metadata ``format: mlxnet``): mlxnet keys
  and layouts, the variant, configuration and class names in its metadata;
- a file written by a model's own ``save_weights`` (MLX safetensors): mlxnet keys and layouts,
  nothing else; recognised because every tensor fits the model as it is;
- an upstream checkpoint (a PyTorch pickle, or safetensors in PyTorch layouts): converted with
  the family's :class:`~mlxnet.weights.spec.WeightSpec`.

Families read the variant and configuration from the tensors' shapes (and from what an upstream
pickle carries, e.g. ultralytics' ``yaml`` and ``names``) through ``WeightSpec.describe``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import mlx.core as mx
import mlx.nn as nn

from ..errors import MlxnetError, reading
from .checkpoint_types import FORMAT, Checkpoint, Description
from .hub import resolve_weights
from .loading import check_weights
from .random_weights import is_random, random_checkpoint
from .safetensors_io import is_safetensors, load_safetensors_with_metadata
from .spec import WeightSpec, get_spec
from .torch_pickle import Tensor, find_state_dict, read_torch_checkpoint
from .torch_pickle.limits import mlx_shape_problem


def open_checkpoint(source: str | os.PathLike, checkpoint_key: str | None = None, *,
                    spec: WeightSpec | str | None = None, ids: Sequence[str] | None = None) -> Checkpoint:
    """Read a weights file (or a model id's hub file) without running any pickled code; the
    source ``random`` is ``spec``'s model freshly built (seeded). ``ids``: the model ids the
    caller takes (see :func:`~.hub.resolve_weights`)."""
    if is_random(source):
        if spec is None:
            raise MlxnetError("'random' weights are built for a model: name the model they are for")
        return random_checkpoint(get_spec(spec))
    path = resolve_weights(source, ids=ids)
    with reading(path, "checkpoint"):  # finding the state dict walks what the file holds, too
        if is_safetensors(path):
            tensors, metadata = load_safetensors_with_metadata(path)
            return Checkpoint(path, tensors, dict(metadata))
        raw = read_torch_checkpoint(path)
        state = find_state_dict(raw, checkpoint_key, source=str(path))
        return Checkpoint(path, {str(k): _as_mlx(v, k) for k, v in state.items()}, raw=raw)


def _as_mlx(tensor: Tensor, key: object) -> mx.array:
    """One tensor of a pickle as an MLX array, its shape checked first (MLX's int32 dimensions)."""
    if isinstance(tensor, mx.array):
        return tensor
    problem = mlx_shape_problem(tensor.shape)
    if problem:
        raise MlxnetError(f"tensor {str(key)[:80]}: {problem}")
    return mx.array(tensor)


def describe_from_metadata(ckpt: Checkpoint) -> Description:
    """The default description: what ``mlxnet convert`` wrote into the metadata, if anything."""
    if not ckpt.converted:
        return Description()
    names, config = ckpt.meta_json("names"), ckpt.meta_json("config")
    if config is not None and not isinstance(config, dict):
        raise MlxnetError(f"{ckpt.path}: metadata 'config' is a JSON {type(config).__name__}, expected an object")
    return Description(ckpt.metadata.get("model"), dict(config or {}),
                       names_of(names, str(ckpt.path)) if names is not None else None)


def names_of(value: Any, source: str) -> tuple[str, ...]:
    """Class names from a list, or a dict of index -> name (as ultralytics and JSON label files
    keep them); the indices must be 0..n-1."""
    if isinstance(value, Mapping):
        try:
            by_index = {int(k): str(v) for k, v in value.items()}
        except (TypeError, ValueError):
            raise MlxnetError(f"{source}: class names are not keyed by index") from None
        if sorted(by_index) != list(range(len(by_index))):
            raise MlxnetError(f"{source}: class name indices are not 0..{len(by_index) - 1}")
        return tuple(by_index[i] for i in range(len(by_index)))
    if isinstance(value, (list, tuple)):
        return tuple(str(v) for v in value)
    raise MlxnetError(f"{source}: class names must be a list or an index -> name mapping, "
                      f"got {type(value).__name__}")


class Labels(tuple):
    """Class names read from a file, which they remember (``source``), so that a model refusing
    their count can name the file."""

    source: Path

    def __new__(cls, names: Sequence[str], source: Path) -> "Labels":
        labels = super().__new__(cls, names)
        labels.source = source
        return labels


def count_mismatch(names: Sequence[str], classes: int) -> str:
    """The one-line complaint about ``names`` for a ``classes``-class model, naming their file
    when they came from one."""
    where = f"{names.source}: " if isinstance(names, Labels) else ""
    return f"{where}{len(names)} class names for a {classes}-class model"


def read_labels(path: str | os.PathLike) -> Labels:
    """Class names from a file: a JSON list or {index: name} object, or one name per line."""
    path = Path(path)
    return Labels(_names_in(path), path)


def _names_in(path: Path) -> tuple[str, ...]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise MlxnetError(f"cannot read labels file {path}: {e}") from None
    if text.lstrip().startswith(("[", "{")):
        try:
            return names_of(json.loads(text), str(path))
        except json.JSONDecodeError as e:
            raise MlxnetError(f"{path}: not valid JSON ({e})") from None
    names = tuple(line.strip() for line in text.splitlines() if line.strip())
    if not names:
        raise MlxnetError(f"{path}: no labels in the file")
    return names


def fits_as_is(ckpt: Checkpoint, model: nn.Module) -> bool:
    """Every tensor has the model's key and shape, and every parameter is there: a file the
    model's own ``save_weights`` wrote (PyTorch layouts differ in the convs' shapes)."""
    return not check_weights(model, ckpt.tensors)

