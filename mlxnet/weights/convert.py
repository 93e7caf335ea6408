"""PyTorch checkpoint -> mlxnet weights: key table, layouts, optional BN folding and cast.

Every arithmetic step (BatchNorm folding) runs in float32 and the result is cast once at the
end, so a float16 checkpoint folded into float32 weights is as exact as a float32 one.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import mlx.core as mx
import mlx.nn as nn

from ..errors import MlxnetError, reading, summary
from ..image import check_output_path
from .checkpoint import FORMAT, Checkpoint, Description, describe_from_metadata, fits_as_is, open_checkpoint
from .fold import fold_conv_bn
from .hub import resolve_weights
from .layout import from_torch_layout
from .loading import check_weights, load_into
from .random_weights import is_random
from ..dtypes import compute_dtype
from .safetensors_io import DTypeLike, as_dtype, cast_floating, save_safetensors
from .spec import WeightSpec, get_spec, list_specs

_BN = ("weight", "bias", "running_mean", "running_var")


def convert_state_dict(state: Mapping[str, mx.array], spec: WeightSpec | str, *, dtype: DTypeLike = None,
                       fold_bn: bool = False, source: str | None = None,
                       config: Mapping[str, Any] | None = None) -> dict[str, mx.array]:
    """Rename (spec.keys/drop), convert layouts, fold BN if asked, cast floats; if the spec can
    build its model (with ``config``), check every key and shape against it. With ``dtype``
    None, floats keep their dtype (a folded conv keeps its weight's)."""
    spec = get_spec(spec)
    names = spec.map_keys(list(state), source)
    out = {}
    for old, new in names.items():
        kind, groups = spec.layout_of(new, tuple(state[old].shape), source)
        out[new] = from_torch_layout(state[old], kind, groups)
    out = _folded(out, spec, dtype) if fold_bn else cast_floating(out, dtype)
    if spec.build is not None:
        problems = check_weights(spec.build(fold_bn=fold_bn, **dict(config or {})), out)
        if problems:
            where = f" of {source}" if source else ""
            raise MlxnetError(summary(f"converted weights{where} do not fit model {spec.id!r}", problems))
    return out


def _folded(weights: Mapping[str, mx.array], spec: WeightSpec, dtype: DTypeLike) -> dict[str, mx.array]:
    """``fold_batchnorm`` in float32, whatever was stored, then cast to ``dtype`` (None: what was
    stored; a bias the fold created takes its weight's dtype)."""
    stored = {k: v.dtype for k, v in weights.items()}
    out = fold_batchnorm(cast_floating(weights, mx.float32), spec)
    if dtype is None:
        return {k: v.astype(stored.get(k) or stored[k.rsplit(".", 1)[0] + ".weight"]) for k, v in out.items()}
    return cast_floating(out, dtype)


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


def describe(ckpt: Checkpoint, spec: WeightSpec) -> Description:
    """What ``ckpt`` says about its model, by the spec's ``describe`` (else its metadata); an
    error if it names another variant than ``spec``."""
    found = (spec.describe or describe_from_metadata)(ckpt)
    if found.variant is not None and found.variant != spec.id:
        raise MlxnetError(f"{ckpt.path} holds a {found.variant} model, not {spec.id}")
    return found


def model_weights(ckpt: Checkpoint, spec: WeightSpec, description: Description, *, dtype: DTypeLike = None,
                  fold_bn: bool = False) -> tuple[dict[str, mx.array], bool]:
    """(mlxnet weights, whether they are BN-folded) for ``spec``'s model from ``ckpt``: a
    converted file or a model's own ``save_weights`` file as stored (its fold state decides),
    anything else converted with the spec (``fold_bn`` decides)."""
    config = description.config
    if ckpt.converted:
        folded = ckpt.metadata.get("fold_bn", "0") == "1"
        return cast_floating(ckpt.tensors, dtype), folded
    if spec.build is not None:
        for folded in (fold_bn, not fold_bn) if spec.fold_bn else (False,):
            if fits_as_is(ckpt, spec.build(fold_bn=folded, **config)):
                if fold_bn and not folded:  # a model's own unfolded weights, folded as asked
                    return _folded(ckpt.tensors, spec, dtype), True
                return cast_floating(ckpt.tensors, dtype), folded
    return convert_state_dict(ckpt.tensors, spec, dtype=dtype, fold_bn=fold_bn, source=str(ckpt.path),
                              config=config), fold_bn


def load_model(source: str | os.PathLike | Checkpoint, spec: WeightSpec | str, *, dtype: DTypeLike = None,
               fold_bn: bool = False, found: Description | None = None) -> tuple[nn.Module, Description]:
    """Build the model a checkpoint describes (variant, class count, ...) and load it, in eval
    mode; with the description (class names among it). ``found``: the description, where the
    caller has already read it with this spec's ``describe``."""
    spec = get_spec(spec)
    if spec.build is None:
        raise MlxnetError(f"spec {spec.id!r} cannot build its model (WeightSpec.build)")
    ckpt = source if isinstance(source, Checkpoint) else open_checkpoint(source, spec.checkpoint_key)
    with reading(ckpt.path, "checkpoint"):  # what the file says reaches describe, build and the checks
        found = found if found is not None else describe(ckpt, spec)
        weights, folded = model_weights(ckpt, spec, found, dtype=dtype, fold_bn=fold_bn)
        model = load_into(spec.build(fold_bn=folded, **found.config), weights, source=str(ckpt.path))
    model.eval()
    return model, found


def load_variant(source: str | os.PathLike, variants: Sequence[str], *, model: str | None = None,
                 dtype: DTypeLike = None, default: str | None = None) -> tuple[nn.Module, Description]:
    """Load a checkpoint of a family whose variants share one ``describe`` (the first variant's
    spec's): the variant is the one the checkpoint holds; ``model``, if given, must agree. The
    source ``random`` holds ``model``, else ``default``, else the first variant."""
    if model is not None and model not in variants:
        raise MlxnetError(f"unknown model {model!r}: expected one of {', '.join(variants)}")
    dtype = compute_dtype(dtype)
    ckpt = open_checkpoint(source, spec=model or default or variants[0], ids=variants)
    with reading(ckpt.path, "checkpoint"):
        found = (get_spec(variants[0]).describe or describe_from_metadata)(ckpt)
    if found.variant not in variants:
        raise MlxnetError(f"{ckpt.path} holds a {found.variant} model, not one of {', '.join(variants)}")
    if model is not None and found.variant != model:
        raise MlxnetError(f"{ckpt.path} holds a {found.variant} model, not {model}")
    return load_model(ckpt, found.variant, dtype=dtype, found=found)


def identify(ckpt: Checkpoint) -> str:
    """The model id a checkpoint says it holds (mlxnet's metadata, an ultralytics model's yaml,
    a LaMa generator's blocks...): what each family's ``describe`` reads from it, the first
    that names a variant; else a one-line error asking for the model."""
    tried = set()
    for spec_id in list_specs():
        describe = get_spec(spec_id).describe or describe_from_metadata
        if describe in tried:
            continue
        tried.add(describe)
        try:
            found = describe(ckpt)
        except MlxnetError:  # another family's checkpoint
            continue
        if found.variant is not None:
            return found.variant
    raise MlxnetError(f"{ckpt.path}: the checkpoint does not say which model it holds; give --model/-m "
                      "(`mlxnet models` lists the ids)")


def convert_checkpoint(src: str | os.PathLike, dst: str | os.PathLike, spec: WeightSpec | str | None, *,
                       dtype: DTypeLike = "float32", fold_bn: bool = False, force: bool = False,
                       names: Sequence[str] | None = None) -> Path:
    """``mlxnet convert``: SRC (file or model id) -> DST safetensors in mlxnet layout, written
    atomically; SRC is only read, DST is overwritten only with ``force``. Floats are written as
    ``dtype`` (float32 unless told otherwise, whatever the checkpoint stores). The variant,
    configuration and class names (``names``, else the checkpoint's own) go into the metadata.
    ``spec`` None: the model the checkpoint says it holds (:func:`identify`)."""
    dtype = as_dtype(dtype)
    if spec is not None:
        spec = get_spec(spec)
        if fold_bn and not spec.fold_bn:  # fail before reading a large checkpoint
            fold_batchnorm({}, spec)
    src_path = None if is_random(src) else resolve_weights(src, ids=(spec.id,) if spec is not None else None)
    inputs = [src_path] if src_path is not None else []
    dst = check_output_path(dst, inputs, force=force, kind="file")  # before reading a large checkpoint
    if spec is None:  # the file is read once: for what it holds, then converted
        ckpt = open_checkpoint(src_path or src)
        spec = get_spec(identify(ckpt))
        if fold_bn and not spec.fold_bn:
            fold_batchnorm({}, spec)
    else:
        ckpt = open_checkpoint(src_path or src, spec.checkpoint_key, spec=spec)
    with reading(ckpt.path, "checkpoint"):
        found = describe(ckpt, spec)
        if ckpt.converted and ckpt.metadata.get("fold_bn", "0") != str(int(fold_bn)):
            raise MlxnetError(f"{ckpt.path} was already converted with fold_bn={ckpt.metadata.get('fold_bn')}; "
                              "convert the original checkpoint instead")
        weights, _ = model_weights(ckpt, spec, found, dtype=dtype, fold_bn=fold_bn)
    names = tuple(names) if names is not None else found.names
    return save_converted(dst, weights, spec.id, found.config, names, source=ckpt.path.name, fold_bn=fold_bn)


def save_converted(dst: str | os.PathLike, weights: Mapping[str, mx.array], model: str, config: Mapping[str, Any],
                   names: Sequence[str] | None, *, source: str, fold_bn: bool = False) -> Path:
    """Write mlxnet-layout ``weights`` as a self-describing file (variant, configuration, class
    names in the metadata), atomically: what ``mlxnet convert`` writes and every command loads."""
    meta = {"format": FORMAT, "model": model, "fold_bn": str(int(fold_bn)), "source": source,
            "config": json.dumps(dict(config))}
    if names is not None:
        meta["names"] = json.dumps(list(names))
    return save_safetensors(dst, weights, metadata=meta)


def load_pretrained(model: nn.Module, spec: WeightSpec | str, source: str | os.PathLike | None = None, *,
                    dtype: DTypeLike = None, fold_bn: bool = False, strict: bool = True) -> nn.Module:
    """Load ``source`` (default: the spec's hub file) into ``model``, built by the caller: a
    file written by ``mlxnet convert`` or by the model's own ``save_weights`` as is, anything
    else (PyTorch checkpoint, upstream safetensors) converted on the fly with the spec."""
    spec, dtype = get_spec(spec), compute_dtype(dtype)
    ckpt = open_checkpoint(source if source is not None else spec.id, spec.checkpoint_key, spec=spec,
                           ids=(spec.id,))
    with reading(ckpt.path, "checkpoint"):
        if ckpt.converted:
            if ckpt.metadata.get("model") != spec.id or ckpt.metadata.get("fold_bn", "0") != str(int(fold_bn)):
                raise MlxnetError(f"{ckpt.path} was converted for model {ckpt.metadata.get('model')!r} "
                                  f"(fold_bn={ckpt.metadata.get('fold_bn')}), not {spec.id!r} (fold_bn={int(fold_bn)})")
            weights = cast_floating(ckpt.tensors, dtype)
        elif fits_as_is(ckpt, model):
            weights = cast_floating(ckpt.tensors, dtype)
        else:
            weights = convert_state_dict(ckpt.tensors, spec, dtype=dtype, fold_bn=fold_bn, source=str(ckpt.path))
        return load_into(model, weights, strict=strict, source=str(ckpt.path))
