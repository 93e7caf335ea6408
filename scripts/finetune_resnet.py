"""Fine-tune a ResNet for a few steps on a small synthetic dataset; the loss must fall.

    python scripts/finetune_resnet.py [--model resnet18] [--steps 30] [--weights ID_OR_PATH]

The data are 4 classes of 64×64 images (oriented stripes plus noise), so the run needs
nothing downloaded; gradients flow through mlxnet's pooling VJPs (max-pool in the stem,
adaptive average pool in the head).
"""
from __future__ import annotations

import argparse

import mlxnet  # noqa: F401  (binds OpenBLAS before mlx.core on Linux)
import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

from mlxnet.models import resnet


def stripes(n: int, size: int, rng: np.random.Generator) -> tuple[mx.array, mx.array]:
    labels = rng.integers(0, 4, n)
    yy, xx = np.mgrid[0:size, 0:size] / size
    angle = labels[:, None, None] * np.pi / 4
    phase = rng.uniform(0, 2 * np.pi, (n, 1, 1))
    img = np.sin(2 * np.pi * 4 * (xx * np.cos(angle) + yy * np.sin(angle)) + phase)
    img = img[..., None].repeat(3, -1) + 0.3 * rng.standard_normal((n, size, size, 3))
    return mx.array(img.astype(np.float32)), mx.array(labels)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18", choices=list(resnet.CONFIGS))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.02)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    model = resnet.resnet(a.model, num_classes=4)
    model.train()
    opt = optim.SGD(learning_rate=a.lr, momentum=0.9)

    def loss_fn(m, x, y):
        return nn.losses.cross_entropy(m(x), y, reduction="mean")

    step = nn.value_and_grad(model, loss_fn)
    losses = []
    for i in range(a.steps):
        x, y = stripes(a.batch, 64, rng)
        loss, grads = step(model, x, y)
        opt.update(model, grads)
        mx.eval(model.parameters(), opt.state, loss)
        losses.append(float(loss))
        print(f"step {i:3d}  loss {losses[-1]:.4f}  backend {mlxnet.backend()}", flush=True)
    first, last = np.mean(losses[:5]), np.mean(losses[-5:])
    print(f"mean loss first 5 steps {first:.3f} → last 5 steps {last:.3f}")


if __name__ == "__main__":
    main()
