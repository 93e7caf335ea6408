"""The one model interface: what every model family implements and registers.

The CLI's ``check`` and ``bench`` and the tests reach models only through this
module: a family says which variants it has, how to build one (random weights) or load one
(``from_pretrained``: an id or a path, and a dtype), what inputs its ``__call__`` takes for a
given image size (random, or a real image through its own preprocessing) and which module a
layer-by-layer check should run. Families register themselves when ``mlxnet.models`` is
imported; the core never imports a model module by name. A new model family is one module
that subclasses :class:`ModelFamily` and calls :func:`register`.
"""
from __future__ import annotations

import importlib
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .errors import MlxnetError


class ModelFamily:
    """Override ``variants``, ``build``, ``from_pretrained`` and ``example_inputs``; the rest
    has defaults."""

    name: str = ""
    variants: tuple[str, ...] = ()
    default_size: int = 224
    # Random-weight checks: also set the BatchNorm statistics from the check's own input (for
    # deep residual stacks whose activations otherwise saturate the head; see check.calibrate).
    calibrate_batchnorm: bool = False
    task: str = ""  # the CLI command that runs this family: classify, detect, segment, inpaint

    def build(self, variant: str) -> nn.Module:
        """The variant with random weights, in eval mode, initialised so that activations keep
        their scale through the depth (a check on random weights must still mean something),
        and ready to run: the architecture's constants (``fixed_parameters``) as constructed.
        ``mlxnet.weights.random_init`` does both; the weights source ``random`` gives the same."""
        raise NotImplementedError

    def from_pretrained(self, source: str, variant: str | None = None,
                        dtype: str | None = None) -> nn.Module:
        """The variant with weights from an id (the hub), a file or ``random``, in eval mode."""
        raise NotImplementedError

    def example_inputs(self, variant: str, size: int) -> list[mx.array]:
        """Random inputs for the module's ``__call__`` at about ``size`` pixels a side."""
        raise NotImplementedError

    def image_inputs(self, variant: str, image: np.ndarray, size: int) -> list[mx.array]:
        """A real image (uint8 HWC RGB) through the family's own preprocessing."""
        raise MlxnetError(f"{variant}: runs on random inputs only (use --size)")

    def predictor(self, weights: str | None, variant: str, dtype: str | None = None) -> Any:
        """What the family's CLI command runs on images: the network with its own pre- and
        post-processing (weights: an id, a path or ``random``, which every loader of
        ``mlxnet.weights`` takes; None: the variant's own hub weights)."""
        raise MlxnetError(f"{variant}: no predictor")

    def checked(self, model: nn.Module) -> nn.Module:
        """The module a layer-by-layer check runs (the model itself unless it needs prompts)."""
        return model

    def prepare(self, image: np.ndarray, **options: Any) -> Any:
        """The host half of the predictor's preprocessing for one uint8 HWC RGB image, before
        the weights are loaded and on any thread (NumPy and OpenCV only): what the predictor's
        ``predict_prepared`` takes. By default the image itself."""
        return image


_FAMILIES: dict[str, ModelFamily] = {}


def register(family: ModelFamily) -> ModelFamily:
    """Make a family known to the CLI, the check and the benchmarks."""
    for variant in family.variants:
        owner = _owner(variant)
        if owner is not None and owner is not family and owner.name != family.name:
            raise MlxnetError(f"model variant {variant!r} is registered by {owner.name!r} already")
    _FAMILIES[family.name] = family
    return family


def _owner(variant: str) -> ModelFamily | None:
    return next((f for f in _FAMILIES.values() if variant in f.variants), None)


def _load_bundled() -> None:
    importlib.import_module("mlxnet.models")  # the bundled families register on import


def families() -> dict[str, ModelFamily]:
    _load_bundled()
    return dict(_FAMILIES)


def variants() -> dict[str, ModelFamily]:
    """Every variant name, with the family that builds it."""
    return {v: f for f in families().values() for v in f.variants}


def family_of(variant: str) -> ModelFamily:
    known = variants()
    if variant not in known:
        raise MlxnetError(f"unknown model {variant!r}; known: {', '.join(sorted(known))}")
    return known[variant]


def for_task(variant: str, task: str) -> ModelFamily:
    """The family of ``variant``, which must be one that ``task`` runs."""
    family = family_of(variant)
    if family.task != task:
        choices = sorted(v for v, f in variants().items() if f.task == task)
        raise MlxnetError(f"{variant} is not a model for `mlxnet {task}`; choose one of {', '.join(choices)}")
    return family


def build_for_check(variant: str, weights: str | None, image: np.ndarray | None,
                    size: int) -> tuple[nn.Module, list[Any]]:
    """(module, inputs) for a layer-by-layer check of ``variant``."""
    from .check import calibrate

    from .weights import is_random

    family = family_of(variant)
    random = not weights or is_random(weights)  # 'random' is what build gives: calibrated as such
    model = family.build(variant) if random else family.from_pretrained(weights, variant)
    inputs = (family.image_inputs(variant, image, size) if image is not None
              else family.example_inputs(variant, size))
    checked = family.checked(model)
    if random and family.calibrate_batchnorm:
        calibrate(checked, inputs)
    return checked, inputs
