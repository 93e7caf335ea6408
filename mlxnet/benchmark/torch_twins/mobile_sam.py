"""MobileSAM's own PyTorch modules (github ChaoningZhang/MobileSAM), the SAM-tiny baseline.

Found as an installed ``mobile_sam`` package (``pip install git+https://github.com/ChaoningZhang/MobileSAM``)
or a copy of that package in a folder. Only its ``modeling`` subpackage is imported: the package's
``__init__`` pulls in the predictor and mask generator, which need torchvision. MobileSAM imports
timm for helpers that do nothing at inference (DropPath at rate 0, to_2tuple, an init function, a
registry decorator); where timm cannot be imported, a minimal stand-in takes its module names in
this process.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any


def _timm_stand_in() -> None:
    try:
        import timm.models.layers  # noqa: F401
        import timm.models.registry  # noqa: F401
        return
    except Exception:  # noqa: BLE001 - missing, or broken against this torch
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


def package_dir(copy: Path | None = None) -> Path:
    """The ``mobile_sam`` package folder: inside ``copy`` if given, else the installed one."""
    if copy is not None:
        found = Path(copy) / "mobile_sam"
    else:
        spec = importlib.util.find_spec("mobile_sam")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("MobileSAM is not installed "
                              "(pip install git+https://github.com/ChaoningZhang/MobileSAM)")
        found = Path(spec.submodule_search_locations[0])
    if not (found / "modeling" / "tiny_vit_sam.py").is_file():
        raise ImportError(f"no MobileSAM package at {found}")
    return found


def modeling(copy: Path | None = None) -> Any:
    """``mobile_sam.modeling`` alone (torch only), imported as the top-level package ``modeling``."""
    folder = package_dir(copy)
    _timm_stand_in()
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    return importlib.import_module("modeling")


def package(copy: Path | None = None) -> Any:
    """``mobile_sam`` itself (its predictor and mask generator need torchvision)."""
    folder = package_dir(copy)
    _timm_stand_in()
    if str(folder.parent) not in sys.path:
        sys.path.insert(0, str(folder.parent))
    return importlib.import_module("mobile_sam")
