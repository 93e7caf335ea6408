"""Finding the state dict in what a checkpoint holds: a plain mapping of tensors, a pickled
``nn.Module`` (a :class:`~.records.Record`), or either wrapped in a training checkpoint."""
from __future__ import annotations

from typing import Any, Mapping

import mlx.core as mx
import numpy as np

from ...errors import MlxnetError
from .records import Record
from .tensors import Tensor

_STATE_KEYS = ("state_dict", "model_state_dict", "ema", "model", "module", "net", "params")


def is_tensor(x: Any) -> bool:
    return isinstance(x, (np.ndarray, mx.array))


def find_state_dict(obj: Any, key: str | None = None, *, source: str = "checkpoint") -> dict[str, Tensor]:
    """Flat ``{dotted name: tensor}`` from what :func:`read_torch_checkpoint` returned.

    ``key`` is a dotted path to follow first ("state_dict", "model"). Otherwise: a mapping of
    tensors is the state dict (nested mappings of tensors get dotted keys); a pickled ``nn.Module`` (a :class:`Record` with ``_modules``,
    ``_parameters``, ``_buffers``; e.g. ultralytics' ``ckpt["model"]``) is flattened like
    ``module.state_dict()``; a checkpoint dict is searched under ``state_dict`` (Lightning),
    ``model_state_dict``, ``ema``, ``model``, ``module``, ``net``, ``params``.
    """
    if key:
        for part in key.split("."):
            container = {**obj.items, **obj.attrs} if isinstance(obj, Record) else obj
            if not isinstance(container, Mapping) or part not in container:
                raise MlxnetError(f"{source}: no {key!r} in the checkpoint (missing {part!r})")
            obj = container[part]
    found = None
    if key is None and isinstance(obj, Mapping) and not all(is_tensor(v) for v in obj.values()):
        for k in _STATE_KEYS:  # a checkpoint wrapping its state dict: {"model": sd, "epoch": ...}
            found = _state_dict_of(obj[k]) if k in obj else None
            if found:
                break
    found = found or _state_dict_of(obj)
    if not found:
        what = f"top-level keys: {', '.join(map(str, list(obj)[:12]))}" if isinstance(obj, Mapping) else type(obj).__name__
        raise MlxnetError(f"{source}: no state dict found ({what}); name where it is (checkpoint_key)")
    return found


def _state_dict_of(obj: Any) -> dict[str, Tensor] | None:
    if isinstance(obj, Record) and "_modules" in obj.attrs:
        out: dict[str, Tensor] = {}
        _flatten_module(obj, "", out)
        return out
    if isinstance(obj, Record) and obj.items:  # a dict subclass outside the allow-list
        obj = obj.items
    if isinstance(obj, Mapping) and obj:
        out = {}
        if _flatten_tensors(obj, "", out):
            return out
    return None


def _flatten_tensors(obj: Mapping, prefix: str, out: dict) -> bool:
    """Nested mappings whose leaves are all tensors -> dotted keys; False if anything else is there."""
    for k, v in obj.items():
        name = f"{prefix}{k}"
        if is_tensor(v):
            out[name] = v
        elif not (isinstance(v, Mapping) and v and _flatten_tensors(v, name + ".", out)):
            return False
    return True


def _flatten_module(rec: Record, prefix: str, out: dict) -> None:
    attrs = rec.attrs
    skip = set(attrs.get("_non_persistent_buffers_set") or ())
    for group in ("_parameters", "_buffers"):
        for name, value in (attrs.get(group) or {}).items():
            if value is not None and not (group == "_buffers" and name in skip):
                out[prefix + name] = value
    for name, child in (attrs.get("_modules") or {}).items():
        if isinstance(child, Record):
            _flatten_module(child, f"{prefix}{name}.", out)
