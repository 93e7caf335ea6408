"""safetensors files <-> dicts of MLX arrays (bfloat16 included), with one-line errors.

The header is checked here before MLX reads the file, so a truncated or corrupt file fails with
a message naming the file and the problem rather than an error deep inside the loader.
"""
from __future__ import annotations

import json
import math
import os
import struct
import secrets
from pathlib import Path
from typing import Mapping, Union

import mlx.core as mx
import numpy as np

from ..dtypes import DTypeLike, as_dtype  # noqa: F401  (re-exported: weights' callers use it)
from ..errors import MlxnetError

PathLike = Union[str, os.PathLike]

_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4,
             "F32": 4, "I64": 8, "U64": 8, "F64": 8}
_MAX_HEADER = 100 * 2**20  # the format's own limit (100 MB)



def cast_floating(weights: Mapping[str, mx.array], dtype: DTypeLike) -> dict[str, mx.array]:
    """Cast floating-point tensors to ``dtype`` (None: keep); integer and bool tensors keep theirs."""
    dtype = as_dtype(dtype)
    if dtype is None:
        return dict(weights)
    return {k: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v for k, v in weights.items()}


def read_safetensors_header(path: PathLike) -> tuple[dict, dict[str, str]]:
    """(tensor entries, metadata) of a safetensors file, after checking it is whole."""
    path = Path(path)
    if not path.is_file():
        raise MlxnetError(f"weights file not found: {path}")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise MlxnetError(f"{path}: truncated or not a safetensors file ({size} bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER or 8 + n > size:
            raise MlxnetError(f"{path}: corrupt or truncated safetensors file "
                              f"(header claims {n} bytes, file has {size})")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise MlxnetError(f"{path}: corrupt safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise MlxnetError(f"{path}: corrupt safetensors header (not a JSON object)")
    metadata = header.pop("__metadata__", None) or {}
    data_size = size - 8 - n
    for name, entry in header.items():
        try:
            dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            want = math.prod(shape) * _ITEMSIZE[dtype]
        except (KeyError, TypeError, ValueError):
            raise MlxnetError(f"{path}: corrupt safetensors entry for {name}: {entry!r}") from None
        if end - begin != want or begin < 0:
            raise MlxnetError(f"{path}: corrupt safetensors entry for {name}: {dtype} {shape} needs "
                              f"{want} bytes, offsets give {end - begin}")
        if end > data_size:
            raise MlxnetError(f"{path}: truncated safetensors file: tensor {name} ends at byte {end} "
                              f"of a {data_size}-byte data section")
    return header, metadata


def is_safetensors(path: PathLike) -> bool:
    """Sniff the content (not the name): an 8-byte header length followed by a JSON object."""
    with open(path, "rb") as f:
        head = f.read(9)
    return len(head) == 9 and head[8:9] == b"{" and struct.unpack("<Q", head[:8])[0] < _MAX_HEADER


def load_safetensors(path: PathLike, *, dtype: DTypeLike = None) -> dict[str, mx.array]:
    """All tensors of a safetensors file as MLX arrays, their dtypes kept unless ``dtype`` is given."""
    return load_safetensors_with_metadata(path, dtype=dtype)[0]


def load_safetensors_with_metadata(path: PathLike, *, dtype: DTypeLike = None
                                   ) -> tuple[dict[str, mx.array], dict[str, str]]:
    _, metadata = read_safetensors_header(path)
    try:
        weights = mx.load(str(path), format="safetensors")
    except (RuntimeError, ValueError) as e:
        raise MlxnetError(f"{path}: cannot read safetensors file ({e})") from None
    return cast_floating(weights, dtype), metadata


def save_safetensors(path: PathLike, weights: Mapping[str, "mx.array | np.ndarray"], *,
                     metadata: Mapping[str, str] | None = None, dtype: DTypeLike = None) -> Path:
    """Write atomically: a temporary file in the same folder, then ``os.replace``, so a crash
    never leaves a half-written file under the final name."""
    path = Path(path)
    arrays = cast_floating({k: v if isinstance(v, mx.array) else mx.array(v) for k, v in weights.items()}, dtype)
    mx.eval(list(arrays.values()))
    # A fresh name (not mkstemp) so the file gets the usual umask permissions, not 0600.
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp.safetensors"
    try:
        mx.save_safetensors(str(tmp), arrays, metadata=dict(metadata or {}))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
