"""MobileSAM's PyTorch reference for the SAM-tiny goldens and benchmark (not part of mlxnet).

Expects a copy of github ChaoningZhang/MobileSAM's ``mobile_sam`` package in ``.ref-sam/`` (git-ignored,
never committed). MobileSAM imports timm only for helpers that do not matter at inference
(DropPath with rate 0, to_2tuple, an init function, a registry decorator); where timm is missing (or
cannot import torchvision) a minimal stand-in is installed.
"""
from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

REF = Path(__file__).resolve().parents[1] / ".ref-sam"


def _timm_shim() -> None:
    try:
        import timm.models.layers  # noqa: F401
        import timm.models.registry  # noqa: F401
        return
    except Exception:  # noqa: BLE001
        pass
    import torch

    class DropPath(torch.nn.Module):
        def __init__(self, drop_prob=None):
            super().__init__()

        def forward(self, x):
            return x

    timm, models = types.ModuleType("timm"), types.ModuleType("timm.models")
    layers, registry = types.ModuleType("timm.models.layers"), types.ModuleType("timm.models.registry")
    layers.DropPath = DropPath
    layers.to_2tuple = lambda x: tuple(x) if isinstance(x, (tuple, list)) else (x, x)
    layers.trunc_normal_ = torch.nn.init.trunc_normal_
    registry.register_model = lambda fn: fn
    timm.models, models.layers, models.registry = models, layers, registry
    sys.modules.update({"timm": timm, "timm.models": models, "timm.models.layers": layers,
                        "timm.models.registry": registry})


def _require() -> None:
    if not (REF / "mobile_sam" / "modeling" / "tiny_vit_sam.py").is_file():
        raise ImportError(f"MobileSAM reference not found: copy its mobile_sam package into {REF}")
    _timm_shim()


def package():
    """``mobile_sam`` itself (predictor and mask generator need torchvision)."""
    _require()
    sys.path.insert(0, str(REF))
    return importlib.import_module("mobile_sam")


def modeling():
    """Only ``mobile_sam.modeling`` (torch alone), imported as the top-level package ``modeling``."""
    _require()
    sys.path.insert(0, str(REF / "mobile_sam"))
    return importlib.import_module("modeling")
