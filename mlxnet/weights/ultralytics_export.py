"""The way back to ultralytics: a YOLOv8 checkpoint of mlxnet's as an ultralytics ``.pt``.

ultralytics loads a ``.pt`` by unpickling a whole ``DetectionModel`` object, so the file can
only be made where ultralytics (and PyTorch) are installed: the model is built by ultralytics
from its own yaml for the variant and class count, given the weights (PyTorch layouts) and the
class names, and saved as its trainer saves a finished run (float16, no optimizer).
"""
from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

import numpy as np
from mlx.utils import tree_flatten

from ..errors import MlxnetError
from ..image import atomic_write, check_output_path


def write_ultralytics_checkpoint(src: str | os.PathLike, dst: str | os.PathLike, *, force: bool = False) -> Path:
    """Write ``src`` (any YOLOv8 weights mlxnet loads) as the ultralytics checkpoint ``dst``."""
    from ..models.yolo import YOLO

    src_path = Path(src)
    dst = check_output_path(dst, [src_path] if src_path.is_file() else [], force=force, kind="file")
    try:
        import torch
        import ultralytics
        from ultralytics.nn.tasks import DetectionModel
    except ImportError as e:
        raise MlxnetError(f"{dst}: writing an ultralytics .pt needs PyTorch and ultralytics installed "
                          f"(pip install ultralytics): {e}") from None
    yolo = YOLO.from_pretrained(src, dtype="float32", fuse=False)
    net = yolo.net
    model = DetectionModel(f"{net.family}{net.scale}.yaml", nc=net.nc, verbose=False)
    state = {}
    for key, value in tree_flatten(net.parameters()):
        array = np.array(value, np.float32)
        state[key] = torch.from_numpy(np.ascontiguousarray(array.transpose(0, 3, 1, 2) if array.ndim == 4 else array))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("num_batches_tracked")]
    if missing or unexpected:
        raise MlxnetError(f"{src}: does not fit ultralytics' {net.family}{net.scale} (missing {missing[:3]}, "
                          f"unexpected {unexpected[:3]})")
    model.names = dict(enumerate(yolo.names))
    model.args = {"task": "detect", "imgsz": 640}
    checkpoint = {"date": datetime.now().isoformat(), "version": ultralytics.__version__, "epoch": -1,
                  "best_fitness": None, "model": model.half().eval(), "ema": None, "updates": None,
                  "optimizer": None, "train_args": {"task": "detect", "model": f"{net.family}{net.scale}.yaml"},
                  "train_metrics": {}, "train_results": {}}
    return atomic_write(dst, lambda tmp: torch.save(checkpoint, tmp))
