"""The goldens the default tests compare with, made again by ultralytics itself: the committed
fixtures are what ultralytics 8.4 gives today. Needs ultralytics (and the torchvision matching
its torch), which the default test environment does not install; .ci/run runs this file in a
second environment that has them."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ultralytics", reason="needs ultralytics (pip install ultralytics)")

from testutil import golden_script  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_detection_loss_golden_is_ultralytics_today(tmp_path, monkeypatch):
    from safetensors.numpy import load_file

    monkeypatch.setenv("YOLO_OFFLINE", "1")
    golden_script("golden_detection_loss").main(str(tmp_path))
    fresh = load_file(str(tmp_path / "detection_loss_golden.safetensors"))
    kept = load_file(str(ROOT / "tests/fixtures/train/detection_loss_golden.safetensors"))
    assert fresh.keys() == kept.keys()
    for key in kept:
        np.testing.assert_allclose(fresh[key], kept[key], rtol=1e-9, atol=1e-12, err_msg=key)


def test_augmentation_statistics_are_ultralytics_today(tmp_path, monkeypatch):
    monkeypatch.setenv("YOLO_OFFLINE", "1")
    golden_script("golden_augment_stats").main(tmp_path / "stats.json")
    fresh = json.loads((tmp_path / "stats.json").read_text())
    kept = json.loads((ROOT / "tests/fixtures/train/augment_stats.json").read_text())
    assert fresh == kept
