"""safetensors files <-> dicts of MLX arrays (bfloat16 included), with one-line errors.

The header is checked here before MLX reads the file, so a truncated or corrupt file fails with
a message naming the file and the problem rather than an error deep inside the loader.
"""
from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Mapping, Union

import mlx.core as mx
import numpy as np

from ..dtypes import DTypeLike, as_dtype  # noqa: F401  (re-exported: weights' callers use it)
from ..errors import MlxnetError
from ..image import atomic_write, atomic_write_bytes
from .torch_pickle.limits import mlx_shape_problem

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


def _shown(value: object, limit: int = 60) -> str:
    """A header value as it may appear in a one-line message: repr, shortened."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object that refuses a repeated key (json keeps the last one silently, which would
    hide a tensor)."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_safetensors_header(path: PathLike) -> tuple[dict, dict[str, str]]:
    """(tensor entries, metadata) of a safetensors file, after checking it is whole and sound.

    Checks what the format requires: a header length within the file (and the format's 100 MB
    limit) before anything is read, a JSON object whose entries each have a known dtype, a
    shape of non-negative integers that MLX can hold (each under 2**31) and integer ``data_offsets`` [begin, end] with
    end - begin = elements × dtype size; tensors in the data section without overlaps or gaps,
    covering it exactly; string-to-string metadata. Every failure is a one-line MlxnetError
    naming the file; nothing larger than the file's own header is allocated."""
    path = Path(path)
    if not path.is_file():
        raise MlxnetError(f"weights file not found: {path}")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise MlxnetError(f"{path}: truncated or not a safetensors file ({size} bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER:
            raise MlxnetError(f"{path}: corrupt safetensors file: header length {n} is over the "
                              f"format's {_MAX_HEADER}-byte limit (the file has {size} bytes)")
        if 8 + n > size:
            raise MlxnetError(f"{path}: truncated or corrupt safetensors file: header claims {n} "
                              f"bytes, the file has {size}")
        raw = f.read(n)
    try:
        header = json.loads(raw, object_pairs_hook=_unique_keys)
    except _DuplicateKey as e:
        raise MlxnetError(f"{path}: corrupt safetensors header: key {_shown(e.args[0])} appears twice") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        reason = " ".join(str(e).split()) or type(e).__name__
        raise MlxnetError(f"{path}: corrupt safetensors header: not JSON ({reason})") from None
    if not isinstance(header, dict):
        raise MlxnetError(f"{path}: corrupt safetensors header: a JSON {type(header).__name__}, "
                          "not an object")
    metadata = header.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise MlxnetError(f"{path}: corrupt safetensors header: __metadata__ is not an object")
    for key, value in metadata.items():
        if not isinstance(value, str):
            raise MlxnetError(f"{path}: corrupt safetensors header: metadata {key!r} is "
                              f"{_shown(value)}, not a string")
    data_size = size - 8 - n
    spans = []
    for name, entry in header.items():
        where = f"{path}: corrupt safetensors entry {_shown(name)}"
        if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
            raise MlxnetError(f"{where}: expected dtype, shape and data_offsets, got {_shown(entry)}")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str) or dtype not in _ITEMSIZE:
            raise MlxnetError(f"{where}: unknown dtype {_shown(dtype)} "
                              f"(known: {', '.join(_ITEMSIZE)})")
        if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
            raise MlxnetError(f"{where}: shape {_shown(shape)} is not a list of non-negative integers")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
            raise MlxnetError(f"{where}: data_offsets {_shown(offsets)} are not two non-negative integers")
        begin, end = offsets
        if end < begin:
            raise MlxnetError(f"{where}: data_offsets [{begin}, {end}] end before they begin")
        if end > data_size:
            raise MlxnetError(f"{path}: truncated safetensors file: tensor {_shown(name)} ends at byte "
                              f"{end} of a {data_size}-byte data section")
        want = math.prod(shape) * _ITEMSIZE[dtype]
        if end - begin != want:
            raise MlxnetError(f"{where}: {dtype} {shape} needs {want} bytes, data_offsets "
                              f"[{begin}, {end}] give {end - begin}")
        problem = mlx_shape_problem(shape)  # a zero-element tensor passes the byte count with any dims
        if problem:
            raise MlxnetError(f"{where}: {problem}")
        spans.append((begin, end, name))
    # The tensors must tile the data section (the format's rule): sorted by offset, each starts
    # where the previous ended. Only counts were compared so far, nothing was read or allocated.
    position, previous = 0, None
    for begin, end, name in sorted(spans, key=lambda s: (s[0], s[1])):
        if begin < position:
            raise MlxnetError(f"{path}: corrupt safetensors header: tensor {_shown(name)} "
                              f"[{begin}, {end}] overlaps {_shown(previous)}, which ends at {position}")
        if begin > position:
            raise MlxnetError(f"{path}: corrupt safetensors header: bytes {position} to {begin} of the "
                              "data section belong to no tensor")
        position, previous = end, name
    if position != data_size:
        raise MlxnetError(f"{path}: corrupt safetensors file: {data_size - position} bytes after the "
                          f"last tensor (data section of {data_size} bytes ends at {position})")
    return header, metadata


def is_safetensors(path: PathLike) -> bool:
    """Sniff the content (not the name): an 8-byte header length, then the JSON object's "{".

    The length is not judged here, so a safetensors file with an absurd one is still taken
    for safetensors and :func:`read_safetensors_header` says what is wrong with it (a PyTorch
    checkpoint starts with a zip or pickle signature, never with "{" at byte 8)."""
    with open(path, "rb") as f:
        head = f.read(9)
    return len(head) == 9 and head[8:9] == b"{"


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


def host_copies(arrays: Mapping[str, mx.array]) -> dict[str, "mx.array | np.ndarray"]:
    """Evaluated arrays copied to numpy where numpy has their dtype (bfloat16 stays an MLX
    array): a snapshot :func:`save_safetensors` writes without calling MLX."""
    return {k: v if v.dtype == mx.bfloat16 else np.array(v) for k, v in arrays.items()}


def save_safetensors(path: PathLike, weights: Mapping[str, "mx.array | np.ndarray"], *,
                     metadata: Mapping[str, str] | None = None, dtype: DTypeLike = None) -> Path:
    """Write atomically (:func:`mlxnet.image.atomic_write`): a temporary sibling, then
    ``os.replace``, so a crash never leaves a half-written file under the final name. The file
    gets the usual permissions (0666 minus the umask); a failure names ``path``."""
    path = Path(path)
    if dtype is None and weights and all(isinstance(v, np.ndarray) for v in weights.values()):
        # Host arrays are written without MLX: a background thread saving a snapshot then never
        # waits on (or holds up) the device work of the thread that made it.
        from safetensors.numpy import save

        data = save({k: np.ascontiguousarray(v) for k, v in weights.items()}, metadata=dict(metadata or {}) or None)
        return atomic_write_bytes(path, data)
    arrays = cast_floating({k: v if isinstance(v, mx.array) else mx.array(v) for k, v in weights.items()}, dtype)
    mx.eval(list(arrays.values()))
    return atomic_write(path, lambda tmp: mx.save_safetensors(str(tmp), arrays, metadata=dict(metadata or {})),
                        suffix=".safetensors")  # MLX would append it to the temporary name
