"""Layers (mlx.nn.Module) whose compute goes through mlxnet's op registry."""
from .layers import LayerNorm

__all__ = ["LayerNorm"]
