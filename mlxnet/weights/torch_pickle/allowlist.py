"""The allow-list: every name a pickle may call or refer to, and what each becomes.

Unpickling normally imports and calls whatever the file names. Here ``find_class`` hands out real
objects only for this table: immutable data types, the tensor-rebuild functions of
:mod:`.tensors`, and checking stand-ins (reimplemented on numpy) for the constructors pickles of
data use. Every other name becomes an inert :class:`~.records.Record` type.

Allow-listed constructors take only the arguments pickles of real data pass them: no
``bytearray(n)``, ``numpy.ndarray(shape)``, ``_reconstruct`` of a non-empty array, subarray
dtype strings, or iteration over arrays (``set``/``OrderedDict``/``torch.Size`` take plain
containers); a numpy array's pickled state must carry exactly the data its shape declares.
"""
from __future__ import annotations

import datetime
import math
import re
from collections import OrderedDict
from pathlib import PurePath
from typing import Any, Callable

import numpy as np

from .errors import Corrupt, Refused
from .limits import brief, dims
from .records import Allowed
from .tensors import (STORAGE_DTYPES, TORCH_DTYPES, rebuild_from_type, rebuild_from_type_v2, rebuild_parameter,
                      rebuild_tensor, rebuild_tensor_v2, rebuild_tensor_v3)

# Each takes only what pickles of real data pass it. Anything that would allocate by a number
# the file declares (bytearray(n), ndarray(shape)) or iterate an array into Python objects
# (set(tensor): ~100 bytes per element) is refused.

def _codecs_encode(text: Any, encoding: str = "utf-8") -> bytes:
    # Protocol-2 pickles spell bytes as _codecs.encode(str, "latin1").
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise Refused("_codecs.encode", f"only (str, 'latin1') is allowed, got {brief(text)}, {brief(encoding)}")
    return text.encode("latin1")


def _torch_size(dims: Any = ()) -> tuple:
    if not isinstance(dims, (tuple, list)) or not all(isinstance(d, (int, np.integer)) for d in dims):
        raise Refused("torch.Size", f"its argument is {brief(dims)}, not a tuple of ints")
    return tuple(int(d) for d in dims)


def _torch_device(kind: Any, index: Any = None) -> str:
    if not isinstance(kind, str) or not (index is None or isinstance(index, int)):
        raise Refused("torch.device", f"arguments {brief(kind)}, {brief(index)}")
    return f"{kind}:{index}" if index is not None else kind


def _pure_path(*parts: Any) -> PurePath:
    # Path objects in hyper-parameters: kept as pure paths (no file system access).
    if not all(isinstance(p, str) for p in parts):
        raise Refused("pathlib.Path", f"arguments {brief(parts)} are not strings")
    return PurePath(*parts)


def _ordered_dict(*args: Any) -> OrderedDict:
    # torch/pickle write OrderedDict() and add the items with SETITEMS.
    if len(args) > 1 or (args and not isinstance(args[0], (dict, list, tuple))):
        raise Refused("collections.OrderedDict", f"arguments {brief(args)}; only a dict or a list of pairs")
    return OrderedDict(*args)


def _plain_items(name: str, items: Any) -> Any:
    if not isinstance(items, (list, tuple, set, frozenset)):
        raise Refused(name, f"its argument is {brief(items)}, not a list")
    return items


def _set(items: Any = ()) -> set:
    return set(_plain_items("builtins.set", items))


def _frozenset(items: Any = ()) -> frozenset:
    return frozenset(_plain_items("builtins.frozenset", items))


def _bytearray(data: Any = b"", encoding: Any = None) -> bytearray:
    # Pickles write bytearray(bytes) or, before protocol 3, bytearray(str, "latin-1"); never a size.
    if isinstance(data, (bytes, bytearray)) and encoding is None:
        return bytearray(data)
    if isinstance(data, str) and encoding in ("latin1", "latin-1"):
        return bytearray(data, "latin-1")
    raise Refused("builtins.bytearray",
                  f"arguments {brief(data)}, {brief(encoding)}; only bytes or (str, 'latin-1')")


_NDARRAY = Allowed("numpy.ndarray", "type")  # named by numpy pickles, never called


def _np_reconstruct(subtype: Any, shape: Any, dtype: Any) -> np.ndarray:
    if subtype is not _NDARRAY:
        raise Refused("numpy.core.multiarray._reconstruct", f"subtype {brief(subtype)} is not numpy.ndarray")
    shape = dims(shape, "numpy _reconstruct shape")
    if math.prod(shape) or not isinstance(dtype, (bytes, str, np.dtype)):
        # numpy pickles always start from an empty array, _reconstruct(ndarray, (0,), b'b'),
        # and carry the data in the state; anything else would allocate what the file names.
        raise Refused("numpy.core.multiarray._reconstruct", f"shape {shape} and dtype {brief(dtype)}; "
                      "numpy pickles reconstruct an empty array")
    return np.ndarray.__new__(np.ndarray, shape, dtype)


def check_array_state(state: Any) -> None:
    """The state a pickle BUILDs a numpy array with must hold the data its shape declares:
    ``ndarray.__setstate__`` allocates shape x itemsize for object arrays before it counts the
    items it is given."""
    if isinstance(state, tuple) and len(state) == 5:  # (version, shape, dtype, fortran, data)
        state = state[1:]
    if not (isinstance(state, tuple) and len(state) == 4):
        raise Corrupt(f"numpy array state is {brief(state)}")
    shape, dtype, _fortran, raw = state
    shape = dims(shape, "numpy array shape")
    if not isinstance(dtype, np.dtype):
        raise Corrupt(f"numpy array dtype is {brief(dtype)}")
    n = math.prod(shape)
    if dtype.hasobject:
        if dtype != np.dtype(object):  # an object subarray or field would multiply the allocation
            raise Refused("numpy.ndarray", f"a structured or subarray object dtype {brief(str(dtype))}")
        if not isinstance(raw, list) or len(raw) != n:
            got = f"{len(raw)} items" if isinstance(raw, list) else brief(raw)
            raise Corrupt(f"a numpy object array of shape {shape} needs {n} items, the pickle holds {got}")
    else:
        got = len(raw) if isinstance(raw, (bytes, bytearray, str)) else None
        if got != n * dtype.itemsize:
            raise Corrupt(f"a numpy array of shape {shape} and dtype {brief(str(dtype))} needs {n * dtype.itemsize} "
                          f"bytes, the pickle holds {got if got is not None else brief(raw)}")


_DTYPE_SPEC = re.compile(r"[<>=|]?[A-Za-z][A-Za-z0-9]*")


def _np_dtype_ctor(spec: Any, align: Any = False, copy: Any = False) -> np.dtype:
    # numpy pickles a dtype as dtype("f8"/"V12"/"U5", align, copy=True) and sets fields, byte
    # order and subarray shape through BUILD. "copy" matters: without it BUILD would go to
    # numpy's shared instance (which ignores it: a big-endian dtype came back native).
    if not isinstance(spec, str) or not _DTYPE_SPEC.fullmatch(spec):
        raise Refused("numpy.dtype", f"argument {brief(spec)} is not a type code")
    return np.dtype(spec, bool(align), bool(copy))


def _np_scalar(dtype: Any, data: Any = None) -> Any:
    if not isinstance(dtype, np.dtype):
        raise Refused("numpy.core.multiarray.scalar", f"dtype {brief(dtype)}")
    if dtype.hasobject:
        return data
    if not isinstance(data, (bytes, bytearray)) or len(data) < dtype.itemsize:
        got = len(data) if isinstance(data, (bytes, bytearray)) else brief(data)
        raise Corrupt(f"a numpy scalar of dtype {brief(str(dtype))} needs {dtype.itemsize} bytes, "
                      f"the pickle holds {got}")
    return np.frombuffer(data, dtype=dtype, count=1)[0]


# Immutable built-in types whose constructors take fixed-size arguments are handed out as
# themselves; everything else goes through a checking function.
ALLOWED: dict[str, Any] = {
    "builtins.slice": slice,
    "builtins.complex": complex,
    "datetime.datetime": datetime.datetime,
    "datetime.date": datetime.date,
    "datetime.time": datetime.time,
    "datetime.timedelta": datetime.timedelta,
    "datetime.timezone": datetime.timezone,
    "numpy.ndarray": _NDARRAY,
}
_FUNCTIONS: dict[str, Callable] = {
    "collections.OrderedDict": _ordered_dict,
    "builtins.set": _set,
    "builtins.frozenset": _frozenset,
    "builtins.bytearray": _bytearray,
    "_codecs.encode": _codecs_encode,
    "torch._utils._rebuild_tensor": rebuild_tensor,
    "torch._utils._rebuild_tensor_v2": rebuild_tensor_v2,
    "torch._utils._rebuild_tensor_v3": rebuild_tensor_v3,
    "torch._utils._rebuild_parameter": rebuild_parameter,
    "torch._utils._rebuild_parameter_with_state": rebuild_parameter,
    "torch._tensor._rebuild_from_type_v2": rebuild_from_type_v2,
    "torch._tensor._rebuild_from_type": rebuild_from_type,
    "torch.Size": _torch_size,
    "torch.device": _torch_device,
    "numpy.dtype": _np_dtype_ctor,
}
for _cls in ("Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"):
    _FUNCTIONS[f"pathlib.{_cls}"] = _pure_path
for _mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
    _FUNCTIONS[f"{_mod}._reconstruct"] = _np_reconstruct
    _FUNCTIONS[f"{_mod}.scalar"] = _np_scalar
ALLOWED.update({n: Allowed(n, "fn", fn=f) for n, f in _FUNCTIONS.items()})
for _name, _dt in STORAGE_DTYPES.items():
    ALLOWED[f"torch.{_name}"] = Allowed(f"torch.{_name}", "storage", dtype=_dt)
ALLOWED["torch.storage.UntypedStorage"] = Allowed("torch.storage.UntypedStorage", "storage", dtype=np.uint8)
for _name, _dt in TORCH_DTYPES.items():
    ALLOWED[f"torch.{_name}"] = Allowed(f"torch.{_name}", "dtype", dtype=_dt)
