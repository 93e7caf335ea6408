"""MobileSAM's image encoder: TinyViT-5M at 1024×1024 (NHWC throughout).

Architecture (Wu et al. 2022, as adapted by MobileSAM's ``tiny_vit_sam.py``): a two-conv stem
(stride 4), one stage of MBConv blocks, three stages of windowed self-attention blocks whose
attention logits get a learned bias per relative offset (LeViT-style), patch merging between
stages, and a neck (1×1 conv, LayerNorm2d, 3×3 conv, LayerNorm2d) to 256 channels. Module and
parameter names follow the PyTorch checkpoint (``layers.1.blocks.0.attn.attention_biases``...).
"""
from __future__ import annotations

import itertools
from typing import Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlxnet.errors import MlxnetError
from mlxnet import ops
from mlxnet.nn import GELU, Conv2d, LayerNorm, compiled_for_inference, fuse_conv_bn, handoff, recompile


class Conv2dBN(nn.Module):
    """Conv (no bias) + BatchNorm, TinyViT's ``Conv2d_BN`` (keys ``c.weight``, ``bn.*``); after
    :meth:`fuse`, one biased conv."""

    def __init__(self, cin: int, cout: int, ks: int = 1, stride: int = 1, pad: int = 0,
                 groups: int = 1) -> None:
        super().__init__()
        self.c = Conv2d(cin, cout, ks, stride, pad, groups=groups, bias=False)
        self.bn = nn.BatchNorm(cout)

    def __call__(self, x: mx.array) -> mx.array:
        x = self.c(x)
        return self.bn(x) if "bn" in self else x

    def fuse(self) -> None:
        """Fold the BatchNorm's statistics into the conv's weight and bias (inference only).
        Unfolded, an inference BatchNorm is four elementwise passes over the conv's output;
        MBConv's are 256 channels at 256×256 (67 MB each), on a CPU one core's work apiece."""
        if "bn" in self:
            self.c = fuse_conv_bn(self.c, self.bn)
            del self["bn"]


class PatchEmbed(nn.Module):
    def __init__(self, in_chans: int, embed_dim: int) -> None:
        super().__init__()
        self.seq = [Conv2dBN(in_chans, embed_dim // 2, 3, 2, 1), GELU(),
                    Conv2dBN(embed_dim // 2, embed_dim, 3, 2, 1)]

    def __call__(self, x: mx.array) -> mx.array:
        for layer in self.seq:
            x = layer(x)
        return x


class MBConv(nn.Module):
    """Inverted residual: 1×1 expand, 3×3 depthwise, 1×1 project, residual, GELU."""

    def __init__(self, dim: int, expand_ratio: float) -> None:
        super().__init__()
        hidden = int(dim * expand_ratio)
        self.conv1 = Conv2dBN(dim, hidden)
        self.conv2 = Conv2dBN(hidden, hidden, 3, 1, 1, groups=hidden)
        self.conv3 = Conv2dBN(hidden, dim)

    def __call__(self, x: mx.array) -> mx.array:
        y = ops.gelu(self.conv1(x))
        y = ops.gelu(self.conv2(y))
        return ops.gelu(self.conv3(y) + x)


class PatchMerging(nn.Module):
    def __init__(self, dim: int, out_dim: int) -> None:
        super().__init__()
        self.conv1 = Conv2dBN(dim, out_dim)
        # MobileSAM keeps the last stage at 64×64: its merge into 320 (448, 576) channels has stride 1.
        stride = 1 if out_dim in (320, 448, 576) else 2
        self.conv2 = Conv2dBN(out_dim, out_dim, 3, stride, 1, groups=out_dim)
        self.conv3 = Conv2dBN(out_dim, out_dim)

    def __call__(self, x: mx.array) -> mx.array:
        x = ops.gelu(self.conv1(x))
        x = ops.gelu(self.conv2(x))
        return self.conv3(x)


def relative_offset_index(window: int) -> np.ndarray:
    """(N, N) index of each query/key pair's |Δrow|, |Δcol| offset, numbered in first-seen order."""
    points = list(itertools.product(range(window), range(window)))
    offsets: dict[tuple[int, int], int] = {}
    idxs = []
    for p1 in points:
        for p2 in points:
            off = (abs(p1[0] - p2[0]), abs(p1[1] - p2[1]))
            idxs.append(offsets.setdefault(off, len(offsets)))
    return np.array(idxs, dtype=np.int32).reshape(len(points), len(points))


class Attention(nn.Module):
    """Multi-head self-attention over one window, plus a learned bias per relative offset."""

    def __init__(self, dim: int, key_dim: int, num_heads: int, window: int) -> None:
        super().__init__()
        self.num_heads, self.key_dim = num_heads, key_dim
        self.scale = key_dim ** -0.5
        self.norm = LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * key_dim * num_heads)
        self.proj = nn.Linear(key_dim * num_heads, dim)
        idx = relative_offset_index(window)
        self.attention_biases = mx.zeros((num_heads, int(idx.max()) + 1))
        self._bias_idxs = mx.array(idx)  # leading underscore: a constant, not a parameter

    def __call__(self, x: mx.array) -> mx.array:
        b, n, _ = x.shape
        qkv = self.qkv(self.norm(x)).reshape(b, n, self.num_heads, 3 * self.key_dim)
        # Channels are grouped per head as (q, k, v), as in the checkpoint.
        q, k, v = mx.split(qkv.transpose(0, 2, 1, 3), 3, axis=-1)
        bias = self.attention_biases[:, self._bias_idxs].astype(x.dtype)[None]
        out = ops.scaled_dot_product_attention(q, k, v, bias, scale=self.scale)
        return self.proj(out.transpose(0, 2, 1, 3).reshape(b, n, -1))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def __call__(self, x: mx.array) -> mx.array:
        return self.fc2(ops.gelu(self.fc1(self.norm(x))))


class TinyViTBlock(nn.Module):
    """Windowed attention (zero-padded to whole windows), depthwise 3×3 conv, MLP."""

    def __init__(self, dim: int, num_heads: int, window: int, mlp_ratio: float = 4.0,
                 local_conv_size: int = 3) -> None:
        super().__init__()
        self.window = window
        self.attn = Attention(dim, dim // num_heads, num_heads, window)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.local_conv = Conv2dBN(dim, dim, local_conv_size, 1, local_conv_size // 2, groups=dim)

    def _windowed_attention(self, x: mx.array) -> mx.array:
        b, h, w, c = x.shape
        if h == w == self.window:
            return self.attn(x.reshape(b, h * w, c)).reshape(b, h, w, c)
        # windows of the map zero-padded to whole windows; the padding is cropped again
        return ops.window_merge(self.attn(ops.window_partition(x, self.window)), self.window, h, w)

    def __call__(self, x: mx.array) -> mx.array:
        x = x + self._windowed_attention(x)
        x = self.local_conv(x)
        return x + self.mlp(x)


class ConvLayer(nn.Module):
    def __init__(self, dim: int, depth: int, out_dim: int, expand_ratio: float) -> None:
        super().__init__()
        self.blocks = [MBConv(dim, expand_ratio) for _ in range(depth)]
        self.downsample = PatchMerging(dim, out_dim)

    def __call__(self, x: mx.array) -> mx.array:
        for blk in self.blocks:
            x = blk(x)
        return self.downsample(x)


class BasicLayer(nn.Module):
    def __init__(self, dim: int, depth: int, num_heads: int, window: int, out_dim: int | None,
                 mlp_ratio: float = 4.0) -> None:
        super().__init__()
        self.blocks = [TinyViTBlock(dim, num_heads, window, mlp_ratio) for _ in range(depth)]
        if out_dim is not None:
            self.downsample = PatchMerging(dim, out_dim)

    def __call__(self, x: mx.array) -> mx.array:
        for blk in self.blocks:
            x = blk(x)
        return self.downsample(x) if "downsample" in self else x


class TinyViT(nn.Module):
    """TinyViT image encoder with SAM's neck: (B, S, S, 3) normalised → (B, S/16, S/16, 256)."""

    def __init__(self, img_size: int = 1024, in_chans: int = 3,
                 embed_dims: Sequence[int] = (64, 128, 160, 320), depths: Sequence[int] = (2, 2, 6, 2),
                 num_heads: Sequence[int] = (2, 4, 5, 10), window_sizes: Sequence[int] = (7, 7, 14, 7),
                 mlp_ratio: float = 4.0, mbconv_expand_ratio: float = 4.0, out_chans: int = 256) -> None:
        super().__init__()
        self.img_size = img_size
        self.patch_embed = PatchEmbed(in_chans, embed_dims[0])
        n = len(depths)
        self.layers: list[nn.Module] = [ConvLayer(embed_dims[0], depths[0], embed_dims[1], mbconv_expand_ratio)]
        for i in range(1, n):
            out_dim = embed_dims[i + 1] if i < n - 1 else None
            self.layers.append(BasicLayer(embed_dims[i], depths[i], num_heads[i], window_sizes[i],
                                          out_dim, mlp_ratio))
        self.neck = [Conv2d(embed_dims[-1], out_chans, 1, bias=False), LayerNorm(out_chans, eps=1e-6),
                     Conv2d(out_chans, out_chans, 3, padding=1, bias=False), LayerNorm(out_chans, eps=1e-6)]

    def fuse(self) -> "TinyViT":
        """Fold every BatchNorm into its conv, for inference (the weights then no longer hold
        BatchNorm statistics: fine-tune an unfused model)."""
        for _, module in self.named_modules():
            if isinstance(module, Conv2dBN):
                module.fuse()
        recompile(self)  # compiled stages traced before read the BatchNorm layers
        return self

    def __call__(self, x: mx.array, return_stages: bool = False) -> mx.array | list[mx.array]:
        if x.ndim != 4 or x.shape[-1] != 3:
            raise MlxnetError(f"TinyViT: expected a (B, H, W, 3) NHWC image batch, got shape {tuple(x.shape)}")
        if x.shape[1] % 16 or x.shape[2] % 16:
            raise MlxnetError(f"TinyViT: height and width must be multiples of 16, got {x.shape[1]}x{x.shape[2]}")
        stages = []
        for i in range(len(self.layers)):  # one compiled stage per layer (mlxnet.nn.compiled)
            x = handoff(self._layer(x, i))
            stages.append(x)
        x = self._neck(x)
        return stages + [x] if return_stages else x

    @compiled_for_inference(reads=lambda self, i: [self.patch_embed, self.layers[0]] if i == 0 else [self.layers[i]])
    def _layer(self, x: mx.array, i: int) -> mx.array:
        """Layer ``i``, the patch embedding first."""
        return self.layers[i](self.patch_embed(x) if i == 0 else x)

    @compiled_for_inference(reads=lambda self: self.neck)
    def _neck(self, x: mx.array) -> mx.array:
        for layer in self.neck:
            x = layer(x)
        return x
