"""The two values a weights file turns into: the :class:`Checkpoint` as read and the
:class:`Description` of the model it holds.

They are data only (no file access), so that everything in ``mlxnet.weights`` may name them: the
readers in :mod:`.checkpoint` make them, and a :class:`~.spec.WeightSpec`'s ``describe`` turns
one into the other. (They lived in :mod:`.checkpoint`, which needs :mod:`.hub`, which needs
:mod:`.spec`: the spec naming them closed a cycle.)
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx

from ..errors import MlxnetError

FORMAT = "mlxnet"  # safetensors metadata "format" of converted files (upstream files say "pt")


@dataclass
class Checkpoint:
    """``tensors`` as stored (PyTorch or mlxnet keys and layouts), the safetensors ``metadata``
    ({} for a pickle) and, for a pickle, the unpickled object (inert records) as ``raw``."""

    path: Path
    tensors: dict[str, mx.array]
    metadata: dict[str, str] = field(default_factory=dict)
    raw: Any = None

    @property
    def converted(self) -> bool:
        """Written by ``mlxnet convert``: mlxnet keys and layouts, self-describing metadata."""
        return self.metadata.get("format") == FORMAT

    def meta_json(self, key: str) -> Any:
        """A JSON value of the metadata (None if absent); a one-line error if it does not parse."""
        text = self.metadata.get(key)
        if text is None:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise MlxnetError(f"{self.path}: metadata {key!r} is not JSON: {text[:60]!r}") from None

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(v.shape) for k, v in self.tensors.items()}


@dataclass
class Description:
    """What a checkpoint says about the model it holds. ``config``: keyword arguments of the
    spec's ``build`` (e.g. ``nc``, ``num_classes``); ``variant``: the spec id it is for, if it
    says; ``names``: class names, if it carries them."""

    variant: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    names: tuple[str, ...] | None = None
