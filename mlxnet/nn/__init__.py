"""Layers (mlx.nn.Module) whose compute goes through mlxnet's op registry."""
from .layers import LayerNorm
from . import pooling
from .pooling import *  # noqa: F401,F403
from .conv import ConvTranspose1d, ConvTranspose2d

__all__ = ["LayerNorm"]
__all__ += pooling.__all__
__all__ += ["ConvTranspose1d", "ConvTranspose2d"]
