"""Storages and the tensors viewing them: ``torch._utils._rebuild_tensor*`` reimplemented on numpy.

A tensor is materialised only from its own storage: offset, sizes and strides are non-negative
ints (at most 64 dims), every element addressed lies inside the storage, and a tensor may not
have more elements than its storage holds, so an expanded (stride-0) or overlapping view larger
than its storage is refused. ``torch.save`` of parameters never writes one; a buffer like
``arange(n).expand(1, n)`` (n elements on n) is fine. Identical views of one storage (a tied
weight saved under two names) come back as one array, and the distinct views of one storage may
take at most 4x its bytes together.
"""
from __future__ import annotations

import math
from typing import Any, Union

import mlx.core as mx
import numpy as np

from .errors import Corrupt, Refused
from .limits import VIEW_BUDGET, brief, dims, index, mlx_shape_problem
from .records import Allowed

Tensor = Union[np.ndarray, mx.array]  # numpy, except bfloat16 (numpy has none): an mx.array

BF16 = "bfloat16"
STORAGE_DTYPES = {
    "FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
    "BFloat16Storage": BF16, "LongStorage": np.int64, "IntStorage": np.int32,
    "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8,
    "BoolStorage": np.bool_, "UntypedStorage": np.uint8,
}
TORCH_DTYPES = {
    "float32": np.float32, "float": np.float32, "float64": np.float64, "double": np.float64,
    "float16": np.float16, "half": np.float16, "bfloat16": BF16, "int64": np.int64, "long": np.int64,
    "int32": np.int32, "int": np.int32, "int16": np.int16, "short": np.int16, "int8": np.int8,
    "uint8": np.uint8, "bool": np.bool_,
}


class Storage:
    """Raw bytes of one torch storage (None while the legacy format's first pass runs), and the
    tensors already materialised from it: identical views are built once, and all views
    together are held to ``VIEW_BUDGET`` times the storage's bytes."""

    def __init__(self, dtype: Any, data: bytes | bytearray | None, byteorder: str, name: str = "") -> None:
        self.dtype, self.data, self.byteorder, self.name = dtype, data, byteorder, name
        self.views: dict[tuple, Tensor] = {}
        self.spent = 0


def np_dtype(dtype: Any, byteorder: str) -> np.dtype:
    """The numpy dtype of a storage's elements as laid out in the file (bfloat16 as uint16)."""
    base = np.dtype(np.uint16 if dtype == BF16 else dtype)
    return base.newbyteorder("<" if byteorder == "little" else ">")


def _tensor(storage: Any, offset: Any, size: Any, stride: Any, dtype: Any = None, neg: bool = False) -> Tensor | None:
    if not isinstance(storage, Storage):
        raise Refused("torch._utils._rebuild_tensor", f"its storage is a {type(storage).__name__}")
    dtype = storage.dtype if dtype is None else dtype
    if storage.data is None:
        return None
    offset = index(offset, "tensor storage offset")
    size, stride = dims(size, "tensor size"), dims(stride, "tensor stride")
    if len(size) != len(stride):
        raise Corrupt(f"tensor size {size} and stride {stride} differ in length")
    dt = np_dtype(dtype, storage.byteorder)
    have = len(storage.data) // dt.itemsize
    numel = math.prod(size)
    what = f"a tensor of shape {size}, stride {stride}, offset {offset} on storage {storage.name} of {have} elements"
    # A tensor's bytes must come from the file: no more elements than its storage holds (an
    # expanded stride-0 or overlapping view would be copied out to any size the pickle names),
    # and every element it addresses inside the storage.
    if numel > have:
        raise Corrupt(f"{what} has {numel} elements, more than its storage holds "
                      "(expanded or overlapping views are not materialised beyond the data in the file)")
    if numel:
        last = offset + sum((n - 1) * s for n, s in zip(size, stride))
        if last >= have:
            raise Corrupt(f"{what} reaches element {last}, past the storage's end")
    elif offset > have:
        raise Corrupt(f"{what} starts past the storage's end")
    key = (offset, size, stride, dtype, bool(neg))
    if key in storage.views:
        return storage.views[key]
    nbytes = numel * dt.itemsize
    if storage.spent + nbytes > VIEW_BUDGET * len(storage.data):
        raise Corrupt(f"the tensors viewing storage {storage.name} would take {storage.spent + nbytes} bytes, "
                      f"more than {VIEW_BUDGET}x its {len(storage.data)} bytes (the pickle repeats views of one storage)")
    native = dt.newbyteorder("=")
    if numel == 0:
        arr = np.zeros(size, dtype=native)
    else:
        flat = np.frombuffer(storage.data, dtype=dt, count=have)
        # A length-1 axis never moves, whatever its stride says (torch leaves any value there).
        strides = [s * dt.itemsize if n > 1 else 0 for n, s in zip(size, stride)]
        view = np.lib.stride_tricks.as_strided(flat[offset:], size, strides, writeable=False)
        arr = np.array(view, dtype=native)  # an own copy, in native byte order
    if dtype == BF16:
        problem = mlx_shape_problem(size)  # the one dtype that becomes an MLX array here
        if problem:
            raise Corrupt(f"{what}: {problem}")
        t: Tensor = mx.array(arr).view(mx.bfloat16)
        if neg:
            t = -t
    else:
        t = arr
        if neg:
            np.negative(arr, out=arr)
    storage.views[key] = t
    storage.spent += nbytes
    return t


# The allow-listed rebuild functions, with torch's signatures.

def rebuild_tensor(storage, storage_offset, size, stride):
    return _tensor(storage, storage_offset, size, stride)


def rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks, metadata=None):
    neg = isinstance(metadata, dict) and bool(metadata.get("neg"))  # a saved negative view
    return _tensor(storage, storage_offset, size, stride, neg=neg)


def rebuild_tensor_v3(storage, storage_offset, size, stride, requires_grad, backward_hooks, dtype, metadata=None):
    if not (isinstance(dtype, Allowed) and dtype.kind == "dtype"):
        raise Refused("torch._utils._rebuild_tensor_v3", f"unsupported dtype {brief(dtype)}")
    return _tensor(storage, storage_offset, size, stride, dtype.dtype)


def rebuild_parameter(data, requires_grad, backward_hooks, state=None):
    return data


def rebuild_from_type_v2(func, new_type, args, state):
    if type(args) is not tuple:  # func(*ndarray) would unpack it element by element
        raise Refused("torch._tensor._rebuild_from_type_v2", f"its args are {brief(args)}, not a tuple")
    return func(*args)  # func came through find_class: a rebuild above, or a record type (refused)


def rebuild_from_type(func, new_type, args, state):
    return rebuild_from_type_v2(func, new_type, args, state)
