"""Golden outputs for custom-trained checkpoints, from the reference implementations.

    python scripts/goldens/golden_custom.py OUTDIR [--save-checkpoints]

Runs where ultralytics and torchvision import (here: a private folder on PYTHONPATH holding
ultralytics 8.4 and torchvision 0.28 for torch 2.13's CPU build). Weights come from
mlxnet/weights/seeded.py (seed 1234), as in the tests, so the fixture holds only inputs and
outputs. Writes OUTDIR/custom_golden.safetensors and OUTDIR/custom_golden.json:

  yolo.input              (1, 3, 64, 96) float32 in [0, 1]
  yolo.head               a two-class YOLOv8s (``DetectionModel("yolov8s.yaml", nc=2)``,
                          names cat/dog) with its weights rounded to float16, as ``yolo train``
                          saves them, run in float32: (1, 4 + 2, 126) decoded boxes + scores
  yolo.head_fused         the same after ultralytics' ``fuse()`` (BN folded, as its predictor runs)
  resnet.input            (2, 3, 64, 64)
  resnet.logits           torchvision ``resnet18(num_classes=10)``: a fine-tuned classifier

With --save-checkpoints it also writes the checkpoints themselves, saved the way the upstream
tools save them (yolo_custom.pt: the ``strip_optimizer`` layout of a finished ``yolo train``;
resnet18_10.pth: ``torch.save(model.state_dict())``), to check the tests' hand-built pickles
against the real thing.
"""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from golden_yolo import GAINS, SEED, seeded  # noqa: E402  (the same seeded weights and gains; sets YOLO_* env)

NAMES = {0: "cat", 1: "dog"}
RESNET_CLASSES = 10


def main(out: Path, save_checkpoints: bool) -> None:
    import torch
    import torchvision
    import ultralytics
    from safetensors.numpy import save_file
    from ultralytics.nn.tasks import DetectionModel

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    x = np.random.default_rng(7).random((1, 3, 64, 96)).astype(np.float32)
    t: dict[str, np.ndarray] = {"yolo.input": x}

    model = DetectionModel("yolov8s.yaml", nc=len(NAMES), verbose=False)
    model.names = dict(NAMES)
    shapes = [(k, tuple(v.shape)) for k, v in model.state_dict().items() if v.dtype.is_floating_point]
    state = seeded.seeded_yolo_state(shapes, SEED, *GAINS)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=False)
    model.eval()
    saved = copy.deepcopy(model).half()  # what `yolo train` writes: the EMA model in float16
    if save_checkpoints:
        torch.save({"date": "2026-11-23", "version": ultralytics.__version__, "license": "AGPL-3.0",
                    "epoch": -1, "best_fitness": None, "model": saved, "ema": None, "updates": None,
                    "optimizer": None, "train_args": {"model": "yolov8s.yaml", "data": "two.yaml"},
                    "train_metrics": {}, "train_results": {}}, out / "yolo_custom.pt")
    run = copy.deepcopy(saved).float().eval()
    with torch.no_grad():
        t["yolo.head"] = run(torch.from_numpy(x))[0].numpy()
        t["yolo.head_fused"] = run.fuse(verbose=False)(torch.from_numpy(x))[0].numpy()
    print("yolo", t["yolo.head"].shape, "scale", model.yaml.get("scale"), "names", model.names)

    xr = np.random.default_rng(7).standard_normal((2, 3, 64, 64)).astype(np.float32)
    net = torchvision.models.resnet18(num_classes=RESNET_CLASSES).eval()
    shapes = [(k, tuple(v.shape)) for k, v in net.state_dict().items() if v.dtype.is_floating_point]
    net.load_state_dict({k: torch.from_numpy(v) for k, v in seeded.seeded_state_dict(shapes, SEED).items()},
                        strict=False)
    if save_checkpoints:
        torch.save(net.state_dict(), out / "resnet18_10.pth")
    with torch.no_grad():
        t["resnet.input"], t["resnet.logits"] = xr, net(torch.from_numpy(xr)).numpy()
    print("resnet", t["resnet.logits"].shape)

    save_file(t, str(out / "custom_golden.safetensors"))
    (out / "custom_golden.json").write_text(json.dumps({
        "seed": SEED, "gains": GAINS, "names": [NAMES[i] for i in range(len(NAMES))], "yolo_scale": "s",
        "resnet": "resnet18", "resnet_classes": RESNET_CLASSES, "ultralytics": ultralytics.__version__,
        "torchvision": torchvision.__version__, "torch": torch.__version__}, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), "--save-checkpoints" in sys.argv[2:])
