"""Layers (mlx.nn.Module) whose compute goes through mlxnet's op registry."""
from .layers import GELU, Conv2d, LayerNorm, Sigmoid, SiLU
from .norm import FrozenBatchNorm2d, LayerNorm2d, batch_norm_act, batch_norm_relu, fuse_conv_bn
from . import pooling
from .pooling import *  # noqa: F401,F403
from .conv import ConvTranspose1d, ConvTranspose2d

__all__ = ["Conv2d", "GELU", "LayerNorm", "Sigmoid", "SiLU", "LayerNorm2d", "FrozenBatchNorm2d", "batch_norm_act", "batch_norm_relu", "fuse_conv_bn"]
__all__ += pooling.__all__
__all__ += ["ConvTranspose1d", "ConvTranspose2d"]
from .compiled import compiled_for_inference, evaluated, handoff, recompile

__all__ += ["compiled_for_inference", "evaluated", "handoff", "recompile"]
