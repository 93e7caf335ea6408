"""Read PyTorch checkpoints (.pt/.pth/.ckpt) without torch and without running pickled code.

``torch.save`` writes a pickle whose tensors point at raw storages kept beside it: in a zip
archive (``<name>/data.pkl`` + ``<name>/data/<key>``, torch >= 1.6) or, in the legacy format,
after it in the same file (magic number, protocol, sys_info, the pickle, the storage keys, then
each storage as an int64 element count and its bytes).

Unpickling normally imports and calls whatever the file names. Here ``find_class`` hands out
real objects only for an allow-list of data types and tensor-rebuild functions (reimplemented
on numpy); every other name becomes an inert :class:`Record` type. A record can be *created*
the way pickle creates class instances (``NEWOBJ`` + ``BUILD``: it keeps the args and state,
e.g. a whole ``nn.Module``'s ``__dict__``), but *calling* it (``REDUCE``: ``os.system``,
``builtins.eval``, ``functools.partial`` ...) is refused with an error naming the callable.

Hostile files are read with bounded memory: every size a file declares is checked against the
bytes actually in it before anything is allocated.

* The pickle runs on Python's pure-Python unpickler, whose memo is a dict (the C one allocates
  an array as long as the largest memo index a file names), with the length every
  ``BINBYTES``/``BINUNICODE``/``BYTEARRAY8``/``LONG4``/``FRAME`` declares checked against the
  bytes left before it is read (the C one reserves the declared length first).
* Allow-listed constructors take only the arguments pickles of real data pass them: no
  ``bytearray(n)``, ``numpy.ndarray(shape)``, ``_reconstruct`` of a non-empty array, subarray
  dtype strings, or iteration over arrays (``set``/``OrderedDict``/``torch.Size`` take plain
  containers); a numpy array's pickled state must carry exactly the data its shape declares.
* Zip members: a storage member must hold exactly element count x dtype size bytes, read in
  chunks and never past that (a member that decompresses to more is an error). Stored members
  together may not exceed the archive (overlapping entries); deflated ones may inflate to at
  most 16x the archive + 16 MiB in all (torch writes them stored, so a real checkpoint reads 1x);
  other compression methods and encrypted members are refused.
* Legacy format: a storage's declared element count must fit in the bytes left in the file.
* Tensors are materialised only from their own storage: offset, sizes and strides are
  non-negative ints (at most 64 dims), every element addressed lies inside the storage, and a
  tensor may not have more elements than its storage holds, so an expanded (stride-0) or
  overlapping view larger than its storage is refused. ``torch.save`` of parameters never
  writes one; a buffer like ``arange(n).expand(1, n)`` (n elements on n) is fine. Identical
  views of one storage (a tied weight saved under two names) come back as one array, and the
  distinct views of one storage may take at most 4x its bytes together.

What remains is the pickle's own objects: memory in proportion to the pickle's length.
"""
from __future__ import annotations

import _compat_pickle
import copy
import datetime
import io
import math
import pickle
import re
import struct
import tarfile
import zipfile
import zlib
from collections import OrderedDict
from pathlib import Path, PurePath
from typing import Any, BinaryIO, Callable, Mapping, Union

import mlx.core as mx
import numpy as np

from ...errors import MlxnetError

Tensor = Union[np.ndarray, mx.array]  # numpy, except bfloat16 (numpy has none): an mx.array
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001

_MAX_NDIM = 64  # numpy's own limit; torch tensors have far fewer
_MAX_INDEX = 2**63 - 1  # sizes, strides and offsets are int64 in torch
_VIEW_BUDGET = 4  # distinct views of one storage may take this many times its bytes
_MAX_INFLATION = 16  # deflated zip members may inflate to this many times the archive...
_INFLATION_SLACK = 16 << 20  # ... plus this, so that small re-zipped files with zero buffers load
_MAX_RECORD_TYPES = 4096  # distinct foreign classes one pickle may name (each costs a type object)
_CHUNK = 1 << 20


class _Refused(Exception):
    def __init__(self, name: str, why: str = "not on the allow-list") -> None:
        super().__init__(name, why)
        self.name, self.why = name, why


class _Corrupt(Exception):
    pass


class _Truncated(_Corrupt):
    """The file ends before what it declares (or declares more than it holds)."""


def _brief(x: Any, limit: int = 60) -> str:
    """A short description of a value from the file for an error message: never a repr of a
    whole (possibly huge) object, and never str() of a huge int (which itself raises)."""
    if isinstance(x, (str, bytes, bytearray)):
        text = repr(x[:limit])
        return text + ("..." if len(x) > limit else "")
    if isinstance(x, int) and not isinstance(x, bool) and x.bit_length() > 64:
        return f"<an int of {x.bit_length()} bits>"
    if x is None or isinstance(x, (bool, int, float, np.dtype, _Allowed, Record, _RecordType)) or (
            isinstance(x, np.generic) and x.nbytes <= 64):
        text = repr(x)
        return text if len(text) <= limit else text[:limit] + "..."
    if isinstance(x, (tuple, list)) and len(x) <= 8:
        inner = ", ".join(_brief(v, 20) for v in x)
        return f"({inner})" if isinstance(x, tuple) else f"[{inner}]"
    size = f" of {len(x)} items" if isinstance(x, (tuple, list, dict, set, frozenset)) else ""
    return f"a {type(x).__name__}{size}"


def _one_line(text: Any, limit: int = 300) -> str:
    """An error's text on one line, cut short (a message may quote data from the file)."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def _index(x: Any, what: str) -> int:
    """A non-negative int64 (a size, stride, offset or count declared by the file)."""
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise _Corrupt(f"{what} is {_brief(x)}, not an integer")
    x = int(x)
    if not 0 <= x <= _MAX_INDEX:
        raise _Corrupt(f"{what} is {_brief(x)}; expected 0 to 2**63-1")
    return x


def _dims(seq: Any, what: str) -> tuple[int, ...]:
    if not isinstance(seq, (tuple, list)):
        raise _Corrupt(f"{what} is {_brief(seq)}, not a tuple of ints")
    if len(seq) > _MAX_NDIM:
        raise _Corrupt(f"{what} has {len(seq)} dimensions; at most {_MAX_NDIM} are supported")
    return tuple(_index(n, what) for n in seq)


class _RecordType(type):
    """Metaclass of the stand-in types: instances come only from NEWOBJ (``cls.__new__``);
    a call of the type itself is a pickle REDUCE/INST of arbitrary code and is refused, and
    so is a BUILD that would set attributes on the type."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise _Refused(cls.class_name)

    def __setattr__(cls, name: str, value: Any) -> None:
        raise _Refused(cls.class_name, f"setting attribute {name!r} on it")

    @property
    def class_name(cls) -> str:
        return f"{cls._pickle_module}.{cls._pickle_name}"


class Record(metaclass=_RecordType):
    """An object of a class outside the allow-list, kept as data and never run.

    ``args``/``kwargs``: what the pickle passed to ``__new__``; ``state``: what it passed to
    ``__setstate__`` (usually the object's ``__dict__``); ``items``/``values``: entries added to
    dict or list subclasses. ``attrs`` is the state as a dict.
    """

    _pickle_module = "?"
    _pickle_name = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> "Record":
        obj = object.__new__(cls)
        obj.args, obj.kwargs, obj.state, obj.items, obj.values = args, kwargs, None, {}, []
        return obj

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __setitem__(self, key: Any, value: Any) -> None:
        self.items[key] = value

    def append(self, value: Any) -> None:
        self.values.append(value)

    def extend(self, values: Any) -> None:
        self.values.extend(values)

    @property
    def class_name(self) -> str:
        return type(self).class_name

    @property
    def attrs(self) -> dict:
        state = self.state
        if isinstance(state, tuple) and len(state) == 2:  # (__dict__, slots)
            return {**(state[0] or {}), **(state[1] or {})}
        return state if isinstance(state, dict) else {}

    def __repr__(self) -> str:
        return f"<Record {self.class_name}>"


class _Allowed:
    """One allow-listed name: a safe callable (``fn``) or a marker (a storage type, a torch dtype
    or a type that may only be named, ``dtype``). Frozen, so a pickle BUILD cannot alter what
    later loads see."""

    __slots__ = ("name", "kind", "fn", "dtype")

    def __init__(self, name: str, kind: str, fn: Callable | None = None, dtype: Any = None) -> None:
        for k, v in (("name", name), ("kind", kind), ("fn", fn), ("dtype", dtype)):
            object.__setattr__(self, k, v)

    def __setattr__(self, name: str, value: Any) -> None:
        raise _Refused(self.name, f"setting attribute {name!r} on it")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.fn is None:
            raise _Refused(self.name, "it is not callable")
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return self.name


# --- storages and tensors ---------------------------------------------------------------------

_BF16 = "bfloat16"
_STORAGE_DTYPES = {
    "FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
    "BFloat16Storage": _BF16, "LongStorage": np.int64, "IntStorage": np.int32,
    "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8,
    "BoolStorage": np.bool_, "UntypedStorage": np.uint8,
}
_TORCH_DTYPES = {
    "float32": np.float32, "float": np.float32, "float64": np.float64, "double": np.float64,
    "float16": np.float16, "half": np.float16, "bfloat16": _BF16, "int64": np.int64, "long": np.int64,
    "int32": np.int32, "int": np.int32, "int16": np.int16, "short": np.int16, "int8": np.int8,
    "uint8": np.uint8, "bool": np.bool_,
}


class _Storage:
    """Raw bytes of one torch storage (None while the legacy format's first pass runs), and the
    tensors already materialised from it: identical views are built once, and all views
    together are held to ``_VIEW_BUDGET`` times the storage's bytes."""

    def __init__(self, dtype: Any, data: bytes | bytearray | None, byteorder: str, name: str = "") -> None:
        self.dtype, self.data, self.byteorder, self.name = dtype, data, byteorder, name
        self.views: dict[tuple, Tensor] = {}
        self.spent = 0


def _np_dtype(dtype: Any, byteorder: str) -> np.dtype:
    base = np.dtype(np.uint16 if dtype == _BF16 else dtype)
    return base.newbyteorder("<" if byteorder == "little" else ">")


def _tensor(storage: Any, offset: Any, size: Any, stride: Any, dtype: Any = None, neg: bool = False) -> Tensor | None:
    if not isinstance(storage, _Storage):
        raise _Refused("torch._utils._rebuild_tensor", f"its storage is a {type(storage).__name__}")
    dtype = storage.dtype if dtype is None else dtype
    if storage.data is None:
        return None
    offset = _index(offset, "tensor storage offset")
    size, stride = _dims(size, "tensor size"), _dims(stride, "tensor stride")
    if len(size) != len(stride):
        raise _Corrupt(f"tensor size {size} and stride {stride} differ in length")
    dt = _np_dtype(dtype, storage.byteorder)
    have = len(storage.data) // dt.itemsize
    numel = math.prod(size)
    what = f"a tensor of shape {size}, stride {stride}, offset {offset} on storage {storage.name} of {have} elements"
    # A tensor's bytes must come from the file: no more elements than its storage holds (an
    # expanded stride-0 or overlapping view would be copied out to any size the pickle names),
    # and every element it addresses inside the storage.
    if numel > have:
        raise _Corrupt(f"{what} has {numel} elements, more than its storage holds "
                       "(expanded or overlapping views are not materialised beyond the data in the file)")
    if numel:
        last = offset + sum((n - 1) * s for n, s in zip(size, stride))
        if last >= have:
            raise _Corrupt(f"{what} reaches element {last}, past the storage's end")
    elif offset > have:
        raise _Corrupt(f"{what} starts past the storage's end")
    key = (offset, size, stride, dtype, bool(neg))
    if key in storage.views:
        return storage.views[key]
    nbytes = numel * dt.itemsize
    if storage.spent + nbytes > _VIEW_BUDGET * len(storage.data):
        raise _Corrupt(f"the tensors viewing storage {storage.name} would take {storage.spent + nbytes} bytes, "
                       f"more than {_VIEW_BUDGET}x its {len(storage.data)} bytes (the pickle repeats views of one storage)")
    native = dt.newbyteorder("=")
    if numel == 0:
        arr = np.zeros(size, dtype=native)
    else:
        flat = np.frombuffer(storage.data, dtype=dt, count=have)
        # A length-1 axis never moves, whatever its stride says (torch leaves any value there).
        strides = [s * dt.itemsize if n > 1 else 0 for n, s in zip(size, stride)]
        view = np.lib.stride_tricks.as_strided(flat[offset:], size, strides, writeable=False)
        arr = np.array(view, dtype=native)  # an own copy, in native byte order
    if dtype == _BF16:
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


def _rebuild_tensor(storage, storage_offset, size, stride):
    return _tensor(storage, storage_offset, size, stride)


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks, metadata=None):
    neg = isinstance(metadata, dict) and bool(metadata.get("neg"))  # a saved negative view
    return _tensor(storage, storage_offset, size, stride, neg=neg)


def _rebuild_tensor_v3(storage, storage_offset, size, stride, requires_grad, backward_hooks, dtype, metadata=None):
    if not (isinstance(dtype, _Allowed) and dtype.kind == "dtype"):
        raise _Refused("torch._utils._rebuild_tensor_v3", f"unsupported dtype {_brief(dtype)}")
    return _tensor(storage, storage_offset, size, stride, dtype.dtype)


def _rebuild_parameter(data, requires_grad, backward_hooks, state=None):
    return data


def _rebuild_from_type_v2(func, new_type, args, state):
    if type(args) is not tuple:  # func(*ndarray) would unpack it element by element
        raise _Refused("torch._tensor._rebuild_from_type_v2", f"its args are {_brief(args)}, not a tuple")
    return func(*args)  # func came through find_class: a rebuild above, or a record type (refused)


def _rebuild_from_type(func, new_type, args, state):
    return _rebuild_from_type_v2(func, new_type, args, state)


# --- the other allow-listed callables ------------------------------------------------------------
# Each takes only what pickles of real data pass it. Anything that would allocate by a number
# the file declares (bytearray(n), ndarray(shape)) or iterate an array into Python objects
# (set(tensor): ~100 bytes per element) is refused.

def _codecs_encode(text: Any, encoding: str = "utf-8") -> bytes:
    # Protocol-2 pickles spell bytes as _codecs.encode(str, "latin1").
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise _Refused("_codecs.encode", f"only (str, 'latin1') is allowed, got {_brief(text)}, {_brief(encoding)}")
    return text.encode("latin1")


def _torch_size(dims: Any = ()) -> tuple:
    if not isinstance(dims, (tuple, list)) or not all(isinstance(d, (int, np.integer)) for d in dims):
        raise _Refused("torch.Size", f"its argument is {_brief(dims)}, not a tuple of ints")
    return tuple(int(d) for d in dims)


def _torch_device(kind: Any, index: Any = None) -> str:
    if not isinstance(kind, str) or not (index is None or isinstance(index, int)):
        raise _Refused("torch.device", f"arguments {_brief(kind)}, {_brief(index)}")
    return f"{kind}:{index}" if index is not None else kind


def _pure_path(*parts: Any) -> PurePath:
    # Path objects in hyper-parameters: kept as pure paths (no file system access).
    if not all(isinstance(p, str) for p in parts):
        raise _Refused("pathlib.Path", f"arguments {_brief(parts)} are not strings")
    return PurePath(*parts)


def _ordered_dict(*args: Any) -> OrderedDict:
    # torch/pickle write OrderedDict() and add the items with SETITEMS.
    if len(args) > 1 or (args and not isinstance(args[0], (dict, list, tuple))):
        raise _Refused("collections.OrderedDict", f"arguments {_brief(args)}; only a dict or a list of pairs")
    return OrderedDict(*args)


def _plain_items(name: str, items: Any) -> Any:
    if not isinstance(items, (list, tuple, set, frozenset)):
        raise _Refused(name, f"its argument is {_brief(items)}, not a list")
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
    raise _Refused("builtins.bytearray",
                   f"arguments {_brief(data)}, {_brief(encoding)}; only bytes or (str, 'latin-1')")


_NDARRAY = _Allowed("numpy.ndarray", "type")  # named by numpy pickles, never called


def _np_reconstruct(subtype: Any, shape: Any, dtype: Any) -> np.ndarray:
    if subtype is not _NDARRAY:
        raise _Refused("numpy.core.multiarray._reconstruct", f"subtype {_brief(subtype)} is not numpy.ndarray")
    shape = _dims(shape, "numpy _reconstruct shape")
    if math.prod(shape) or not isinstance(dtype, (bytes, str, np.dtype)):
        # numpy pickles always start from an empty array, _reconstruct(ndarray, (0,), b'b'),
        # and carry the data in the state; anything else would allocate what the file names.
        raise _Refused("numpy.core.multiarray._reconstruct", f"shape {shape} and dtype {_brief(dtype)}; "
                       "numpy pickles reconstruct an empty array")
    return np.ndarray.__new__(np.ndarray, shape, dtype)


def _check_array_state(state: Any) -> None:
    """The state a pickle BUILDs a numpy array with must hold the data its shape declares:
    ``ndarray.__setstate__`` allocates shape x itemsize for object arrays before it counts the
    items it is given."""
    if isinstance(state, tuple) and len(state) == 5:  # (version, shape, dtype, fortran, data)
        state = state[1:]
    if not (isinstance(state, tuple) and len(state) == 4):
        raise _Corrupt(f"numpy array state is {_brief(state)}")
    shape, dtype, _fortran, raw = state
    shape = _dims(shape, "numpy array shape")
    if not isinstance(dtype, np.dtype):
        raise _Corrupt(f"numpy array dtype is {_brief(dtype)}")
    n = math.prod(shape)
    if dtype.hasobject:
        if dtype != np.dtype(object):  # an object subarray or field would multiply the allocation
            raise _Refused("numpy.ndarray", f"a structured or subarray object dtype {_brief(str(dtype))}")
        if not isinstance(raw, list) or len(raw) != n:
            got = f"{len(raw)} items" if isinstance(raw, list) else _brief(raw)
            raise _Corrupt(f"a numpy object array of shape {shape} needs {n} items, the pickle holds {got}")
    else:
        got = len(raw) if isinstance(raw, (bytes, bytearray, str)) else None
        if got != n * dtype.itemsize:
            raise _Corrupt(f"a numpy array of shape {shape} and dtype {_brief(str(dtype))} needs {n * dtype.itemsize} "
                           f"bytes, the pickle holds {got if got is not None else _brief(raw)}")


_DTYPE_SPEC = re.compile(r"[<>=|]?[A-Za-z][A-Za-z0-9]*")


def _np_dtype_ctor(spec: Any, align: Any = False, copy: Any = False) -> np.dtype:
    # numpy pickles a dtype as dtype("f8"/"V12"/"U5", align, copy=True) and sets fields, byte
    # order and subarray shape through BUILD. "copy" matters: without it BUILD would go to
    # numpy's shared instance (which ignores it: a big-endian dtype came back native).
    if not isinstance(spec, str) or not _DTYPE_SPEC.fullmatch(spec):
        raise _Refused("numpy.dtype", f"argument {_brief(spec)} is not a type code")
    return np.dtype(spec, bool(align), bool(copy))


def _np_scalar(dtype: Any, data: Any = None) -> Any:
    if not isinstance(dtype, np.dtype):
        raise _Refused("numpy.core.multiarray.scalar", f"dtype {_brief(dtype)}")
    if dtype.hasobject:
        return data
    if not isinstance(data, (bytes, bytearray)) or len(data) < dtype.itemsize:
        got = len(data) if isinstance(data, (bytes, bytearray)) else _brief(data)
        raise _Corrupt(f"a numpy scalar of dtype {_brief(str(dtype))} needs {dtype.itemsize} bytes, "
                       f"the pickle holds {got}")
    return np.frombuffer(data, dtype=dtype, count=1)[0]


# Immutable built-in types whose constructors take fixed-size arguments are handed out as
# themselves; everything else goes through a checking function.
_ALLOWED: dict[str, Any] = {
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
    "torch._utils._rebuild_tensor": _rebuild_tensor,
    "torch._utils._rebuild_tensor_v2": _rebuild_tensor_v2,
    "torch._utils._rebuild_tensor_v3": _rebuild_tensor_v3,
    "torch._utils._rebuild_parameter": _rebuild_parameter,
    "torch._utils._rebuild_parameter_with_state": _rebuild_parameter,
    "torch._tensor._rebuild_from_type_v2": _rebuild_from_type_v2,
    "torch._tensor._rebuild_from_type": _rebuild_from_type,
    "torch.Size": _torch_size,
    "torch.device": _torch_device,
    "numpy.dtype": _np_dtype_ctor,
}
for _cls in ("Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"):
    _FUNCTIONS[f"pathlib.{_cls}"] = _pure_path
for _mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
    _FUNCTIONS[f"{_mod}._reconstruct"] = _np_reconstruct
    _FUNCTIONS[f"{_mod}.scalar"] = _np_scalar
_ALLOWED.update({n: _Allowed(n, "fn", fn=f) for n, f in _FUNCTIONS.items()})
for _name, _dt in _STORAGE_DTYPES.items():
    _ALLOWED[f"torch.{_name}"] = _Allowed(f"torch.{_name}", "storage", dtype=_dt)
_ALLOWED["torch.storage.UntypedStorage"] = _Allowed("torch.storage.UntypedStorage", "storage", dtype=np.uint8)
for _name, _dt in _TORCH_DTYPES.items():
    _ALLOWED[f"torch.{_name}"] = _Allowed(f"torch.{_name}", "dtype", dtype=_dt)


# --- the unpickler -----------------------------------------------------------------------------

class _Done(Exception):
    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value


def _counted(fmt: str, make: Callable[[Any, bytes], Any] | None, signed_name: str = "") -> Callable:
    """A handler for an opcode that declares the length of the bytes after it: the length is
    checked against what is left before the read (a file's read(n) reserves n bytes first,
    and the C unpickler allocates the declared length outright)."""
    size = struct.calcsize(fmt)

    def handler(self: "_SafeUnpickler") -> None:
        (n,) = struct.unpack(fmt, self.read(size))
        left = self._end - self._tell()
        if n < 0 or n > left:
            raise _Truncated(f"{n} bytes are declared at byte {self._tell()} but only {left} remain")
        if make is not None:
            self.append(make(self, self.read(n)))
    return handler


class _SafeUnpickler(pickle._Unpickler):
    """Python's pure-Python unpickler with the allow-list, reading straight from ``f`` up to
    ``end``. Its memo is a dict (the C unpickler allocates an array as long as the largest memo
    index a file names), and the opcodes that take a length, a callable's arguments or an
    object's state from the file are checked first."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, f: BinaryIO, end: int, load_storage: Callable[[str, Any, Any], _Storage]) -> None:
        super().__init__(f)
        self._tell, self._end = f.tell, end
        self._load_storage = load_storage
        self._storages: dict[str, _Storage] = {}
        self._records: dict[tuple[str, str], type] = {}  # per load: nothing leaks between files

        def readline() -> bytes:
            line = f.readline(end - f.tell())  # never past the end, whatever follows
            if not line.endswith(b"\n"):
                raise _Truncated(f"a text argument runs to the end at byte {f.tell()}")
            return line
        # Read the file directly: no _Unframer (FRAME only groups the opcodes that follow it).
        self.read, self.readline, self.readinto = f.read, readline, f.readinto

    def load(self) -> Any:
        self.metastack, self.stack = [], []
        self.append = self.stack.append
        self.proto = 0
        read, dispatch = self.read, self.dispatch
        try:
            while True:
                key = read(1)
                if not key:
                    raise EOFError("the pickle ends before its STOP opcode")
                dispatch[key[0]](self)
        except _Done as done:
            return done.value

    def _load_stop(self) -> None:
        raise _Done(self.stack.pop())
    dispatch[pickle.STOP[0]] = _load_stop

    def find_class(self, module: str, name: str) -> Any:
        # Protocol <= 2 pickles spell Python 2 names (__builtin__.set); map them as pickle does.
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        found = _ALLOWED.get(f"{module}.{name}")
        if found is None:
            if (module, name) not in self._records:
                if len(self._records) >= _MAX_RECORD_TYPES:
                    raise _Corrupt(f"the pickle names more than {_MAX_RECORD_TYPES} classes")
                self._records[(module, name)] = _RecordType(
                    name, (Record,), {"_pickle_module": module, "_pickle_name": name})
            return self._records[(module, name)]
        return found

    def persistent_load(self, pid: Any) -> Any:
        if not isinstance(pid, tuple) or not pid:
            raise _Corrupt(f"unknown persistent id {_brief(pid)}")
        kind = pid[0].decode() if isinstance(pid[0], bytes) else pid[0]
        if kind == "module":  # legacy format: a module class saved with its source; keep the type
            return pid[1]
        if kind != "storage" or len(pid) < 5:
            raise _Corrupt(f"unknown persistent id {_brief(pid[:2])}")
        storage_type, key, numel = pid[1], pid[2], pid[4]
        if not (isinstance(storage_type, _Allowed) and storage_type.kind == "storage"):
            raise _Corrupt(f"unsupported storage type {_brief(storage_type)}")
        if not isinstance(key, str):
            raise _Corrupt(f"storage key {_brief(key)} is not a string")
        if key not in self._storages:
            self._storages[key] = self._load_storage(key, storage_type.dtype, numel)
        return self._storages[key]

    dispatch[pickle.BINSTRING[0]] = _counted("<i", lambda self, b: self._decode_string(b))
    dispatch[pickle.BINBYTES[0]] = _counted("<I", lambda self, b: b)
    dispatch[pickle.BINBYTES8[0]] = _counted("<Q", lambda self, b: b)
    dispatch[pickle.BYTEARRAY8[0]] = _counted("<Q", lambda self, b: bytearray(b))
    dispatch[pickle.BINUNICODE[0]] = _counted("<I", lambda self, b: str(b, "utf-8", "surrogatepass"))
    dispatch[pickle.BINUNICODE8[0]] = _counted("<Q", lambda self, b: str(b, "utf-8", "surrogatepass"))
    dispatch[pickle.LONG4[0]] = _counted("<i", lambda self, b: pickle.decode_long(b))
    dispatch[pickle.FRAME[0]] = _counted("<Q", None)  # checked, then read through

    def _load_reduce(self) -> None:
        args = self.stack.pop()
        if type(args) is not tuple:  # f(*args) of an array would unpack it element by element
            raise _Corrupt(f"REDUCE arguments are {_brief(args)}, not a tuple")
        self.stack[-1] = self.stack[-1](*args)
    dispatch[pickle.REDUCE[0]] = _load_reduce

    def _load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack.pop()
        if not isinstance(cls, type) or type(args) is not tuple:
            raise _Corrupt(f"NEWOBJ of {_brief(cls)} with {_brief(args)}")
        self.append(cls.__new__(cls, *args))
    dispatch[pickle.NEWOBJ[0]] = _load_newobj

    def _load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        if not isinstance(cls, type) or type(args) is not tuple or type(kwargs) is not dict:
            raise _Corrupt(f"NEWOBJ_EX of {_brief(cls)} with {_brief(args)}")
        self.append(cls.__new__(cls, *args, **kwargs))
    dispatch[pickle.NEWOBJ_EX[0]] = _load_newobj_ex

    def _load_build(self) -> None:
        inst = self.stack[-2]
        # Only records, numpy arrays and dtypes take pickled state (OrderedDict its __dict__;
        # _Allowed refuses it itself); a state on anything else would reach C code unchecked.
        if type(inst) is np.ndarray:
            _check_array_state(self.stack[-1])
        elif not isinstance(inst, (Record, _Allowed, np.dtype, OrderedDict)):
            raise _Corrupt(f"the pickle sets the state of {_brief(inst)}")
        pickle._Unpickler.dispatch[pickle.BUILD[0]](self)
    dispatch[pickle.BUILD[0]] = _load_build


# --- the two container formats -----------------------------------------------------------------

def read_torch_checkpoint(path: str | Path) -> Any:
    """The object ``torch.save`` stored, rebuilt from data only.

    Tensors come back as numpy arrays (bfloat16 as ``mx.array``), dicts/lists/tuples as such, and
    objects of other classes as :class:`Record`. Raises MlxnetError (naming the file) for a missing,
    truncated or corrupt file, for any pickled call outside the allow-list, and for sizes that
    the file declares but does not hold (see the module docstring).
    """
    path = Path(path)
    if not path.is_file():
        raise MlxnetError(f"checkpoint file not found: {path}")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic == b"PK\x03\x04":  # zipfile.is_zipfile would miss a truncated archive
            return _read_zip(path)
        if tarfile.is_tarfile(path):
            raise MlxnetError(f"{path}: the pre-1.0 tar checkpoint format is not supported; re-save it with torch.save")
        return _read_legacy(path)
    except _Refused as e:
        raise MlxnetError(f"{path}: refusing to call {e.name} from the pickle ({_one_line(e.why)}); "
                          "only tensors and plain data are loaded") from None
    except _Truncated as e:
        raise MlxnetError(f"{path}: truncated or corrupt PyTorch checkpoint ({_one_line(e)})") from None
    except _Corrupt as e:
        raise MlxnetError(f"{path}: corrupt PyTorch checkpoint: {_one_line(e)}") from None
    except MemoryError:
        raise MlxnetError(f"{path}: out of memory reading the checkpoint") from None
    except (pickle.UnpicklingError, EOFError, zipfile.BadZipFile, zlib.error, struct.error, ValueError, TypeError,
            IndexError, KeyError, AttributeError, UnicodeDecodeError, OverflowError, RecursionError,
            NotImplementedError) as e:
        raise MlxnetError(f"{path}: truncated or corrupt PyTorch checkpoint ({type(e).__name__}: {_one_line(e)})") from None
    except OSError as e:
        raise MlxnetError(f"{path}: cannot read the checkpoint ({_one_line(e)})") from None


class _ZipMembers:
    """Reads members of one archive with the limits of the module docstring: what each member
    declares is checked before it is read, and it is read in chunks up to that size only."""

    def __init__(self, zf: zipfile.ZipFile, archive_size: int) -> None:
        self.zf, self.archive_size = zf, archive_size
        self.stored = self.inflated = 0

    def read(self, info: zipfile.ZipInfo, expected: int | None = None, what: str = "") -> bytearray:
        name, size = info.filename, info.file_size
        if expected is not None and size != expected:
            raise _Corrupt(f"{name} holds {size} bytes but {what} needs {expected}")
        if info.flag_bits & 0x1:
            raise _Corrupt(f"{name} is encrypted")
        if info.compress_type == zipfile.ZIP_STORED:
            if info.compress_size != size:
                raise _Corrupt(f"{name} is stored but declares {info.compress_size} bytes in the archive for {size}")
            self.stored += size
            if self.stored > self.archive_size:  # entries that overlap reuse the same bytes
                raise _Corrupt(f"{name}: the stored members read so far hold {self.stored} bytes, "
                               f"more than the whole {self.archive_size}-byte archive (overlapping entries)")
        elif info.compress_type == zipfile.ZIP_DEFLATED:
            self.inflated += size
            limit = _INFLATION_SLACK + _MAX_INFLATION * self.archive_size
            if self.inflated > limit:
                raise _Corrupt(f"{name} inflates {info.compress_size} bytes to {size}; more than {limit} bytes in all "
                               f"from a {self.archive_size}-byte archive is refused")
        else:
            raise _Corrupt(f"{name} uses zip compression method {info.compress_type}; only stored and deflated "
                           "members are read")
        # Let zipfile hand over one byte more than the header declares, so that a stream longer
        # than its header says shows up (zipfile would cut it off there and only report a bad
        # CRC); the CRC is checked here instead, over exactly the declared bytes.
        probe = copy.copy(info)
        probe.file_size = size + 1
        del probe.CRC
        buf = bytearray(size)
        got = 0
        with self.zf.open(probe) as f:
            while got < size:
                chunk = f.read(min(_CHUNK, size - got))
                if not chunk:
                    raise _Truncated(f"{name} ends after {got} of its {size} bytes")
                buf[got:got + len(chunk)] = chunk
                got += len(chunk)
            if f.read(1):
                raise _Corrupt(f"{name} decompresses to more than the {size} bytes it declares")
        if zlib.crc32(buf) != info.CRC:
            raise _Corrupt(f"{name} fails its CRC check")
        return buf


def _read_zip(path: Path) -> Any:
    with zipfile.ZipFile(path) as zf:
        infos = {i.filename: i for i in zf.infolist()}
        pkls = [n for n in infos if n.count("/") == 1 and n.endswith("/data.pkl")]
        if not pkls:
            raise _Corrupt("zip archive without <name>/data.pkl (not a torch.save file)")
        root = pkls[0][: -len("data.pkl")]
        members = _ZipMembers(zf, path.stat().st_size)
        byteorder = "little"
        if root + "byteorder" in infos:
            info = infos[root + "byteorder"]
            if info.file_size > 16:
                raise _Corrupt(f"{info.filename} holds {info.file_size} bytes; expected 'little' or 'big'")
            byteorder = bytes(members.read(info)).decode()
            if byteorder not in ("little", "big"):
                raise _Corrupt(f"{info.filename} is {_brief(byteorder)}; expected 'little' or 'big'")

        def load_storage(key: str, dtype: Any, numel: Any) -> _Storage:
            name = f"{root}data/{key}"
            if name not in infos:
                raise _Corrupt(f"storage {name} is missing from the archive")
            count = _index(numel, f"storage {name}'s element count")
            itemsize = _np_dtype(dtype, byteorder).itemsize
            what = f"its storage of {count} {dtype if dtype == _BF16 else np.dtype(dtype).name} elements"
            return _Storage(dtype, members.read(infos[name], count * itemsize, what), byteorder, name)

        pkl = members.read(infos[pkls[0]])
        return _SafeUnpickler(io.BytesIO(pkl), len(pkl), load_storage).load()


def _read_legacy(path: Path) -> Any:
    size = path.stat().st_size
    with open(path, "rb") as f:
        def plain() -> Any:  # the small header pickles hold only ints and dicts
            return _SafeUnpickler(f, size, _no_storage).load()

        if plain() != _LEGACY_MAGIC:
            raise _Corrupt("bad magic number (not a torch.save file)")
        if plain() != _LEGACY_PROTOCOL:
            raise _Corrupt("unsupported legacy protocol version")
        sys_info = plain()
        byteorder = "little" if not isinstance(sys_info, dict) or sys_info.get("little_endian", True) else "big"
        start = f.tell()
        # The storages follow the pickle that refers to them: unpickle once to find where it
        # ends (tensors left empty), read the storages, then unpickle again with them.
        pending: dict[str, _Storage] = {}
        _SafeUnpickler(f, size, lambda key, dtype, numel: pending.setdefault(
            key, _Storage(dtype, None, byteorder, key))).load()
        keys = plain()
        if not isinstance(keys, list):
            raise _Corrupt(f"the storage key list is {_brief(keys)}")
        data: dict[str, _Storage] = {}
        for key in keys:
            if not isinstance(key, str) or key not in pending:
                raise _Corrupt(f"storage key {_brief(key)} is not referenced by the pickle")
            dtype = pending[key].dtype
            itemsize = _np_dtype(dtype, byteorder).itemsize
            head = f.read(8)
            if len(head) != 8:
                raise _Truncated(f"storage {key}'s element count is missing")
            (count,) = struct.unpack("<q", head)
            # The count is the file's word for how much follows: check it against what does
            # before reading (f.read(n) reserves n bytes first).
            left = size - f.tell()
            if count < 0 or count * itemsize > left:
                raise _Truncated(f"storage {key} declares {count} elements of {itemsize} bytes "
                                 f"({count * itemsize} bytes) but only {left} bytes remain in the file")
            data[key] = _Storage(dtype, f.read(count * itemsize), byteorder, key)
        f.seek(start)

        def load_storage(key: str, dtype: Any, numel: Any) -> _Storage:
            if key not in data:
                raise _Corrupt(f"storage {key} is missing")
            return data[key]

        return _SafeUnpickler(f, size, load_storage).load()


def _no_storage(key: str, dtype: Any, numel: Any) -> _Storage:
    raise _Corrupt("tensor data inside a header pickle")


# --- finding the state dict ----------------------------------------------------------------------

_STATE_KEYS = ("state_dict", "model_state_dict", "ema", "model", "module", "net", "params")


def is_tensor(x: Any) -> bool:
    return isinstance(x, (np.ndarray, mx.array))


def find_state_dict(obj: Any, key: str | None = None, *, source: str = "checkpoint") -> dict[str, Tensor]:
    """Flat ``{dotted name: tensor}`` from what :func:`read_torch_checkpoint` returned.

    ``key`` is a dotted path to follow first ("state_dict", "model"). Otherwise: a mapping of
    tensors is the state dict (nested mappings of tensors get dotted keys); a pickled ``nn.Module`` (a :class:`Record` with ``_modules``,
    ``_parameters``, ``_buffers``; e.g. ultralytics' ``ckpt["model"]``) is flattened like
    ``module.state_dict()``; a checkpoint dict is searched under ``state_dict`` (Lightning),
    ``model_state_dict``, ``ema``, ``model``, ``module``, ``net``, ``params``.
    """
    if key:
        for part in key.split("."):
            container = {**obj.items, **obj.attrs} if isinstance(obj, Record) else obj
            if not isinstance(container, Mapping) or part not in container:
                raise MlxnetError(f"{source}: no {key!r} in the checkpoint (missing {part!r})")
            obj = container[part]
    found = None
    if key is None and isinstance(obj, Mapping) and not all(is_tensor(v) for v in obj.values()):
        for k in _STATE_KEYS:  # a checkpoint wrapping its state dict: {"model": sd, "epoch": ...}
            found = _state_dict_of(obj[k]) if k in obj else None
            if found:
                break
    found = found or _state_dict_of(obj)
    if not found:
        what = f"top-level keys: {', '.join(map(str, list(obj)[:12]))}" if isinstance(obj, Mapping) else type(obj).__name__
        raise MlxnetError(f"{source}: no state dict found ({what}); name where it is (checkpoint_key)")
    return found


def _state_dict_of(obj: Any) -> dict[str, Tensor] | None:
    if isinstance(obj, Record) and "_modules" in obj.attrs:
        out: dict[str, Tensor] = {}
        _flatten_module(obj, "", out)
        return out
    if isinstance(obj, Record) and obj.items:  # a dict subclass outside the allow-list
        obj = obj.items
    if isinstance(obj, Mapping) and obj:
        out = {}
        if _flatten_tensors(obj, "", out):
            return out
    return None


def _flatten_tensors(obj: Mapping, prefix: str, out: dict) -> bool:
    """Nested mappings whose leaves are all tensors -> dotted keys; False if anything else is there."""
    for k, v in obj.items():
        name = f"{prefix}{k}"
        if is_tensor(v):
            out[name] = v
        elif not (isinstance(v, Mapping) and v and _flatten_tensors(v, name + ".", out)):
            return False
    return True


def _flatten_module(rec: Record, prefix: str, out: dict) -> None:
    attrs = rec.attrs
    skip = set(attrs.get("_non_persistent_buffers_set") or ())
    for group in ("_parameters", "_buffers"):
        for name, value in (attrs.get(group) or {}).items():
            if value is not None and not (group == "_buffers" and name in skip):
                out[prefix + name] = value
    for name, child in (attrs.get("_modules") or {}).items():
        if isinstance(child, Record):
            _flatten_module(child, f"{prefix}{name}.", out)
