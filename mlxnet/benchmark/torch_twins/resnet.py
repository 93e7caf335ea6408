"""torchvision's ResNets in plain PyTorch, for ``mlxnet bench`` where torchvision cannot be imported
(PyPI's torchvision must match torch's version exactly)."""
from __future__ import annotations

# torchvision's ResNets: (bottleneck blocks?, blocks per stage)
LAYOUT = {"resnet18": (False, (2, 2, 2, 2)), "resnet34": (False, (3, 4, 6, 3)),
          "resnet50": (True, (3, 4, 6, 3)), "resnet101": (True, (3, 4, 23, 3)),
          "resnet152": (True, (3, 8, 36, 3))}


def resnet(name: str):
    """ResNet ``name`` (torchvision's architecture) built from torch.nn alone."""
    import torch.nn as tnn

    bottleneck, blocks = LAYOUT[name]

    class Block(tnn.Module):
        def __init__(self, cin, planes, stride):
            super().__init__()
            exp = 4 if bottleneck else 1
            if bottleneck:
                self.body = tnn.Sequential(
                    tnn.Conv2d(cin, planes, 1, bias=False), tnn.BatchNorm2d(planes), tnn.ReLU(),
                    tnn.Conv2d(planes, planes, 3, stride, 1, bias=False), tnn.BatchNorm2d(planes), tnn.ReLU(),
                    tnn.Conv2d(planes, planes * exp, 1, bias=False), tnn.BatchNorm2d(planes * exp))
            else:
                self.body = tnn.Sequential(
                    tnn.Conv2d(cin, planes, 3, stride, 1, bias=False), tnn.BatchNorm2d(planes), tnn.ReLU(),
                    tnn.Conv2d(planes, planes, 3, 1, 1, bias=False), tnn.BatchNorm2d(planes))
            self.short = (tnn.Sequential(tnn.Conv2d(cin, planes * exp, 1, stride, bias=False),
                                         tnn.BatchNorm2d(planes * exp))
                          if stride != 1 or cin != planes * exp else tnn.Identity())
            self.out = planes * exp

        def forward(self, x):
            return (self.body(x) + self.short(x)).relu()

    layers, cin = [tnn.Conv2d(3, 64, 7, 2, 3, bias=False), tnn.BatchNorm2d(64), tnn.ReLU(),
                   tnn.MaxPool2d(3, 2, 1)], 64
    for i, (planes, n) in enumerate(zip((64, 128, 256, 512), blocks)):
        for j in range(n):
            b = Block(cin, planes, 2 if i > 0 and j == 0 else 1)
            layers.append(b)
            cin = b.out
    layers += [tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(cin, 1000)]
    return tnn.Sequential(*layers)
