"""YOLOv8's fused detection network in plain PyTorch, the PyTorch baseline of
``mlxnet bench`` where ultralytics cannot be imported (it needs a torchvision matching torch).

Same layers, widths, depths and head decode as ultralytics' DetectionModel after ``fuse()``
(convs with bias + SiLU); parameter names follow ultralytics' ``model.<i>...`` keys, so weights
converted back from mlxnet load into it. ``python -m mlxnet.benchmark.torch_twins.yolo`` checks it against
mlxnet's YOLOv8 on shared random weights.
"""
from __future__ import annotations

import math

import torch
import torch.nn as tnn

SCALES = {"n": (0.33, 0.25, 1024), "s": (0.33, 0.50, 1024), "m": (0.67, 0.75, 768),
          "l": (1.00, 1.00, 512), "x": (1.00, 1.25, 512)}


class Conv(tnn.Module):
    def __init__(self, c1, c2, k=1, s=1):
        super().__init__()
        self.conv = tnn.Conv2d(c1, c2, k, s, k // 2, bias=True)

    def forward(self, x):
        return tnn.functional.silu(self.conv(x))


class Bottleneck(tnn.Module):
    def __init__(self, c1, c2, shortcut):
        super().__init__()
        self.cv1, self.cv2, self.add = Conv(c1, c2, 3), Conv(c2, c2, 3), shortcut and c1 == c2

    def forward(self, x):
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(tnn.Module):
    def __init__(self, c1, c2, n=1, shortcut=False):
        super().__init__()
        self.c = c2 // 2
        self.cv1, self.cv2 = Conv(c1, 2 * self.c), Conv((2 + n) * self.c, c2)
        self.m = tnn.ModuleList(Bottleneck(self.c, self.c, shortcut) for _ in range(n))

    def forward(self, x):
        y = list(self.cv1(x).chunk(2, 1))
        for m in self.m:
            y.append(m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class SPPF(tnn.Module):
    def __init__(self, c1, c2):
        super().__init__()
        self.cv1, self.cv2 = Conv(c1, c1 // 2), Conv(c1 // 2 * 4, c2)

    def forward(self, x):
        y = [self.cv1(x)]
        for _ in range(3):
            y.append(tnn.functional.max_pool2d(y[-1], 5, 1, 2))
        return self.cv2(torch.cat(y, 1))


class Detect(tnn.Module):
    def __init__(self, nc, ch):
        super().__init__()
        c2, c3 = max(16, ch[0] // 4, 64), max(ch[0], min(nc, 100))
        self.cv2 = tnn.ModuleList(tnn.Sequential(Conv(x, c2, 3), Conv(c2, c2, 3), tnn.Conv2d(c2, 64, 1)) for x in ch)
        self.cv3 = tnn.ModuleList(tnn.Sequential(Conv(x, c3, 3), Conv(c3, c3, 3), tnn.Conv2d(c3, nc, 1)) for x in ch)
        self.register_buffer("bins", torch.arange(16, dtype=torch.float32))

    def forward(self, feats):
        n = feats[0].shape[0]
        box = torch.cat([b(x).flatten(2) for b, x in zip(self.cv2, feats)], 2)  # (N, 64, A)
        cls = torch.cat([c(x).flatten(2) for c, x in zip(self.cv3, feats)], 2)
        dist = (box.view(n, 4, 16, -1).softmax(2) * self.bins[None, None, :, None]).sum(2)
        pts, strides = [], []
        for x, s in zip(feats, (8, 16, 32)):
            h, w = x.shape[2:]
            sy, sx = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing="ij")
            pts.append(torch.stack([sx, sy], -1).view(-1, 2))
            strides.append(torch.full((h * w,), float(s)))
        anchors, stride = torch.cat(pts).T[None].to(x), torch.cat(strides).to(x)
        x1y1, x2y2 = anchors - dist[:, :2], anchors + dist[:, 2:]
        return torch.cat([torch.cat([(x1y1 + x2y2) / 2, x2y2 - x1y1], 1) * stride, cls.sigmoid()], 1)


class YOLOv8(tnn.Module):
    def __init__(self, scale="n", nc=80):
        super().__init__()
        depth, width, mc = SCALES[scale]
        c1, c2, c3, c4, c5 = (math.ceil(min(c, mc) * width / 8) * 8 for c in (64, 128, 256, 512, 1024))
        n3, n6 = (max(round(n * depth), 1) for n in (3, 6))
        self.model = tnn.ModuleList([
            Conv(3, c1, 3, 2), Conv(c1, c2, 3, 2), C2f(c2, c2, n3, True), Conv(c2, c3, 3, 2),
            C2f(c3, c3, n6, True), Conv(c3, c4, 3, 2), C2f(c4, c4, n6, True), Conv(c4, c5, 3, 2),
            C2f(c5, c5, n3, True), SPPF(c5, c5), tnn.Upsample(scale_factor=2), tnn.Identity(),
            C2f(c5 + c4, c4, n3), tnn.Upsample(scale_factor=2), tnn.Identity(), C2f(c4 + c3, c3, n3),
            Conv(c3, c3, 3, 2), tnn.Identity(), C2f(c3 + c4, c4, n3), Conv(c4, c4, 3, 2), tnn.Identity(),
            C2f(c4 + c5, c5, n3), Detect(nc, (c3, c4, c5))])

    def forward(self, x):
        m = self.model
        for i in range(4):
            x = m[i](x)
        p3 = m[4](x)
        p4 = m[6](m[5](p3))
        p5 = m[9](m[8](m[7](p4)))
        h12 = m[12](torch.cat([m[10](p5), p4], 1))
        o3 = m[15](torch.cat([m[13](h12), p3], 1))
        o4 = m[18](torch.cat([m[16](o3), h12], 1))
        o5 = m[21](torch.cat([m[19](o4), p5], 1))
        return m[22]([o3, o4, o5])


if __name__ == "__main__":
    import mlxnet  # noqa: F401
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten

    from mlxnet import families

    net = families.family_of("yolov8n").build("yolov8n").fuse()
    tnet = YOLOv8("n").eval()
    params = dict(tree_flatten(net.parameters()))
    state = {}
    for k in tnet.state_dict():
        a = np.arange(16, dtype=np.float32) if k == "model.22.bins" else np.array(params[k])
        state[k] = torch.from_numpy(a.transpose(0, 3, 1, 2).copy() if a.ndim == 4 else a)
    tnet.load_state_dict(state)
    x = np.random.default_rng(0).uniform(size=(1, 96, 128, 3)).astype(np.float32)
    want = np.array(net(mx.array(x)))
    got = tnet(torch.from_numpy(x.transpose(0, 3, 1, 2))).detach().numpy().transpose(0, 2, 1)
    print("max abs difference vs mlxnet:", float(np.abs(want - got).max()), "of", float(np.abs(want).max()))
