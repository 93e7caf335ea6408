"""Layers (mlx.nn.Module) whose compute goes through mlxnet's op registry."""
from .layers import GELU, Conv2d, LayerNorm, SiLU
from .norm import FrozenBatchNorm2d, LayerNorm2d, fuse_conv_bn
from . import pooling
from .pooling import *  # noqa: F401,F403
from .conv import ConvTranspose1d, ConvTranspose2d

__all__ = ["Conv2d", "GELU", "LayerNorm", "SiLU", "LayerNorm2d", "FrozenBatchNorm2d", "fuse_conv_bn"]
__all__ += pooling.__all__
__all__ += ["ConvTranspose1d", "ConvTranspose2d"]
