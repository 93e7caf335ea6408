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
"""
from __future__ import annotations

import _compat_pickle
import datetime
import io
import pickle
import struct
import tarfile
import zipfile
from collections import OrderedDict
from pathlib import Path, PurePath
from typing import Any, Callable, Mapping, Union

import mlx.core as mx
import numpy as np

from ..errors import MlxnetError

Tensor = Union[np.ndarray, mx.array]  # numpy, except bfloat16 (numpy has none): an mx.array
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001


class _Refused(Exception):
    def __init__(self, name: str, why: str = "not on the allow-list") -> None:
        super().__init__(name, why)
        self.name, self.why = name, why


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
    """One allow-listed name: a safe callable (``fn``) or a marker (a storage type or torch dtype,
    ``dtype``). Frozen, so a pickle BUILD cannot alter what later loads see."""

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
    """Raw bytes of one torch storage (None while the legacy format's first pass runs)."""

    def __init__(self, dtype: Any, data: bytes | None, byteorder: str) -> None:
        self.dtype, self.data, self.byteorder = dtype, data, byteorder


def _np_dtype(dtype: Any, byteorder: str) -> np.dtype:
    base = np.dtype(np.uint16 if dtype == _BF16 else dtype)
    return base.newbyteorder("<" if byteorder == "little" else ">")


def _tensor(storage: Any, offset: int, size: Any, stride: Any, dtype: Any = None) -> Tensor | None:
    if not isinstance(storage, _Storage):
        raise _Refused("torch._utils._rebuild_tensor", f"its storage is a {type(storage).__name__}")
    dtype = storage.dtype if dtype is None else dtype
    if storage.data is None:
        return None
    size, stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)
    dt = _np_dtype(dtype, storage.byteorder)
    flat = np.frombuffer(storage.data, dtype=dt, count=len(storage.data) // dt.itemsize)
    if 0 in size:
        arr = np.zeros(size, dtype=dt.newbyteorder("="))
    else:
        last = offset + sum((n - 1) * s for n, s in zip(size, stride))
        if offset < 0 or min(stride, default=0) < 0 or last >= flat.size:
            raise _Corrupt(f"a tensor of shape {size} at offset {offset} overruns its storage of {flat.size} elements")
        view = np.lib.stride_tricks.as_strided(flat[offset:], size, [s * dt.itemsize for s in stride])
        arr = np.array(view, dtype=dt.newbyteorder("="))  # own contiguous copy in native order
    if dtype == _BF16:
        return mx.array(arr).view(mx.bfloat16)
    return arr


class _Corrupt(Exception):
    pass


def _rebuild_tensor(storage, storage_offset, size, stride):
    return _tensor(storage, storage_offset, size, stride)


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks, metadata=None):
    t = _tensor(storage, storage_offset, size, stride)
    if isinstance(metadata, dict) and metadata.get("neg") and t is not None:  # a saved negative view
        t = -t
    return t


def _rebuild_tensor_v3(storage, storage_offset, size, stride, requires_grad, backward_hooks, dtype, metadata=None):
    if not (isinstance(dtype, _Allowed) and dtype.kind == "dtype"):
        raise _Refused("torch._utils._rebuild_tensor_v3", f"unsupported dtype {dtype!r}")
    return _tensor(storage, storage_offset, size, stride, dtype.dtype)


def _rebuild_parameter(data, requires_grad, backward_hooks, state=None):
    return data


def _rebuild_from_type_v2(func, new_type, args, state):
    return func(*args)  # func came through find_class: a rebuild above, or a record type (refused)


def _rebuild_from_type(func, new_type, args, state):
    return func(*args)


def _codecs_encode(text: Any, encoding: str = "utf-8") -> bytes:
    # Protocol-2 pickles spell bytes as _codecs.encode(str, "latin1").
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise _Refused("_codecs.encode", f"only (str, 'latin1') is allowed, got encoding {encoding!r}")
    return text.encode("latin1")


def _torch_size(dims: Any = ()) -> tuple:
    return tuple(int(d) for d in dims)


def _torch_device(kind: Any, index: Any = None) -> str:
    return f"{kind}:{index}" if index is not None else str(kind)


def _pure_path(*parts: Any) -> PurePath:
    # Path objects in hyper-parameters: kept as pure paths (no file system access).
    if not all(isinstance(p, str) for p in parts):
        raise _Refused("pathlib.Path", f"arguments {parts!r} are not strings")
    return PurePath(*parts)


def _np_reconstruct(subtype: Any, shape: Any, dtype: Any) -> np.ndarray:
    if subtype is not np.ndarray:
        raise _Refused("numpy.core.multiarray._reconstruct", f"subtype {subtype!r} is not numpy.ndarray")
    return np.ndarray.__new__(np.ndarray, shape, dtype)


def _np_dtype_ctor(spec: Any, align: bool = False, copy: bool = False) -> np.dtype:
    if not isinstance(spec, str):
        raise _Refused("numpy.dtype", f"argument {spec!r} is not a type string")
    return np.dtype(spec)


def _np_scalar(dtype: Any, data: Any = None) -> Any:
    if not isinstance(dtype, np.dtype):
        raise _Refused("numpy.core.multiarray.scalar", f"dtype {dtype!r}")
    if dtype.hasobject:
        return data
    return np.frombuffer(data, dtype=dtype, count=1)[0]


# Built-in types are immutable, so they are handed out as themselves; functions get wrapped.
_ALLOWED: dict[str, Any] = {
    "collections.OrderedDict": OrderedDict,
    "builtins.set": set,
    "builtins.frozenset": frozenset,
    "builtins.slice": slice,
    "builtins.complex": complex,
    "builtins.bytearray": bytearray,
    "numpy.ndarray": np.ndarray,
    "datetime.datetime": datetime.datetime,
    "datetime.date": datetime.date,
    "datetime.time": datetime.time,
    "datetime.timedelta": datetime.timedelta,
    "datetime.timezone": datetime.timezone,
}
_FUNCTIONS: dict[str, Callable] = {
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


class _SafeUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, load_storage: Callable[[str, Any], _Storage]) -> None:
        super().__init__(file)
        self._load_storage = load_storage
        self._storages: dict[str, _Storage] = {}
        self._records: dict[tuple[str, str], type] = {}  # per load: nothing leaks between files

    def find_class(self, module: str, name: str) -> Any:
        # Protocol <= 2 pickles spell Python 2 names (__builtin__.set); map them as pickle does.
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        found = _ALLOWED.get(f"{module}.{name}")
        if found is None:
            if (module, name) not in self._records:
                self._records[(module, name)] = _RecordType(
                    name, (Record,), {"_pickle_module": module, "_pickle_name": name})
            return self._records[(module, name)]
        return found

    def persistent_load(self, pid: Any) -> Any:
        if not isinstance(pid, tuple) or not pid:
            raise _Corrupt(f"unknown persistent id {pid!r}")
        kind = pid[0].decode() if isinstance(pid[0], bytes) else pid[0]
        if kind == "module":  # legacy format: a module class saved with its source; keep the type
            return pid[1]
        if kind != "storage" or len(pid) < 5:
            raise _Corrupt(f"unknown persistent id {pid[:2]!r}")
        storage_type, key = pid[1], str(pid[2])
        if not (isinstance(storage_type, _Allowed) and storage_type.kind == "storage"):
            raise _Corrupt(f"unsupported storage type {storage_type!r}")
        if key not in self._storages:
            self._storages[key] = self._load_storage(key, storage_type.dtype)
        return self._storages[key]


# --- the two container formats -----------------------------------------------------------------

def read_torch_checkpoint(path: str | Path) -> Any:
    """The object ``torch.save`` stored, rebuilt from data only.

    Tensors come back as numpy arrays (bfloat16 as ``mx.array``), dicts/lists/tuples as such, and
    objects of other classes as :class:`Record`. Raises MlxnetError (naming the file) for a missing,
    truncated or corrupt file and for any pickled call outside the allow-list.
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
        raise MlxnetError(f"{path}: refusing to call {e.name} from the pickle ({e.why}); "
                          "only tensors and plain data are loaded") from None
    except _Corrupt as e:
        raise MlxnetError(f"{path}: corrupt PyTorch checkpoint: {e}") from None
    except (pickle.UnpicklingError, EOFError, zipfile.BadZipFile, struct.error, ValueError, TypeError,
            IndexError, KeyError, AttributeError, UnicodeDecodeError, OverflowError) as e:
        raise MlxnetError(f"{path}: truncated or corrupt PyTorch checkpoint "
                          f"({type(e).__name__}: {e})") from None


def _read_zip(path: Path) -> Any:
    with zipfile.ZipFile(path) as zf:
        pkls = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith("/data.pkl")]
        if not pkls:
            raise _Corrupt("zip archive without <name>/data.pkl (not a torch.save file)")
        root = pkls[0][: -len("data.pkl")]
        names = set(zf.namelist())
        byteorder = zf.read(root + "byteorder").decode() if root + "byteorder" in names else "little"

        def load_storage(key: str, dtype: Any) -> _Storage:
            name = f"{root}data/{key}"
            if name not in names:
                raise _Corrupt(f"storage {name} is missing from the archive")
            return _Storage(dtype, zf.read(name), byteorder)

        return _SafeUnpickler(io.BytesIO(zf.read(pkls[0])), load_storage).load()


def _read_legacy(path: Path) -> Any:
    with open(path, "rb") as f:
        def plain() -> Any:  # the small header pickles hold only ints and dicts
            return _SafeUnpickler(f, _no_storage).load()

        if plain() != _LEGACY_MAGIC:
            raise _Corrupt("bad magic number (not a torch.save file)")
        if plain() != _LEGACY_PROTOCOL:
            raise _Corrupt("unsupported legacy protocol version")
        sys_info = plain()
        byteorder = "little" if not isinstance(sys_info, dict) or sys_info.get("little_endian", True) else "big"
        start = f.tell()
        # The storages follow the pickle that refers to them: unpickle once to find where it
        # ends (tensors left empty), read the storages, then unpickle again with them.
        pending: dict[str, Any] = {}
        _SafeUnpickler(f, lambda key, dtype: pending.setdefault(key, _Storage(dtype, None, byteorder))).load()
        keys = plain()
        data: dict[str, _Storage] = {}
        for key in keys:
            if key not in pending:
                raise _Corrupt(f"storage key {key!r} is not referenced by the pickle")
            dtype = pending[key].dtype
            (count,) = struct.unpack("<q", f.read(8))
            nbytes = count * _np_dtype(dtype, byteorder).itemsize
            raw = f.read(nbytes)
            if len(raw) != nbytes or count < 0:
                raise _Corrupt(f"storage {key} is truncated ({len(raw)} of {nbytes} bytes)")
            data[key] = _Storage(dtype, raw, byteorder)
        f.seek(start)

        def load_storage(key: str, dtype: Any) -> _Storage:
            if key not in data:
                raise _Corrupt(f"storage {key} is missing")
            return data[key]

        return _SafeUnpickler(f, load_storage).load()


def _no_storage(key: str, dtype: Any) -> _Storage:
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
