"""What the golden scripts share: ultralytics kept offline (its settings in a scratch folder,
no downloads), the repository root, and mlxnet/weights/seeded.py loaded by file path, so that
the scripts run where ultralytics is installed and mlxnet need not be."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

os.environ.setdefault("YOLO_CONFIG_DIR", "/tmp/ultralytics-config")
os.environ.setdefault("YOLO_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("seeded", ROOT / "mlxnet/weights/seeded.py")
seeded = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(seeded)


def load_seeded(model, seed: int, bn_gain: float, head_gain: float):
    """Give an ultralytics model seeded_yolo_state weights for every float tensor (in place)."""
    import torch

    shapes = [(k, tuple(v.shape)) for k, v in model.state_dict().items() if v.dtype.is_floating_point]
    weights = seeded.seeded_yolo_state(shapes, seed, bn_gain, head_gain)
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=False)
    assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing), (missing, unexpected)
    return model


def seeded_task_model(cfg: str, seed: int, bn_gain: float, head_gain: float):
    """ultralytics' model for ``cfg``'s task (a yaml name: detect, segment or pose), seeded
    (:func:`load_seeded`), in eval mode."""
    from ultralytics.nn.tasks import DetectionModel, PoseModel, SegmentationModel, guess_model_task, yaml_model_load

    task = guess_model_task(yaml_model_load(cfg))
    model = {"segment": SegmentationModel, "pose": PoseModel}.get(task, DetectionModel)(cfg, verbose=False)
    return load_seeded(model, seed, bn_gain, head_gain).eval()
