"""`mlxnet convert WEIGHTS out.pt`: a YOLOv8 of mlxnet's as an ultralytics checkpoint, loaded by
ultralytics' own YOLO() and giving the same head outputs. Needs ultralytics (and the torchvision
matching its torch), which the default test environment does not install (see the module
docstring of scripts/goldens/golden_detection_loss.py); run it where ultralytics imports:
python -m pytest tests/test_ultralytics_export.py"""
from __future__ import annotations

import os

import mlx.core as mx
import numpy as np
import pytest

ultralytics = pytest.importorskip("ultralytics", reason="needs ultralytics (pip install ultralytics)")


def test_a_trained_checkpoint_loads_in_ultralytics_with_the_same_outputs(tmp_path, monkeypatch):
    import torch
    from mlx.utils import tree_flatten

    from mlxnet.models.yolo import YOLOv8
    from mlxnet.weights import save_converted
    from mlxnet.weights.random_weights import random_init
    from mlxnet.weights.ultralytics_export import write_ultralytics_checkpoint

    monkeypatch.setenv("YOLO_OFFLINE", "1")
    net = random_init(YOLOv8("n", 3))
    src = tmp_path / "mine.safetensors"
    save_converted(src, dict(tree_flatten(net.parameters())), "yolov8n", {"nc": 3}, ("a", "b", "c"), source="test")
    dst = write_ultralytics_checkpoint(src, tmp_path / "mine.pt")
    assert oct(os.stat(dst).st_mode & 0o777) != "0o600"
    from ultralytics import YOLO

    model = YOLO(str(dst))
    assert model.names == {0: "a", 1: "b", 2: "c"} and model.task == "detect"
    x = np.random.default_rng(0).uniform(0, 1, (1, 96, 128, 3)).astype(np.float32)
    theirs = model.model.float().eval()(torch.from_numpy(x).permute(0, 3, 1, 2))[0].detach().numpy()
    ours = np.array(net(mx.array(x))).transpose(0, 2, 1)
    # the .pt holds float16 weights, as ultralytics saves them
    np.testing.assert_allclose(theirs[:, 4:], ours[:, 4:], atol=2e-2)
    np.testing.assert_allclose(theirs[:, :4], ours[:, :4], atol=0.5)
