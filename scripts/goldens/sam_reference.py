"""MobileSAM's PyTorch reference for the SAM-tiny goldens (not part of mlxnet).

Expects a copy of github ChaoningZhang/MobileSAM's ``mobile_sam`` package in ``.ref-sam/`` (git-ignored,
never committed); the loading itself is mlxnet.benchmark.torch_twins.mobile_sam's.
"""
from __future__ import annotations

from pathlib import Path

from mlxnet.benchmark.torch_twins import mobile_sam

REF = Path(__file__).resolve().parents[2] / ".ref-sam"


def package():
    """``mobile_sam`` itself (predictor and mask generator need torchvision)."""
    return mobile_sam.package(REF)


def modeling():
    """Only ``mobile_sam.modeling`` (torch alone), imported as the top-level package ``modeling``."""
    return mobile_sam.modeling(REF)
