"""LaMa (Suvorov et al., WACV 2022): large-mask inpainting with Fast Fourier Convolutions.

The big-lama generator (``FFCResNetGenerator`` of github.com/advimman/lama, configured by
configs/training/big-lama.yaml), NHWC throughout:

    reflect-pad 3, 7×7 conv 4→64                         (model.0, model.1)
    3 × stride-2 3×3 conv 64→128→256→512                 (model.2-4; the last splits its output
                                                          into local 128 + global 384 channels)
    18 FFC ResNet blocks on (local, global)              (model.5-22)
        FFC: local←local 3×3 + local←global 3×3, global←local 3×3 + global←global spectral
        spectral: 1×1 conv → BN → ReLU → FourierUnit (rfft2 → 1×1 conv → BN → ReLU → irfft2),
                  residual, 1×1 conv
    concatenate local ⊕ global                           (model.23)
    3 × (transposed conv 3×3 stride 2, BN, ReLU)         (model.24-32)
    reflect-pad 3, 7×7 conv 64→3, sigmoid                (model.33-35)

All convolutions of the FFC blocks pad by reflection (the reference's ``padding_type``).
``LaMa.model`` mirrors the reference's ``nn.Sequential`` index for index, so checkpoint keys
(``generator.model.5.conv1.ffc.convg2g.fu.conv_layer.weight``) map by dropping the prefix.
Input: the masked image (RGB in [0, 1], holes zeroed) ⊕ the binary mask, H and W multiples
of 8; :meth:`LaMa.inpaint` does the reference's padding, masking, blending and cropping.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from mlxnet import families, ops
from mlxnet.errors import MlxnetError
from mlxnet.image import ImageInput, as_mask, as_rgb
from mlxnet.nn import (Conv2d, ConvTranspose2d, Sigmoid, batch_norm_relu, compiled_for_inference, evaluated,
                       fuse_conv_bn, handoff, recompile)
from mlxnet.ops.fft import irfft2_planar, rfft2_planar
from mlxnet.weights import (Checkpoint, Description, WeightSpec, describe_from_metadata, load_variant, random_init,
                            register_spec)
from mlxnet.dtypes import compute_dtype
from mlxnet.weights.fold import fold_conv_bn

# Variants: released generators of the LaMa family that share this architecture.
CONFIGS = {
    "lama": 18,          # big-lama (configs/training/big-lama.yaml)
    "lama-fourier": 9,   # lama-fourier (configs/training/generator/ffc_resnet_075.yaml)
}
RATIO_GLOBAL = 0.75      # resnet_conv_kwargs.ratio_gin/gout: share of channels in the global branch
MODULO = 8               # configs/prediction/default.yaml: dataset.pad_out_to_modulo
BLOCKS_PER_STAGE = 3     # resnet blocks per compiled stage of the forward (mlxnet.nn.compiled)
# Full-resolution activations (the stem's output: N·H·W·64 elements) from which the forward runs
# in finer stages, each evaluated before the next is built (:meth:`LaMa._stages`): 256 MiB is a
# 1024² image in float32. At 2048² this takes MLX's peak from 5.0 to 3.4 GiB, for the same result.
LARGE_STAGE_BYTES = 2**28

def reflect_pad(x: mx.array, p: int) -> mx.array:
    return ops.pad2d(x, (p, p, p, p), "reflect")


class Conv(nn.Module):
    """Conv2d with reflection padding (PyTorch's ``padding_mode='reflect'``); weight (O, K, K, I)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, padding: int = 0,
                 bias: bool = False) -> None:
        super().__init__()
        self.stride, self.padding = stride, padding
        self.weight = mx.zeros((cout, kernel, kernel, cin))
        if bias:
            self.bias = mx.zeros((cout,))

    def __call__(self, x: mx.array) -> mx.array:
        return self.padded(reflect_pad(x, self.padding))

    def padded(self, x: mx.array, *, bias: bool = True) -> mx.array:
        """The convolution of an input that is already reflect-padded by ``self.padding``;
        ``bias=False`` leaves the bias to the caller's epilogue."""
        y = ops.conv2d(x, self.weight.astype(x.dtype), stride=self.stride)
        return y + self.bias.astype(x.dtype) if bias and "bias" in self else y


class ReflectionPad2d(nn.Module):
    def __init__(self, p: int) -> None:
        super().__init__()
        self.p = p

    def __call__(self, x: mx.array) -> mx.array:
        return reflect_pad(x, self.p)


class FourierUnit(nn.Module):
    """rfft2 → 1×1 conv over (real, imag) channel pairs → BN → ReLU → irfft2 (norm 'ortho').

    Runs in float32 whatever the model's dtype, and keeps its weights in float32 (see
    :meth:`LaMa.set_dtype`): with the 'ortho' norm the zero-frequency term is the channel mean
    times sqrt(H·W), so a 2048² image (256² at this depth) scales it by 256 and activations in
    the hundreds leave float16's range (65504); half precision would also round away the
    small high-frequency terms summed over H·W pixels.
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv_layer = Conv2d(2 * channels, 2 * channels, 1, bias=False)
        self.bn = nn.BatchNorm(2 * channels)
        self.planar = False  # set by fuse(): conv_layer then reads and writes planes, BN folded in

    def __call__(self, x: mx.array) -> mx.array:
        n, h, w, c = x.shape
        # The spectrum comes as planes, (real of every channel, imaginary of every channel) per
        # frequency; the reference's channel 2c+0 is the real part of channel c and 2c+1 its
        # imaginary part (its stack(-1) + permute + view). So the conv's input channels are
        # read in plane order, and BN+ReLU writes its output back into planes.
        f = rfft2_planar(x, norm="ortho").reshape(n, h, -1, 2 * c)  # (n, h, w//2+1, 2c) planes
        if self.planar:
            f = nn.relu(self.conv_layer(f)).reshape(n, h, -1, 2, c)
        else:
            weight = self.conv_layer.weight.astype(mx.float32)  # (2c, 1, 1, 2c)
            f = ops.conv2d(f, _pairs_to_planes(weight).reshape(weight.shape))
            f = batch_norm_relu(self.bn, f, regroup=_pairs_to_planes)
        return irfft2_planar(f, s=(h, w), norm="ortho").astype(x.dtype)

    def fuse(self) -> None:
        """For inference: the BatchNorm folded into the conv, and the conv's weight and bias laid
        out for planes on both channel axes, once instead of at every forward."""
        if self.planar:
            return
        # float32 whatever the file held: the unit computes in float32 (see the class docstring)
        self.conv_layer.weight = self.conv_layer.weight.astype(mx.float32)
        fused = fuse_conv_bn(self.conv_layer, self.bn)
        o, _, _, i = fused.weight.shape  # (c_out re/im pairs, 1, 1, c_in re/im pairs) → planes on both
        planes = fused.weight.reshape(o // 2, 2, 1, 1, i // 2, 2).transpose(1, 0, 2, 3, 5, 4)
        fused.weight, fused.bias = planes.reshape(fused.weight.shape), _pairs_to_planes(fused.bias).reshape(-1)
        self.conv_layer = fused
        self.bn = nn.Identity()
        self.planar = True


def _pairs_to_planes(a: mx.array) -> mx.array:
    """The last axis, channels ordered (c, re/im), as (re/im, c): a view, (…, 2, C)."""
    return mx.swapaxes(a.reshape(*a.shape[:-1], -1, 2), -1, -2)


class SpectralTransform(nn.Module):
    """The global→global path: 1×1 conv → BN → ReLU, FourierUnit with a residual, 1×1 conv."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        half = cout // 2
        self.conv1 = [Conv2d(cin, half, 1, bias=False), nn.BatchNorm(half), nn.ReLU()]
        self.fu = FourierUnit(half)
        self.conv2 = Conv2d(half, cout, 1, bias=False)

    def __call__(self, x: mx.array, crop: int = 0) -> mx.array:
        """``x`` may come reflect-padded by ``crop`` (a fused LaMa's stream, see :meth:`LaMa.fuse`):
        the 1×1 conv then runs on the padded map and its output is cropped before the bias and
        ReLU, which read the crop in place (a 1×1 conv commutes with cropping; cropping its
        input would copy it)."""
        conv, bn, _ = self.conv1
        if crop:
            y = ops.conv2d(x, conv.weight)[:, crop:-crop, crop:-crop]
            y = nn.relu(y + conv.bias)
        else:
            y = batch_norm_relu(bn, conv(x))
        # In the FourierUnit's precision from here (the cast fuses into this pass, not a pass
        # of its own); the residual sum returns to the model's dtype for conv2.
        y = y.astype(mx.float32)
        return self.conv2((y + self.fu(y)).astype(x.dtype))

    def fuse(self) -> None:
        conv, bn, relu = self.conv1
        if isinstance(bn, nn.BatchNorm):
            self.conv1 = [fuse_conv_bn(conv, bn), nn.Identity(), relu]
        self.fu.fuse()


Stream = tuple[mx.array, "mx.array | None"]  # (local, global); global is None without a global part


class FFC(nn.Module):
    """Fast Fourier Convolution: four paths between the local and global channel groups."""

    def __init__(self, cin: int, cout: int, kernel: int, ratio_in: float, ratio_out: float,
                 stride: int = 1, padding: int = 0) -> None:
        super().__init__()
        in_g = int(cin * ratio_in)
        in_l = cin - in_g
        out_g = int(cout * ratio_out)
        out_l = cout - out_g
        if in_l and out_l:
            self.convl2l = Conv(in_l, out_l, kernel, stride, padding)
        if in_l and out_g:
            self.convl2g = Conv(in_l, out_g, kernel, stride, padding)
        if in_g and out_l:
            self.convg2l = Conv(in_g, out_l, kernel, stride, padding)
        if in_g and out_g:
            if stride != 1:
                raise MlxnetError("LaMa FFC: a strided spectral transform is not part of any LaMa generator")
            self.convg2g = SpectralTransform(in_g, out_g)
        self.padding = padding
        # Set by LaMa.fuse() where the layer before writes its output reflect-padded by
        # ``padding`` already: the inputs are then used as they come.
        self.takes_padded = False

    def __call__(self, x: Stream | mx.array) -> Stream:
        """(local, global): each the sum of the paths into that group."""
        (local, bias_l), (glob, bias_g) = self.paths(x)
        return _sum(local, bias_l), _sum(glob, bias_g)

    def paths(self, x: Stream | mx.array) -> tuple[tuple[list[mx.array], mx.array | None], ...]:
        """Per output group (local, global): the paths' outputs without their convolutions'
        biases, and those biases summed (None where no path has one), for an epilogue to add."""
        x_l, x_g = x if isinstance(x, tuple) else (x, None)
        if self.takes_padded:
            pad_l, pad_g = x_l, x_g
        else:  # the local input feeds two convolutions: it is padded once for both
            pad_l = reflect_pad(x_l, self.padding)
            pad_g = reflect_pad(x_g, self.padding) if x_g is not None and "convg2l" in self else None
        local = [(self.get("convl2l"), pad_l), (self.get("convg2l"), pad_g)]
        glob = [(self.get("convl2g"), pad_l)]
        outs = tuple(_conv_paths(p) for p in (local, glob))
        spectral = self.get("convg2g")
        if spectral is not None and x_g is not None:
            outs[1][0].append(spectral(x_g, crop=self.padding if self.takes_padded else 0))
        return outs

    def unpadded(self, x: Stream) -> Stream:
        """The stream this layer was given, without the padding it came with (views)."""
        if not self.takes_padded or not self.padding:
            return x
        p = self.padding
        return tuple(None if v is None else v[:, p:-p, p:-p] for v in x)


def _conv_paths(paths: list[tuple["Conv | None", mx.array | None]]) -> tuple[list[mx.array], mx.array | None]:
    """The present paths' convolutions without bias, and their biases summed."""
    present = [(conv, v) for conv, v in paths if conv is not None and v is not None]
    biases = [conv.bias.astype(v.dtype) for conv, v in present if "bias" in conv]
    bias = None if not biases else biases[0] if len(biases) == 1 else biases[0] + biases[1]
    return [conv.padded(v, bias=False) for conv, v in present], bias


def _sum(terms: list[mx.array], bias: mx.array | None) -> mx.array | None:
    """The paths' sum, where an absent path contributes nothing (the reference's Identity on 0)."""
    if not terms:
        return None
    total = terms[0] if bias is None else terms[0] + bias
    return total if len(terms) == 1 else total + terms[1]


class FFC_BN_ACT(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, ratio_in: float, ratio_out: float,
                 stride: int = 1, padding: int = 0) -> None:
        super().__init__()
        self.ffc = FFC(cin, cout, kernel, ratio_in, ratio_out, stride, padding)
        out_g = int(cout * ratio_out)
        if ratio_out != 1:
            self.bn_l = nn.BatchNorm(cout - out_g)
        if ratio_out != 0:
            self.bn_g = nn.BatchNorm(out_g)
        self.folded = False  # set by fuse(): the BatchNorms are in the convolutions
        # Set by LaMa.fuse() where the next FFC pads its input: the output is written padded.
        self.pad_output = 0

    def __call__(self, x: Stream | mx.array, skip: Stream | None = None) -> Stream:
        """ReLU(BN(FFC(x))) per group, plus ``skip`` (a resnet block's input) after the ReLU."""
        if self.folded:
            # each group's epilogue (bias, sum of paths, ReLU, skip, padding) is one pass
            skip = skip or (None, None)
            return tuple(self._epilogue(terms, bias, s) for (terms, bias), s in zip(self.ffc.paths(x), skip))
        x_l, x_g = self.ffc(x)
        x_l = batch_norm_relu(self.bn_l, x_l) if "bn_l" in self else x_l
        x_g = batch_norm_relu(self.bn_g, x_g) if "bn_g" in self else x_g
        if skip is not None:
            x_l, x_g = skip[0] + x_l, skip[1] + x_g
        return x_l, x_g

    def _epilogue(self, terms: list[mx.array], bias: mx.array | None, skip: mx.array | None) -> mx.array | None:
        if not terms:
            return None
        bias = mx.zeros(terms[0].shape[-1:], terms[0].dtype) if bias is None else bias
        p = self.pad_output
        return ops.bias_act_pad2d(terms[0], bias, terms[1] if len(terms) > 1 else None, skip,
                                  pads=(p, p, p, p), mode="reflect")

    def fuse(self) -> None:
        """For inference: each BatchNorm folded into the convolutions whose sum it normalises
        (BN(a + b) = s·a + s·b + shift): their weights scaled by its per-channel scale, its shift
        the first one's bias. The spectral transform folds its own BatchNorms."""
        ffc = self.ffc
        spectral = ffc.get("convg2g")
        for name, paths in (("bn_l", (ffc.get("convl2l"), ffc.get("convg2l"))),
                            ("bn_g", (ffc.get("convl2g"), spectral.conv2 if spectral is not None else None))):
            bn = self.get(name)
            if not isinstance(bn, nn.BatchNorm):
                continue
            zero = mx.zeros_like(bn.bias)
            for i, conv in enumerate(c for c in paths if c is not None):
                shift, mean = (bn.bias, bn.running_mean) if i == 0 else (zero, zero)
                weight, bias = fold_conv_bn(conv.weight, conv.get("bias"), bn.weight, shift, mean,
                                            bn.running_var, bn.eps)
                conv.weight = weight
                if i == 0 or "bias" in conv:
                    conv.bias = bias
            self[name] = nn.Identity()
        if spectral is not None:
            spectral.fuse()
        self.folded = True


class FFCResnetBlock(nn.Module):
    def __init__(self, dim: int, ratio: float) -> None:
        super().__init__()
        self.conv1 = FFC_BN_ACT(dim, dim, 3, ratio, ratio, padding=1)
        self.conv2 = FFC_BN_ACT(dim, dim, 3, ratio, ratio, padding=1)

    def __call__(self, x: Stream) -> Stream:
        return self.conv2(self.conv1(x), skip=self.conv1.ffc.unpadded(x))


class ConcatTuple(nn.Module):
    def __call__(self, x: Stream) -> mx.array:
        return x[0] if x[1] is None else mx.concatenate([x[0], x[1]], axis=-1)


class LaMa(nn.Module):
    """The FFC ResNet generator; ``model`` is the reference's Sequential, index for index."""

    def __init__(self, n_blocks: int = 18, ngf: int = 64, n_downsampling: int = 3,
                 input_nc: int = 4, output_nc: int = 3) -> None:
        super().__init__()
        self.n_blocks = n_blocks
        layers: list[nn.Module] = [ReflectionPad2d(3), FFC_BN_ACT(input_nc, ngf, 7, 0, 0)]
        for i in range(n_downsampling):
            ratio_out = RATIO_GLOBAL if i == n_downsampling - 1 else 0
            layers.append(FFC_BN_ACT(ngf * 2 ** i, ngf * 2 ** (i + 1), 3, 0, ratio_out, stride=2, padding=1))
        dim = ngf * 2 ** n_downsampling
        layers += [FFCResnetBlock(dim, RATIO_GLOBAL) for _ in range(n_blocks)]
        layers.append(ConcatTuple())
        for i in range(n_downsampling):  # three flat entries each, as in the reference
            c = ngf * 2 ** (n_downsampling - i)
            layers += [ConvTranspose2d(c, c // 2, kernel_size=3, stride=2, padding=1, output_padding=1),
                       nn.BatchNorm(c // 2), nn.ReLU()]
        layers += [ReflectionPad2d(3), Conv(ngf, output_nc, 7, bias=True), Sigmoid()]
        self.model = layers
        self.eval()

    def __call__(self, x: mx.array) -> mx.array:
        """(N, H, W, 4) masked image ⊕ mask, H and W multiples of 8 → (N, H, W, 3) in [0, 1]."""
        if x.ndim != 4 or x.shape[-1] != 4:
            raise MlxnetError(f"LaMa expects an (N, H, W, 4) masked image ⊕ mask, got shape {tuple(x.shape)}")
        if x.shape[1] % MODULO or x.shape[2] % MODULO:
            raise MlxnetError(f"LaMa expects H and W to be multiples of {MODULO}, got {x.shape[1]}×{x.shape[2]} "
                              "(LaMa.inpaint pads any size)")
        x = x.astype(self.dtype)
        stem = self.model[1].ffc.convl2l.weight.shape[0]
        large = x.size // x.shape[-1] * stem * x.dtype.size >= LARGE_STAGE_BYTES
        for lo, hi in self._stages(large):
            x = self._layers(x, lo, hi)
            x = evaluated(x) if large else handoff(x)
        return x

    def _stages(self, large: bool = False) -> list[tuple[int, int]]:
        """Bounds in ``model`` of the forward's stages (mlxnet.nn.compiled): the downsampling
        encoder, the resnet blocks a few at a time, the upsampling decoder. ``large``: also a
        stage boundary around each layer at full resolution and the first at half resolution
        (stem, first downsampling conv; last transposed conv, its BatchNorm + ReLU, the final
        padding), and one resnet block a stage (a GPU command buffer holds what its kernels read
        until it completes: three blocks' maps at 2048²), so that a stage's freed buffers are
        not counted with the next one's; the same layers compute the same values, in more stages."""
        end = next(i for i, m in enumerate(self.model) if isinstance(m, ConcatTuple))
        per_stage = 1 if large else BLOCKS_PER_STAGE
        bounds = {0, *range(end - self.n_blocks, end, per_stage), end, len(self.model)}
        if large:
            last = next(i for i in reversed(range(len(self.model))) if isinstance(self.model[i], ConvTranspose2d))
            bounds |= {2, 3, last, last + 1, last + 3, last + 4}  # pad+stem | conv | ... | convT | BN+ReLU | pad | conv
        bounds = sorted(bounds)
        return list(zip(bounds, bounds[1:]))

    @compiled_for_inference(reads=lambda self, lo, hi: self.model[lo:hi])
    def _layers(self, x: Stream | mx.array, lo: int, hi: int) -> Stream | mx.array:
        """``model[lo:hi]`` applied to ``x``."""
        i = lo
        while i < hi:
            layer = self.model[i]
            if isinstance(layer, nn.BatchNorm) and isinstance(self.model[i + 1], nn.ReLU):
                x = batch_norm_relu(layer, x)  # the upsampling BatchNorm + ReLU pairs, one pass
                i += 2
            else:
                x = layer(x)
                i += 1
        return x

    def fuse(self) -> "LaMa":
        """Fold the FFC blocks' BatchNorms into their convolutions for inference (the upsampling
        BatchNorms stay: each is one pass with its ReLU already) and lay the FourierUnits'
        weights out for planes once. Call it before :meth:`set_dtype`, so the folding happens
        in float32; a fused model is not for training.

        Each FFC layer whose output feeds another that reflect-pads its input then writes that
        output padded, in the pass of its epilogue, and the next one takes it as it is: the
        encoder's convolutions and the resnet blocks pass padded maps along, with no padding
        pass between them (a block's skip reads its input's interior in place)."""
        chain: list[FFC_BN_ACT | None] = []  # the FFC layers in forward order; None breaks a run
        for layer in self.model:
            if isinstance(layer, FFCResnetBlock):
                chain += [layer.conv1, layer.conv2]
            else:
                chain.append(layer if isinstance(layer, FFC_BN_ACT) else None)
        for module in chain:
            if module is not None:
                module.fuse()
        for before, after in zip(chain, chain[1:]):
            if before is not None and after is not None and after.ffc.padding:
                before.pad_output, after.ffc.takes_padded = after.ffc.padding, True
        recompile(self)  # compiled forwards traced before this read the old structure
        return self

    def set_dtype(self, dtype: mx.Dtype, predicate=None) -> None:
        """Cast floating parameters to ``dtype``, except the FourierUnits', which stay float32."""
        def cast(key: str, v: mx.array) -> bool:
            return ".fu." not in key and (predicate or (lambda t: mx.issubdtype(t, mx.floating)))(v.dtype)

        params = tree_flatten(self.parameters())
        self.update(tree_unflatten([(k, v.astype(dtype) if cast(k, v) else v) for k, v in params]))

    @property
    def dtype(self) -> mx.Dtype:
        return self.model[1].ffc.convl2l.weight.dtype

    # --- pre/post-processing as bin/predict.py --------------------------------------------------
    def inpaint(self, image: ImageInput, mask: ImageInput) -> np.ndarray:
        """Fill the masked region of one image.

        image: a path, a PIL image, or an (H, W, 3) RGB array, uint8 or float in [0, 1]
        (:func:`mlxnet.image.as_rgb`). mask: a path, a PIL image or an (H, W) array (bool or
        numbers); every non-zero pixel is filled, as the reference's ``mask > 0``
        (:func:`mlxnet.image.as_mask`).
        Returns (H, W, 3) uint8: ``clip(result * 255)`` truncated, as the reference writes it.
        """
        result = self.inpaint_float(image, mask)
        return np.clip(np.array(result) * 255, 0, 255).astype(np.uint8)

    def inpaint_float(self, image: ImageInput, mask: ImageInput) -> mx.array:
        """As :meth:`inpaint`, returning the float32 (H, W, 3) result in [0, 1] as an mx.array."""
        img, m = _prepare(image, mask)
        h, w = img.shape[:2]
        ph, pw = -h % MODULO, -w % MODULO
        # numpy's 'symmetric' (edge repeated), as the reference's pad_img_to_modulo
        img_p = ops.pad2d(img, (0, ph, 0, pw), "symmetric")
        m_p = ops.pad2d(m, (0, ph, 0, pw), "symmetric")
        x = mx.concatenate([img_p * (1 - m_p), m_p], axis=-1)[None]
        predicted = self(x)[0].astype(mx.float32)
        out = m_p * predicted + (1 - m_p) * img_p
        out = out[:h, :w]
        mx.eval(out)
        return out

    @classmethod
    def from_pretrained(cls, weights: str | os.PathLike = "lama", *, model: str | None = None,
                        dtype: str | mx.Dtype | None = None) -> "LaMa":
        """A generator with weights from an id ("lama": big-lama's checkpoint from the hub,
        "lama-fourier") or a file (the Lightning .ckpt, a generator state dict, or a file from
        ``mlxnet convert``). ``model`` names the variant of a file (default: from a converted
        file's metadata, else "lama"). ``dtype``: float32 (default), float16 or bfloat16."""
        net, _ = load_variant(weights, tuple(CONFIGS), model=model)
        net.fuse()
        target = compute_dtype(dtype)
        if target is not None and target != mx.float32:
            net.set_dtype(target)
        mx.eval(net.parameters())
        return net


# Smallest side inpaint accepts: padded to 16, the bottleneck is 2 pixels, which its 3×3 reflect-
# padded convs need (8 would leave 1; the reference fails there too).
MIN_SIDE = MODULO + 1


def _prepare(image: ImageInput, mask: ImageInput) -> tuple[mx.array, mx.array]:
    """(H, W, 3) float32 image in [0, 1] and (H, W, 1) binary float32 mask, checked."""
    img = as_rgb(image, "LaMa.inpaint image", dtype="float32")  # a float image keeps its precision
    msk = as_mask(mask, "LaMa.inpaint mask")
    if msk.shape != img.shape[:2]:
        raise MlxnetError(f"LaMa: mask is {msk.shape[1]}×{msk.shape[0]} but the image is "
                          f"{img.shape[1]}×{img.shape[0]} (width×height); resize the mask "
                          "(CLI: --resize-mask)")
    if min(img.shape[:2]) < MIN_SIDE:
        raise MlxnetError(f"LaMa: image {img.shape[1]}×{img.shape[0]} is too small; "
                          f"both sides must be at least {MIN_SIDE} pixels")
    return mx.array(img), mx.array(msk.astype(np.float32)[..., None])


# --- Weights -------------------------------------------------------------------------------------
# The Lightning checkpoint holds the whole training module: generator, discriminator, losses and
# evaluators. Only ``generator.*`` is kept; the other module families are dropped by name, so a
# key of any other family is still an error. A bare generator state dict ("model.N...") maps too.
_TRAINING_ONLY = r"(discriminator|adversarial_loss|val_evaluator|test_evaluator|extra_evaluators" \
                 r"|generator_average|loss_[a-z_]+)\..*"


def transposed_conv_indices(n_blocks: int, n_downsampling: int = 3) -> list[int]:
    """Indices of the upsampling ConvTranspose2d layers in ``LaMa.model``."""
    first = 3 + n_downsampling + n_blocks  # after pad, stem, downsampling, blocks, concat
    return [first + 3 * i for i in range(n_downsampling)]


def weight_spec(name: str) -> WeightSpec:
    convt = {f"model.{i}.weight" for i in transposed_conv_indices(CONFIGS[name])}

    def layouts(key: str, shape: tuple) -> str | None:
        if len(shape) != 4:
            return None
        return "conv_transpose2d" if key in convt else "conv2d"

    def build(fold_bn: bool = False) -> LaMa:
        if fold_bn:
            raise MlxnetError("LaMa: --fold-bn does not apply to LaMa files (an FFC's BatchNorm follows a sum of "
                              "convs); LaMa.from_pretrained folds them when it loads the file")
        return LaMa(CONFIGS[name])

    hub = {"lama": ("lllyasviel/Annotators", "lama.ckpt")}  # big-lama's best.ckpt (same SHA-256)
    repo, filename = hub.get(name, (None, None))
    return WeightSpec(
        id=name, repo=repo, filename=filename,
        keys=[(r"generator\.(model\..+)", r"\1"), (r"(model\..+)", r"\1")],
        drop=[r".*\.num_batches_tracked", _TRAINING_ONLY],
        layouts=layouts, checkpoint_key=None, build=build, describe=describe_checkpoint)


def describe_checkpoint(ckpt: Checkpoint) -> Description:
    """The variant of a LaMa checkpoint (Lightning .ckpt with ``generator.`` keys, a generator
    state dict, or an mlxnet file): the number of residual FFC blocks."""
    if ckpt.converted:  # its metadata names the variant (load_variant refuses another family's)
        return describe_from_metadata(ckpt)
    blocks = {m.group(1) for k in ckpt.tensors for m in [re.match(r"(?:generator\.)?model\.(\d+)\.conv1\.", k)] if m}
    variant = next((name for name, n in CONFIGS.items() if n == len(blocks)), None)
    if variant is None:
        raise MlxnetError(f"{ckpt.path}: a generator with {len(blocks)} residual blocks fits no LaMa variant "
                          f"({', '.join(f'{n}: {b}' for n, b in CONFIGS.items())})")
    return Description(variant)


for _name in CONFIGS:
    register_spec(weight_spec(_name))


__all__: Sequence[str] = ["CONFIGS", "LaMa", "FourierUnit", "weight_spec", "transposed_conv_indices"]


@dataclass
class Inpainting:
    """An image with its masked pixels filled: ``filled`` (H, W, 3) uint8 and the mask used."""

    filled: np.ndarray
    mask: np.ndarray

    def render(self, image: np.ndarray | None = None) -> np.ndarray:
        return self.filled

    def to_dict(self) -> dict:
        count = int((self.mask > 0).sum())
        return {"width": self.filled.shape[1], "height": self.filled.shape[0], "filled_pixels": count,
                "filled_fraction": round(count / self.mask.size, 6)}

    def summary(self) -> str:
        d = self.to_dict()
        return (f"filled {d['filled_pixels']} pixels ({d['filled_fraction']:.1%}) of "
                f"{d['width']}×{d['height']}")


class LaMaFamily(families.ModelFamily):
    name = "lama"
    variants = tuple(CONFIGS)
    default_size = 256
    # 18 residual FFC blocks on He-initialised weights grow until the sigmoid head saturates.
    calibrate_batchnorm = True

    def build(self, variant: str) -> LaMa:
        return random_init(LaMa(CONFIGS[variant]))  # no fixed parameters: every tensor is learned

    def from_pretrained(self, source: str, variant: str | None = None, dtype: str | None = None) -> LaMa:
        return LaMa.from_pretrained(source, model=variant, dtype=dtype or "float32")

    def example_inputs(self, variant: str, size: int) -> list[mx.array]:
        """A random image with a random hole, as the generator takes it: RGB with the hole
        zeroed, and the mask as a fourth channel."""
        side = max(8, size // 8 * 8)
        image = mx.random.uniform(shape=(1, side, side, 3), key=mx.random.key(0))
        mask = (mx.random.uniform(shape=(1, side, side, 1), key=mx.random.key(1)) > 0.7).astype(mx.float32)
        return [mx.concatenate([image * (1 - mask), mask], axis=-1)]

    task = "inpaint"

    def predictor(self, weights: str | None, variant: str | None, dtype: str | None = None) -> LaMa:
        return LaMa.from_pretrained(weights or variant or "lama", model=variant, dtype=dtype or "float32")

    def inpaint(self, model: LaMa, image: np.ndarray, mask: np.ndarray) -> Inpainting:
        return Inpainting(model.inpaint(image, mask), mask)


families.register(LaMaFamily())
