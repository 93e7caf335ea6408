"""big-lama's generator in plain PyTorch, for benchmarks where the reference code is absent.

The same modules and state-dict keys as advimman/lama's ``FFCResNetGenerator`` configured by
big-lama.yaml (no LFU, no gating, no SE): scripts/goldens/golden_lama.py checks that this module,
given the reference's state dict (strict load), returns the reference's output bit for bit.
Depends on torch only (the reference also imports kornia, pytorch_lightning, cv2).
"""
from __future__ import annotations

import torch
import torch.nn as nn


class FourierUnit(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv_layer = nn.Conv2d(2 * c, 2 * c, 1, bias=False)
        self.bn = nn.BatchNorm2d(2 * c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        f = torch.fft.rfftn(x, dim=(-2, -1), norm="ortho")
        f = torch.stack((f.real, f.imag), dim=-1).permute(0, 1, 4, 2, 3).reshape(n, -1, h, f.shape[-1])
        f = torch.relu(self.bn(self.conv_layer(f)))
        f = f.view(n, -1, 2, h, f.shape[-1]).permute(0, 1, 3, 4, 2)
        return torch.fft.irfftn(torch.complex(f[..., 0], f[..., 1]), s=(h, w), dim=(-2, -1), norm="ortho")


class SpectralTransform(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(cin, cout // 2, 1, bias=False), nn.BatchNorm2d(cout // 2), nn.ReLU())
        self.fu = FourierUnit(cout // 2)
        self.conv2 = nn.Conv2d(cout // 2, cout, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        return self.conv2(x + self.fu(x))


class FFC(nn.Module):
    def __init__(self, cin, cout, k, r_in, r_out, stride=1, padding=0) -> None:
        super().__init__()
        in_g, out_g = int(cin * r_in), int(cout * r_out)
        in_l, out_l = cin - in_g, cout - out_g
        conv = lambda a, b: nn.Conv2d(a, b, k, stride, padding, bias=False, padding_mode="reflect")  # noqa: E731
        self.convl2l = conv(in_l, out_l) if in_l and out_l else None
        self.convl2g = conv(in_l, out_g) if in_l and out_g else None
        self.convg2l = conv(in_g, out_l) if in_g and out_l else None
        self.convg2g = SpectralTransform(in_g, out_g) if in_g and out_g else None

    def forward(self, x):
        x_l, x_g = x if isinstance(x, tuple) else (x, None)

        def path(m, v):
            return 0 if m is None or v is None else m(v)
        return path(self.convl2l, x_l) + path(self.convg2l, x_g), path(self.convl2g, x_l) + path(self.convg2g, x_g)


class FFC_BN_ACT(nn.Module):
    def __init__(self, cin, cout, k, r_in, r_out, stride=1, padding=0) -> None:
        super().__init__()
        self.ffc = FFC(cin, cout, k, r_in, r_out, stride, padding)
        out_g = int(cout * r_out)
        self.bn_l = nn.BatchNorm2d(cout - out_g) if r_out != 1 else None
        self.bn_g = nn.BatchNorm2d(out_g) if r_out != 0 else None

    def forward(self, x):
        x_l, x_g = self.ffc(x)
        x_l = torch.relu(self.bn_l(x_l)) if self.bn_l is not None else x_l
        x_g = torch.relu(self.bn_g(x_g)) if self.bn_g is not None else x_g
        return x_l, x_g


class FFCResnetBlock(nn.Module):
    def __init__(self, dim: int, ratio: float = 0.75) -> None:
        super().__init__()
        self.conv1 = FFC_BN_ACT(dim, dim, 3, ratio, ratio, padding=1)
        self.conv2 = FFC_BN_ACT(dim, dim, 3, ratio, ratio, padding=1)

    def forward(self, x):
        y_l, y_g = self.conv2(self.conv1(x))
        return x[0] + y_l, x[1] + y_g


class Concat(nn.Module):
    def forward(self, x):
        return x[0] if not torch.is_tensor(x[1]) else torch.cat(x, dim=1)


def big_lama(n_blocks: int = 18) -> nn.Sequential:
    layers = [nn.ReflectionPad2d(3), FFC_BN_ACT(4, 64, 7, 0, 0)]
    layers += [FFC_BN_ACT(64 * 2 ** i, 128 * 2 ** i, 3, 0, 0.75 if i == 2 else 0, 2, 1) for i in range(3)]
    layers += [FFCResnetBlock(512) for _ in range(n_blocks)] + [Concat()]
    for c in (512, 256, 128):
        layers += [nn.ConvTranspose2d(c, c // 2, 3, 2, 1, output_padding=1), nn.BatchNorm2d(c // 2), nn.ReLU()]
    layers += [nn.ReflectionPad2d(3), nn.Conv2d(64, 3, 7), nn.Sigmoid()]
    return nn.Sequential(*layers)


class Generator(nn.Module):
    """Holds the Sequential as ``model`` so state-dict keys read ``model.N...`` as the reference's."""

    def __init__(self, n_blocks: int = 18) -> None:
        super().__init__()
        self.model = big_lama(n_blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)
