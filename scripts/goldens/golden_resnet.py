"""Golden outputs for the ResNet port, from torchvision's reference implementation.

Runs where torchvision imports:  python scripts/goldens/golden_resnet.py OUTDIR
Weights come from mlxnet/weights/seeded.py (same seed in the tests), so the fixture holds only
the input and the reference logits. Also writes ImageNet-1k class names from torchvision's metadata.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torchvision
from safetensors.numpy import save_file

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("seeded", ROOT / "mlxnet/weights/seeded.py")
seeded = importlib.util.module_from_spec(spec)
spec.loader.exec_module(seeded)

DEPTHS = ["resnet18", "resnet34", "resnet50", "resnet101", "resnet152"]
SEED = 1234


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    x = np.random.default_rng(7).standard_normal((2, 3, 64, 64)).astype(np.float32)
    tensors = {"input_nchw": x}
    for name in DEPTHS:
        model = getattr(torchvision.models, name)().eval()
        sd = model.state_dict()
        shapes = [(k, tuple(v.shape)) for k, v in sd.items() if v.dtype.is_floating_point]
        weights = seeded.seeded_state_dict(shapes, SEED)
        model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=False)
        with torch.no_grad():
            logits = model(torch.from_numpy(x)).numpy()
        tensors[f"{name}.logits"] = logits
        print(name, logits.shape, float(np.abs(logits).max()))
    save_file(tensors, str(out / "resnet_golden.safetensors"))
    meta = torchvision.models.ResNet50_Weights.IMAGENET1K_V2.meta["categories"]
    (out / "imagenet_classes.json").write_text(json.dumps(meta))
    print("torch", torch.__version__, "torchvision", torchvision.__version__, "classes", len(meta))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
