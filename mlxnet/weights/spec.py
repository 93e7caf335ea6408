"""Weight specs: how one model family's PyTorch checkpoint maps onto its mlxnet parameters.

A model family registers one :class:`WeightSpec` per checkpoint it can load::

    register_spec(WeightSpec(
        id="resnet50", repo="timm/resnet50.a1_in1k", filename="model.safetensors",
        keys=[(r"fc\\.(weight|bias)", r"head.\\1"), (r"(.*)", r"\\1")],
        drop=[r".*\\.num_batches_tracked"],
        layouts=[(r".*conv\\d*\\.weight|.*downsample\\.0\\.weight", "conv2d")],
        build=lambda fold_bn=False: ResNet50(),
    ))

Nothing is guessed: a checkpoint key that no ``keys`` rule maps and no ``drop`` rule names is an
error, and so is a tensor of 3 or more dimensions that no ``layouts`` rule describes (its layout
cannot be told from its shape: a conv and a transposed conv look alike).
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence, Union

from ..errors import MlxnetError, summary
from .layout import LayoutKind

if TYPE_CHECKING:
    import mlx.nn as nn

    from .checkpoint_types import Checkpoint, Description

# (regex on the mlxnet key, kind) or (regex, kind, groups); groups matter for grouped transposed convs.
LayoutRule = Union[tuple[str, LayoutKind], tuple[str, LayoutKind, int]]
LayoutFn = Callable[[str, tuple], Union[LayoutKind, tuple[LayoutKind, int], None]]

_NDIM = {"conv1d": 3, "conv2d": 4, "conv_transpose1d": 3, "conv_transpose2d": 4}


@dataclass(frozen=True)
class FoldBN:
    """A conv (or linear) followed by a BatchNorm, in mlxnet key space.

    ``conv`` is a regex that fully matches the conv's module path (its weight key without
    ``.weight``); ``bn`` is the BatchNorm's module path as a ``re`` template on that match,
    e.g. ``FoldBN(r"(.*)\\.conv", r"\\1.bn", eps=1e-3)``.
    """

    conv: str
    bn: str
    eps: float = 1e-5


@dataclass(frozen=True)
class WeightSpec:
    """Everything mlxnet needs to turn one family's PyTorch checkpoint into its parameters.

    id:        short name used by the CLI and :func:`resolve_weights` ("resnet50", "yolov8n").
    repo, filename, revision: the Hugging Face Hub file holding the upstream checkpoint.
    keys:      ordered (regex on the PyTorch key, ``re`` replacement) rules; the first rule whose
               regex fully matches renames the key. Add ``(r"(.*)", r"\\1")`` last to keep the rest.
    drop:      regexes of PyTorch keys dropped on purpose (e.g. ``.*num_batches_tracked``).
    layouts:   (regex on the mlxnet key, kind[, groups]) rules, first full match wins, or a function
               ``(mlxnet_key, shape) -> kind | (kind, groups) | None``. Tensors of <= 2 dims that
               match nothing stay as they are.
    checkpoint_key: dotted path of the state dict inside a pickled checkpoint ("state_dict",
               "model"); None finds it (see :func:`find_state_dict`).
    fold_bn:   conv+BN pairs that ``--fold-bn`` fuses.
    build:     ``build(fold_bn=False, **config) -> nn.Module``: lets conversion check every key
               and shape; ``config`` is what ``describe`` read from the checkpoint.
    describe:  ``describe(checkpoint) -> Description``: the variant, build configuration and
               class names a checkpoint holds (default: what ``mlxnet convert`` wrote in its
               metadata). A checkpoint that fits no variant is a one-line error here.
    """

    id: str
    repo: str | None = None
    filename: str | None = None
    revision: str | None = None
    keys: Sequence[tuple[str, str]] = ()
    drop: Sequence[str] = ()
    layouts: Sequence[LayoutRule] | LayoutFn = ()
    checkpoint_key: str | None = None
    fold_bn: Sequence[FoldBN] = ()
    build: Callable[..., "nn.Module"] | None = field(default=None, compare=False)
    describe: Callable[["Checkpoint"], "Description"] | None = field(default=None, compare=False)

    def map_keys(self, names: Sequence[str], source: str | None = None) -> dict[str, str]:
        """PyTorch key -> mlxnet key for every kept key; all unmapped keys reported at once, in
        one line (the first few and the count) naming ``source``, the file, where given."""
        out: dict[str, str] = {}
        unmapped: list[str] = []
        seen: dict[str, str] = {}
        clashes: list[str] = []
        for name in names:
            if any(re.fullmatch(p, name) for p in self.drop):
                continue
            for pattern, repl in self.keys:
                m = re.fullmatch(pattern, name)
                if m:
                    target = m.expand(repl)
                    if target in seen:
                        clashes.append(f"{seen[target]} and {name} both map to {target}")
                    seen[target] = name
                    out[name] = target
                    break
            else:
                unmapped.append(name)
        problems = [f"unmapped key {k} (no rule in spec {self.id!r} maps or drops it)" for k in unmapped]
        problems += [f"key clash: {c}" for c in clashes]
        if problems:
            of = f" of {source}" if source else ""
            raise MlxnetError(summary(f"spec {self.id!r} cannot map {len(problems)} checkpoint key(s){of}", problems,
                                       counted=True))
        return out

    def layout_of(self, key: str, shape: tuple, source: str | None = None) -> tuple[LayoutKind, int]:
        """(kind, groups) for one mlxnet key; refuses to guess for tensors of 3+ dims (the error
        names ``source``, the file, where given)."""
        of = f" in {source}" if source else ""
        found = None
        if callable(self.layouts):
            found = self.layouts(key, tuple(shape))
        else:
            for rule in self.layouts:
                if re.fullmatch(rule[0], key):
                    found = rule[1:]
                    break
        if found is None:
            if len(shape) <= 2:
                return "plain", 1
            raise MlxnetError(f"spec {self.id!r}: no layout rule for {key} with shape {tuple(shape)}{of} "
                              "(a tensor of 3+ dims needs one)")
        kind, groups = (found, 1) if isinstance(found, str) else (found[0], found[1] if len(found) > 1 else 1)
        if kind != "plain" and len(shape) != _NDIM.get(kind, -1):
            raise MlxnetError(f"spec {self.id!r}: layout {kind} for {key} expects {_NDIM.get(kind)} dims, "
                              f"found shape {tuple(shape)}{of}")
        return kind, groups


_SPECS: dict[str, WeightSpec] = {}
_builtins_loaded = False


def register_spec(spec: WeightSpec, *, replace: bool = False) -> WeightSpec:
    """Make ``spec`` known by its id (models call this when their module is imported)."""
    old = _SPECS.get(spec.id)
    if old is not None and old is not spec and not replace:
        raise MlxnetError(f"weight spec {spec.id!r} is already registered (pass replace=True to override)")
    _SPECS[spec.id] = spec
    return spec


def list_specs() -> list[str]:
    _load_builtin_specs()
    return sorted(_SPECS)


def get_spec(spec_id: str | WeightSpec) -> WeightSpec:
    if isinstance(spec_id, WeightSpec):
        return spec_id
    if spec_id not in _SPECS:
        _load_builtin_specs()
    if spec_id not in _SPECS:
        known = ", ".join(sorted(_SPECS)) or "none"
        raise MlxnetError(f"unknown model {spec_id!r}: registered weight specs are {known}")
    return _SPECS[spec_id]


def _load_builtin_specs() -> None:
    # The model families register their specs when mlxnet.models imports them; import it lazily so
    # that `mlxnet convert --model X` sees them without every weights user paying for the models.
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        importlib.import_module("mlxnet.models")
