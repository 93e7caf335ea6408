"""ResNet v1.5 (He et al. 2016; torchvision's variant: stride on the 3×3 of the bottleneck).

NHWC throughout. Parameter names equal torchvision's / timm's state-dict keys
(``conv1``, ``bn1``, ``layer1.0.conv1``, ``layer1.0.downsample.0``, ``fc``), so the official
checkpoints map by the identity table plus layout conversion.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlxnet import families
from mlxnet.errors import MlxnetError
from mlxnet.image import ImageInput, as_rgb, as_rgb_images, center_crop, draw_boxes, resize_pil
from mlxnet.nn import AdaptiveAvgPool2d, Conv2d, MaxPool2d, compiled_for_inference, fuse_conv_bn
from mlxnet.weights import (Checkpoint, count_mismatch, Description, FoldBN, WeightSpec, describe_from_metadata, load_variant,
                            random_init, register_spec)

DEFAULT = "resnet50"  # the variant of a source that names none: no --model, and 'random' weights
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def conv3x3(cin: int, cout: int, stride: int = 1) -> Conv2d:
    return Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


def conv1x1(cin: int, cout: int, stride: int = 1) -> Conv2d:
    return Conv2d(cin, cout, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = conv3x3(cin, planes, stride)
        self.bn1 = nn.BatchNorm(planes)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm(planes)
        self.downsample = _shortcut(cin, planes * self.expansion, stride)

    def __call__(self, x: mx.array) -> mx.array:
        out = conv_bn(self.conv1, self.bn1, x)
        return conv_bn(self.conv2, self.bn2, out, residual=_apply(self.downsample, x))

    def fuse(self) -> None:
        _fuse_pairs(self, [("conv1", "bn1"), ("conv2", "bn2")])
        _fuse_shortcut(self.downsample)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = conv1x1(cin, planes)
        self.bn1 = nn.BatchNorm(planes)
        self.conv2 = conv3x3(planes, planes, stride)  # v1.5: the stride sits here
        self.bn2 = nn.BatchNorm(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm(planes * self.expansion)
        self.downsample = _shortcut(cin, planes * self.expansion, stride)

    def __call__(self, x: mx.array) -> mx.array:
        out = conv_bn(self.conv1, self.bn1, x)
        out = conv_bn(self.conv2, self.bn2, out)
        return conv_bn(self.conv3, self.bn3, out, residual=_apply(self.downsample, x))

    def fuse(self) -> None:
        _fuse_pairs(self, [("conv1", "bn1"), ("conv2", "bn2"), ("conv3", "bn3")])
        _fuse_shortcut(self.downsample)


def conv_bn(conv: Conv2d, bn: nn.Module, x: mx.array, residual: mx.array | None = None) -> mx.array:
    """ReLU(BN(conv(x)) + residual). Once the BatchNorm is folded into the conv (an Identity
    left in its place), one conv call whose epilogue (bias, residual, ReLU) is one pass."""
    if isinstance(bn, nn.Identity):
        return conv(x, activation="relu", residual=residual)
    y = bn(conv(x))
    return nn.relu(y if residual is None else y + residual)


def _shortcut(cin: int, cout: int, stride: int) -> list[nn.Module]:
    """Projection (1×1 conv + BN) when the shape changes, identity (empty list) otherwise."""
    if stride == 1 and cin == cout:
        return []
    return [conv1x1(cin, cout, stride), nn.BatchNorm(cout)]


def _fuse_shortcut(layers: list[nn.Module]) -> None:
    if len(layers) == 2 and isinstance(layers[1], nn.BatchNorm):
        layers[:] = [fuse_conv_bn(*layers)]


def _apply(layers: list[nn.Module], x: mx.array) -> mx.array:
    for layer in layers:
        x = layer(x)
    return x


def _fuse_pairs(module: nn.Module, pairs: Sequence[tuple[str, str]]) -> None:
    """Fold each named BatchNorm into the conv before it, in place; the BatchNorm becomes an
    identity, so the forward and the conv's key stay as they are."""
    for conv, bn in pairs:
        if isinstance(module[bn], nn.BatchNorm):
            module[conv] = fuse_conv_bn(module[conv], module[bn])
            module[bn] = nn.Identity()


@dataclass(frozen=True)
class ResNetConfig:
    block: type
    layers: tuple[int, int, int, int]


CONFIGS = {
    "resnet18": ResNetConfig(BasicBlock, (2, 2, 2, 2)),
    "resnet34": ResNetConfig(BasicBlock, (3, 4, 6, 3)),
    "resnet50": ResNetConfig(Bottleneck, (3, 4, 6, 3)),
    "resnet101": ResNetConfig(Bottleneck, (3, 4, 23, 3)),
    "resnet152": ResNetConfig(Bottleneck, (3, 8, 36, 3)),
}


class ResNet(nn.Module):
    def __init__(self, config: ResNetConfig, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm(64)
        self.maxpool = MaxPool2d(3, stride=2, padding=1)
        cin = 64
        stages = []
        for i, (planes, blocks) in enumerate(zip((64, 128, 256, 512), config.layers)):
            stage = []
            for j in range(blocks):
                stride = 2 if (i > 0 and j == 0) else 1
                stage.append(config.block(cin, planes, stride))
                cin = planes * config.block.expansion
            stages.append(stage)
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def features(self, x: mx.array) -> mx.array:
        """NHWC image batch → pooled features (N, C)."""
        x = self.maxpool(conv_bn(self.conv1, self.bn1, x))
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            x = _apply(stage, x)
        return self.avgpool(x).reshape(x.shape[0], -1)

    @compiled_for_inference
    def __call__(self, x: mx.array) -> mx.array:
        """NHWC image batch (normalised) → logits (N, num_classes)."""
        return self.fc(self.features(x))

    def fuse(self) -> "ResNet":
        """Fold every BatchNorm into its conv, for inference (as YOLOv8's and TinyViT's
        ``fuse``): each conv then carries a bias and no normalisation runs per forward. The
        BatchNorms become identities; a fused model is not for training."""
        _fuse_pairs(self, [("conv1", "bn1")])
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            for block in stage:
                block.fuse()
        return self


def resnet(name: str, num_classes: int = 1000) -> ResNet:
    if name not in CONFIGS:
        raise MlxnetError(f"unknown ResNet {name!r}; choose one of {', '.join(CONFIGS)}")
    return ResNet(CONFIGS[name], num_classes)


def resnet18(num_classes: int = 1000) -> ResNet:
    return resnet("resnet18", num_classes)


def resnet34(num_classes: int = 1000) -> ResNet:
    return resnet("resnet34", num_classes)


def resnet50(num_classes: int = 1000) -> ResNet:
    return resnet("resnet50", num_classes)


def resnet101(num_classes: int = 1000) -> ResNet:
    return resnet("resnet101", num_classes)


def resnet152(num_classes: int = 1000) -> ResNet:
    return resnet("resnet152", num_classes)


# --- Weights -----------------------------------------------------------------------------------
# torchvision's checkpoints, as timm publishes them on the hub ("tv_in1k" = torchvision's V1
# weights, trained for resize 256 / crop 224). Key names are identical to ours.

def describe_checkpoint(ckpt: Checkpoint) -> Description:
    """Depth and class count of a ResNet checkpoint, from its tensors: blocks per stage and
    block type (a bottleneck has conv3) give the variant, the fc weight the class count (a
    fine-tuned torchvision model's ``num_classes``); names from mlxnet metadata."""
    shapes = ckpt.shapes()
    if "fc.weight" not in shapes or "conv1.weight" not in shapes:
        raise MlxnetError(f"{ckpt.path}: not a ResNet checkpoint (no conv1.weight / fc.weight; found "
                          f"{len(shapes)} tensors: {', '.join(list(shapes)[:3]) or 'none'}, ...)")
    blocks = tuple(len({k.split(".")[1] for k in shapes if k.startswith(f"layer{i}.")}) for i in range(1, 5))
    block = Bottleneck if "layer1.0.conv3.weight" in shapes else BasicBlock
    variant = next((name for name, c in CONFIGS.items() if (c.block, c.layers) == (block, blocks)), None)
    if variant is None:
        raise MlxnetError(f"{ckpt.path}: {block.__name__} stages of {blocks} blocks fit no ResNet "
                          f"({', '.join(f'{n} {c.layers}' for n, c in CONFIGS.items())})")
    return Description(variant, {"num_classes": shapes["fc.weight"][0]}, describe_from_metadata(ckpt).names)


for _name in CONFIGS:
    register_spec(WeightSpec(
        id=_name, repo=f"timm/{_name}.tv_in1k", filename="model.safetensors",
        keys=[(r"(.*)", r"\1")],
        drop=[r".*\.num_batches_tracked"],
        layouts=[(r"(.*\.)?(conv\d|downsample\.0)\.weight", "conv2d")],
        # conv1+bn1 (the stem's and each block's), conv2+bn2, conv3+bn3, downsample.0+downsample.1
        fold_bn=[FoldBN(r"((?:.*\.)?)conv(\d)", r"\1bn\2"), FoldBN(r"(.*\.downsample)\.0", r"\1.1")],
        build=lambda fold_bn=False, num_classes=1000, _n=_name: (resnet(_n, num_classes).fuse() if fold_bn
                                                                 else resnet(_n, num_classes)),
        describe=describe_checkpoint,
    ))


def load(weights: str = "resnet50", *, model: str | None = None,
         dtype: str | None = None) -> tuple[ResNet, tuple[str, ...] | None]:
    """(ResNet in eval mode, the class names its file carries or None) from an id ("resnet50":
    the hub) or a file; depth and class count come from the checkpoint, ``model`` must agree."""
    net, found = load_variant(weights, tuple(CONFIGS), model=model, dtype=dtype, default=DEFAULT)
    return net, found.names


def from_pretrained(name_or_path: str = "resnet50", *, model: str | None = None,
                    dtype: str | None = None) -> ResNet:
    """A ResNet in eval mode with weights from an id ("resnet50": the hub) or a file (a
    torchvision or timm checkpoint, fine-tuned ones included, or a file from ``mlxnet convert``
    or ``save_weights``)."""
    return load(name_or_path, model=model, dtype=dtype)[0]


# --- ImageNet pre/post-processing (torchvision's IMAGENET1K_V1 preset) -------------------------

def preprocess_pixels(image: np.ndarray, resize: int = 256, crop: int = 224) -> np.ndarray:
    """uint8 HWC RGB → normalised (crop, crop, 3) float32 NumPy, as torchvision's
    Resize+CenterCrop+Normalize: host work only, so reader threads can do it."""
    h, w = image.shape[:2]
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = resize, int(resize * long / short)
    size = (new_short, new_long) if w <= h else (new_long, new_short)
    x = center_crop(resize_pil(image, size), crop).astype(np.float32) / 255.0
    return (x - np.array(IMAGENET_MEAN, np.float32)) / np.array(IMAGENET_STD, np.float32)


def preprocess(image: np.ndarray, resize: int = 256, crop: int = 224) -> mx.array:
    """uint8 HWC RGB → normalised (1, crop, crop, 3) float32, as torchvision's Resize+CenterCrop."""
    return mx.array(preprocess_pixels(image, resize, crop)[None])


@lru_cache(maxsize=1)
def imagenet_classes() -> tuple[str, ...]:
    text = resources.files("mlxnet").joinpath("data/imagenet_classes.txt").read_text()
    return tuple(line for line in text.splitlines() if line)


def top_k(logits: mx.array, k: int = 5, names: Sequence[str] | None = None) -> list[list[tuple[str, float]]]:
    """Softmax and the k most probable labels for each row (``names``: ImageNet's by default
    for 1000 classes, else the class index)."""
    probs = np.array(mx.softmax(logits.astype(mx.float32), axis=-1))
    if names is None and probs.shape[-1] == 1000:
        names = imagenet_classes()
    out = []
    for row in probs:
        idx = np.argsort(-row)[:k]
        out.append([(names[i] if names is not None else str(i), float(row[i])) for i in idx])
    return out


def classify(model: ResNet, images: Sequence[ImageInput], k: int = 5) -> list[list[tuple[str, float]]]:
    """The top ``k`` (label, probability) of each image (anything :func:`mlxnet.image.as_rgb` takes)."""
    pixels = [as_rgb(image, f"resnet.classify, image {i}") for i, image in enumerate(images)]
    batch = mx.concatenate([preprocess(p) for p in pixels])
    return top_k(model(batch), k)


class ResNetFamily(families.ModelFamily):
    name = "resnet"
    variants = tuple(CONFIGS)
    default_size = 224

    def build(self, variant: str) -> ResNet:
        net = random_init(resnet(variant))  # no fixed parameters: every tensor is learned
        net.eval()
        return net

    def from_pretrained(self, source: str, variant: str | None = None, dtype: str | None = None) -> ResNet:
        return from_pretrained(source, model=variant, dtype=dtype)

    def example_inputs(self, variant: str, size: int) -> list[mx.array]:
        return [mx.random.normal((1, size, size, 3), key=mx.random.key(0))]

    def image_inputs(self, variant: str, image: np.ndarray, size: int) -> list[mx.array]:
        return [preprocess(image)]

    task = "classify"

    def predictor(self, weights: str | None, variant: str | None, dtype: str | None = None,
                  names: Sequence[str] | None = None) -> "Classifier":
        net, own = load(weights or variant or "resnet50", model=variant, dtype=dtype)
        return Classifier(net.fuse(), names if names is not None else own)

    def prepare(self, image: np.ndarray) -> np.ndarray:  # type: ignore[override]
        return Classifier.prepare(image)


@dataclass
class Classification:
    """One image's most probable labels, best first: (label, probability)."""

    top: list[tuple[str, float]]

    def to_dict(self) -> dict:
        return {"top": [{"label": label, "probability": p} for label, p in self.top]}

    def render(self, image: np.ndarray) -> np.ndarray:
        """A copy of ``image`` framed and captioned with its best label and probability."""
        h, w = image.shape[:2]
        label, p = self.top[0]
        return draw_boxes(image, np.array([[0, 0, w - 1, h - 1]], np.float32), [f"{label} {p:.0%}"])

    def summary(self) -> str:
        return "\n".join(f"  {p:7.2%}  {label}" for label, p in self.top)


class Classifier:
    """A ResNet with ImageNet pre- and post-processing and its class names (ImageNet's for a
    1000-class model without names of its own)."""

    def __init__(self, net: ResNet, names: Sequence[str] | None = None) -> None:
        classes = net.fc.weight.shape[0]
        if names is not None and len(names) != classes:
            raise MlxnetError(count_mismatch(names, classes))
        self.net, self.names = net, tuple(names) if names is not None else None

    @property
    def classes(self) -> int:
        """How many classes the model tells apart."""
        return int(self.net.fc.weight.shape[0])

    @property
    def label_names(self) -> tuple[str, ...] | None:
        """The names its predictions carry: its own, else ImageNet's for 1000 classes, else None
        (labels are then the class indices)."""
        return self.names or (imagenet_classes() if self.classes == 1000 else None)

    def predict(self, images: ImageInput | Sequence[ImageInput],
                k: int = 5) -> Classification | list[Classification]:
        """The top ``k`` labels of one image (a path, a PIL image, or an (H, W, 3) NumPy / MLX
        array: see :func:`mlxnet.image.as_rgb`), or a list for a list, which runs as one batch."""
        pixels, single = as_rgb_images(images, "Classifier.predict")
        results = self.predict_prepared([preprocess_pixels(p) for p in pixels], k)
        return results[0] if single else results

    @staticmethod
    def prepare(image: ImageInput) -> np.ndarray:
        """The host half of :meth:`predict` for one image: its normalised 224² crop."""
        return preprocess_pixels(as_rgb(image, "Classifier.predict"))

    def logits(self, items: Sequence[np.ndarray]) -> np.ndarray:
        """The raw (B, classes) float32 logits of images already through :meth:`prepare`, on the
        host: what an evaluation ranks its own way."""
        return np.array(self.net(mx.array(np.stack(items))).astype(mx.float32))  # the forward runs here

    def predict_prepared(self, items: Sequence[np.ndarray], k: int = 5) -> list[Classification]:
        """:meth:`predict` for images already through :meth:`prepare`: one batch, one forward."""
        batch = mx.array(np.stack(items))
        return [Classification(top) for top in top_k(self.net(batch), k, self.names)]


families.register(ResNetFamily())
