"""Seeded random weights: what a freshly built model holds, and the ``random`` weights source.

Every model family's ``build`` and the weights source ``random`` (``--weights random``: try any
command without a download) give the same weights: the architecture's own constants as it
built them, and :func:`~mlxnet.nn.init.scale_preserving_init` values (seed 0) for everything
learned, so a run on them is deterministic and its activations keep their scale.

A constant of the architecture that checkpoints store beside the learned weights (YOLOv8's DFL
bin values 0..15, a fixed positional table) is declared by the module that holds it::

    class DFL(nn.Module):
        fixed_parameters = ("conv.weight",)  # set at construction, never learned

Random initialisation keeps those as constructed: re-drawing them gives a network that cannot
run (DFL bins drawn at random decode boxes whose right edge lies left of their left edge).

A layer whose scale-preserving values leave an output too unsure to show anything declares a
gain for them (``fnmatch`` patterns of its parameters' paths)::

    class MaskDecoder(nn.Module):
        random_gains = {"output_hypernetworks_mlps.*.layers.2.weight": 100.0}
"""
from __future__ import annotations

import fnmatch
import os
from pathlib import Path
from typing import TYPE_CHECKING

import mlx.nn as nn
from mlx.utils import tree_flatten

from ..errors import MlxnetError
from .checkpoint_types import Checkpoint

if TYPE_CHECKING:
    from .spec import WeightSpec

RANDOM = "random"  # the weights source that names no file: seeded random weights, built here
SEED = 0


def is_random(source: str | os.PathLike | None) -> bool:
    """Whether ``source`` is the ``random`` weights source (a file of that name still wins)."""
    return isinstance(source, str) and source.lower() == RANDOM and not Path(source).exists()


def fixed_parameters(model: nn.Module) -> set[str]:
    """Dotted paths of the parameters that the modules of ``model`` declare fixed."""
    found = set()
    for path, module in model.named_modules():
        for name in getattr(type(module), "fixed_parameters", ()):
            found.add(f"{path}.{name}" if path else name)
    return found


def random_gains(model: nn.Module) -> dict[str, float]:
    """Dotted paths of the parameters of ``model`` whose modules declare a random-init gain, with it."""
    found = {}
    for path, module in model.named_modules():
        patterns = getattr(type(module), "random_gains", {})
        if not patterns:
            continue
        for name, _ in tree_flatten(module.parameters()):
            gain = next((g for pattern, g in patterns.items() if fnmatch.fnmatchcase(name, pattern)), None)
            if gain is not None:
                found[f"{path}.{name}" if path else name] = gain
    return found


def random_init(model: nn.Module, seed: int = SEED) -> nn.Module:
    """``model`` with seeded scale-preserving weights, its fixed parameters as constructed and
    its declared gains applied."""
    from ..nn.init import scale_preserving_init  # nn's norm module imports weights.fold: no cycle at import

    fixed = fixed_parameters(model)
    scale_preserving_init(model, seed, keep=fixed.__contains__)
    gains = random_gains(model)
    if gains:
        current = dict(tree_flatten(model.parameters()))
        model.load_weights([(k, current[k] * g) for k, g in gains.items()], strict=False)
    return model


def random_checkpoint(spec: WeightSpec, seed: int = SEED) -> Checkpoint:
    """The ``random`` source for ``spec``'s model: its freshly built weights, as the model's own
    ``save_weights`` would store them (loaders take such a file as it is)."""
    if spec.build is None:
        raise MlxnetError(f"model {spec.id!r} cannot be built, so it has no random weights (WeightSpec.build)")
    model = random_init(spec.build(fold_bn=False), seed)
    return Checkpoint(Path(RANDOM), dict(tree_flatten(model.parameters())))
