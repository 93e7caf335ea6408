"""Weights I/O: layouts (PyTorch → MLX), safetensors, hub downloads, safe checkpoint reading."""
from .layout import from_torch_layout, to_torch_layout

__all__ = ["from_torch_layout", "to_torch_layout"]
