"""PyTorch checkpoint -> mlxnet weights: key table, layouts, optional BN folding and cast."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Mapping, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..errors import MlxnetError
from .fold import fold_conv_bn
from .hub import resolve_weights
from .layout import from_torch_layout
from .loading import check_weights, load_into
from .safetensors_io import (DTypeLike, as_dtype, cast_floating, is_safetensors, load_safetensors,
                             read_safetensors_header, save_safetensors)
from .spec import WeightSpec, get_spec
from .torch_pickle import find_state_dict, read_torch_checkpoint

FORMAT = "mlxnet"  # safetensors metadata "format" of converted files (upstream files say "pt")
_BN = ("weight", "bias", "running_mean", "running_var")


def read_checkpoint(path: str | os.PathLike, key: str | None = None) -> dict[str, mx.array]:
    """The flat state dict of a safetensors file or a PyTorch checkpoint (read safely), as MLX arrays."""
    path = Path(path)
    if not path.is_file():
        raise MlxnetError(f"checkpoint file not found: {path}")
    if is_safetensors(path):
        return load_safetensors(path)
    state = find_state_dict(read_torch_checkpoint(path), key, source=str(path))
    return {k: v if isinstance(v, mx.array) else mx.array(v) for k, v in state.items()}


def convert_state_dict(state: Mapping[str, mx.array], spec: WeightSpec | str, *, dtype: DTypeLike = None,
                       fold_bn: bool = False, source: str | None = None) -> dict[str, mx.array]:
    """Rename (spec.keys/drop), convert layouts, fold BN if asked, cast floats; if the spec can
    build its model, check every key and shape against it."""
    spec = get_spec(spec)
    names = spec.map_keys(list(state))
    out = {}
    for old, new in names.items():
        kind, groups = spec.layout_of(new, tuple(state[old].shape))
        out[new] = from_torch_layout(state[old], kind, groups)
    if fold_bn:
        out = fold_batchnorm(out, spec)
    out = cast_floating(out, dtype)
    if spec.build is not None:
        problems = check_weights(spec.build(fold_bn=fold_bn), out)
        if problems:
            where = f" of {source}" if source else ""
            raise MlxnetError(f"converted weights{where} do not fit model {spec.id!r}: {len(problems)} problem(s):\n"
                              + "\n".join(f"  {p}" for p in problems))
    return out


def fold_batchnorm(weights: Mapping[str, mx.array], spec: WeightSpec) -> dict[str, mx.array]:
    """Fuse each conv+BN pair of ``spec.fold_bn`` into the conv (weight scaled per output channel,
    bias added); the BN's tensors are removed. Works on converted (mlxnet-layout) weights, whose
    output channels are axis 0 for convs, transposed convs and linears alike."""
    if not spec.fold_bn:
        raise MlxnetError(f"model {spec.id!r} declares no conv+BN pairs to fold (WeightSpec.fold_bn)")
    out = dict(weights)
    for rule in spec.fold_bn:
        hits = 0
        for key in [k for k in weights if k.endswith(".weight")]:
            m = re.fullmatch(rule.conv, key[: -len(".weight")])
            if not m:
                continue
            conv, bn = m.group(0), m.expand(rule.bn)
            missing = [f"{bn}.{p}" for p in _BN if f"{bn}.{p}" not in out]
            if missing:
                raise MlxnetError(f"cannot fold {bn} into {conv}: missing {', '.join(missing)}")
            gamma, beta, mean, var = (out.pop(f"{bn}.{p}") for p in _BN)
            out.pop(f"{bn}.num_batches_tracked", None)
            out[f"{conv}.weight"], out[f"{conv}.bias"] = fold_conv_bn(
                out[f"{conv}.weight"], out.get(f"{conv}.bias"), gamma, beta, mean, var, rule.eps)
            hits += 1
        if not hits:
            raise MlxnetError(f"spec {spec.id!r}: fold rule {rule.conv!r} matches no weight")
    return out


def convert_checkpoint(src: str | os.PathLike, dst: str | os.PathLike, spec: WeightSpec | str, *,
                       dtype: DTypeLike = None, fold_bn: bool = False, force: bool = False) -> Path:
    """``mlxnet convert``: SRC (file or model id) -> DST safetensors in mlxnet layout, written
    atomically; SRC is only read, DST is overwritten only with ``force``."""
    spec, dtype = get_spec(spec), as_dtype(dtype)
    if fold_bn and not spec.fold_bn:  # fail before reading a large checkpoint
        fold_batchnorm({}, spec)
    dst = Path(dst)
    if dst.exists() and not force:
        raise MlxnetError(f"{dst} already exists; pass --force to overwrite it")
    src_path = resolve_weights(src)
    if dst.exists() and dst.resolve() == src_path.resolve():
        raise MlxnetError(f"{dst} is the source checkpoint; write the conversion to another file")
    state = read_checkpoint(src_path, spec.checkpoint_key)
    weights = convert_state_dict(state, spec, dtype=dtype, fold_bn=fold_bn, source=str(src_path))
    meta = {"format": FORMAT, "model": spec.id, "fold_bn": str(int(fold_bn)), "source": src_path.name}
    return save_safetensors(dst, weights, metadata=meta)


def load_pretrained(model: nn.Module, spec: WeightSpec | str, source: str | os.PathLike | None = None, *,
                    dtype: DTypeLike = None, fold_bn: bool = False, strict: bool = True) -> nn.Module:
    """Load ``source`` (default: the spec's hub file) into ``model``: a file written by
    ``mlxnet convert`` as is, anything else (PyTorch checkpoint, upstream safetensors) converted
    on the fly with the spec."""
    spec = get_spec(spec)
    path = resolve_weights(source if source is not None else spec.id)
    meta = read_safetensors_header(path)[1] if is_safetensors(path) else {}
    if meta.get("format") == FORMAT:
        if meta.get("model") != spec.id or meta.get("fold_bn", "0") != str(int(fold_bn)):
            raise MlxnetError(f"{path} was converted for model {meta.get('model')!r} (fold_bn={meta.get('fold_bn')}), "
                              f"not {spec.id!r} (fold_bn={int(fold_bn)})")
        weights = load_safetensors(path, dtype=dtype)
    else:
        weights = convert_state_dict(read_checkpoint(path, spec.checkpoint_key), spec, dtype=dtype,
                                     fold_bn=fold_bn, source=str(path))
    return load_into(model, weights, strict=strict, source=str(path))


def variant_of_file(weights: str | os.PathLike, variants: Sequence[str], family: str,
                    default: str | None = None) -> str:
    """The model variant a weights file is for: the ``model`` its mlxnet metadata names, else
    ``default``; a one-line error naming the choices when neither says."""
    path = resolve_weights(weights)
    named = read_safetensors_header(path)[1].get("model") if is_safetensors(path) else None
    if named in variants:
        return named
    if default is not None:
        return default
    raise MlxnetError(f"{weights}: cannot tell which {family} these weights are for; pass the model "
                      f"(one of {', '.join(variants)})")
