"""Weights I/O: layouts (PyTorch → MLX), safetensors, hub downloads, safe checkpoint reading.

Model families describe their checkpoints with a :class:`WeightSpec` (key table, layouts, hub
file) and :func:`register_spec` it; :func:`load_model` (the model a checkpoint describes), :func:`load_pretrained` and
``mlxnet convert`` do the rest.
"""
from .checkpoint import (FORMAT, Checkpoint, Description, describe_from_metadata, names_of, open_checkpoint,
                         count_mismatch, read_labels)
from .convert import (convert_checkpoint, convert_state_dict, describe, fold_batchnorm, load_model, load_pretrained,
                      load_variant, model_weights, save_converted)
from .hub import resolve_weights
from .layout import LayoutKind, from_torch_layout, to_torch_layout
from .loading import check_weights, load_into
from .random_weights import RANDOM, fixed_parameters, is_random, random_init
from .safetensors_io import load_safetensors, read_safetensors_header, save_safetensors
from .spec import FoldBN, WeightSpec, get_spec, list_specs, register_spec
from .torch_pickle import Record, find_state_dict, read_torch_checkpoint

__all__ = [
    "RANDOM", "fixed_parameters", "is_random", "random_init",
    "Checkpoint", "Description", "describe", "describe_from_metadata", "load_model", "load_variant", "model_weights", "names_of", "open_checkpoint",
    "read_labels", "count_mismatch", "save_converted", "FORMAT", "FoldBN", "LayoutKind", "Record", "WeightSpec", "check_weights", "convert_checkpoint",
    "convert_state_dict", "find_state_dict", "fold_batchnorm", "from_torch_layout", "get_spec",
    "list_specs", "load_into", "load_pretrained", "load_safetensors",
    "read_safetensors_header", "read_torch_checkpoint", "register_spec", "resolve_weights",
    "save_safetensors", "to_torch_layout",
]
