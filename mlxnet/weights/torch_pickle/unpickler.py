"""The restricted pickle machine: Python's pure-Python unpickler, with names resolved through the
allow-list (:mod:`.allowlist`) and every opcode that takes a length, a callable's arguments or an
object's state from the file checked first.

* It runs on the pure-Python unpickler because its memo is a dict (the C one allocates an array
  as long as the largest memo index a file names).
* The length every ``BINBYTES``/``BINUNICODE``/``BYTEARRAY8``/``LONG4``/``FRAME`` declares is
  checked against the bytes left before it is read (the C one reserves the declared length first).
* ``REDUCE`` calls only what ``find_class`` handed out: an allow-listed callable, or a record
  type, which refuses the call (:mod:`.records`).

What remains is the pickle's own objects: memory in proportion to the pickle's length.
"""
from __future__ import annotations

import _compat_pickle
import pickle
import struct
from collections import OrderedDict
from typing import Any, BinaryIO, Callable

import numpy as np

from .allowlist import ALLOWED, check_array_state
from .errors import Corrupt, Truncated
from .limits import MAX_RECORD_TYPES, brief
from .records import Allowed, Record, RecordType
from .tensors import Storage

StorageLoader = Callable[[str, Any, Any], Storage]  # (key, dtype, declared element count) -> storage

class _Done(Exception):
    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value


def _counted(fmt: str, make: Callable[[Any, bytes], Any] | None, signed_name: str = "") -> Callable:
    """A handler for an opcode that declares the length of the bytes after it: the length is
    checked against what is left before the read (a file's read(n) reserves n bytes first,
    and the C unpickler allocates the declared length outright)."""
    size = struct.calcsize(fmt)

    def handler(self: "SafeUnpickler") -> None:
        (n,) = struct.unpack(fmt, self.read(size))
        left = self._end - self._tell()
        if n < 0 or n > left:
            raise Truncated(f"{n} bytes are declared at byte {self._tell()} but only {left} remain")
        if make is not None:
            self.append(make(self, self.read(n)))
    return handler


class SafeUnpickler(pickle._Unpickler):
    """Python's pure-Python unpickler with the allow-list, reading straight from ``f`` up to
    ``end``. Its memo is a dict (the C unpickler allocates an array as long as the largest memo
    index a file names), and the opcodes that take a length, a callable's arguments or an
    object's state from the file are checked first."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, f: BinaryIO, end: int, load_storage: StorageLoader) -> None:
        super().__init__(f)
        self._tell, self._end = f.tell, end
        self._load_storage = load_storage
        self._storages: dict[str, Storage] = {}
        self._records: dict[tuple[str, str], type] = {}  # per load: nothing leaks between files

        def readline() -> bytes:
            line = f.readline(end - f.tell())  # never past the end, whatever follows
            if not line.endswith(b"\n"):
                raise Truncated(f"a text argument runs to the end at byte {f.tell()}")
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
        found = ALLOWED.get(f"{module}.{name}")
        if found is None:
            if (module, name) not in self._records:
                if len(self._records) >= MAX_RECORD_TYPES:
                    raise Corrupt(f"the pickle names more than {MAX_RECORD_TYPES} classes")
                self._records[(module, name)] = RecordType(
                    name, (Record,), {"_pickle_module": module, "_pickle_name": name})
            return self._records[(module, name)]
        return found

    def persistent_load(self, pid: Any) -> Any:
        if not isinstance(pid, tuple) or not pid:
            raise Corrupt(f"unknown persistent id {brief(pid)}")
        kind = pid[0].decode() if isinstance(pid[0], bytes) else pid[0]
        if kind == "module":  # legacy format: a module class saved with its source; keep the type
            return pid[1]
        if kind != "storage" or len(pid) < 5:
            raise Corrupt(f"unknown persistent id {brief(pid[:2])}")
        storage_type, key, numel = pid[1], pid[2], pid[4]
        if not (isinstance(storage_type, Allowed) and storage_type.kind == "storage"):
            raise Corrupt(f"unsupported storage type {brief(storage_type)}")
        if not isinstance(key, str):
            raise Corrupt(f"storage key {brief(key)} is not a string")
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
            raise Corrupt(f"REDUCE arguments are {brief(args)}, not a tuple")
        self.stack[-1] = self.stack[-1](*args)
    dispatch[pickle.REDUCE[0]] = _load_reduce

    def _load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack.pop()
        if not isinstance(cls, type) or type(args) is not tuple:
            raise Corrupt(f"NEWOBJ of {brief(cls)} with {brief(args)}")
        self.append(cls.__new__(cls, *args))
    dispatch[pickle.NEWOBJ[0]] = _load_newobj

    def _load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        if not isinstance(cls, type) or type(args) is not tuple or type(kwargs) is not dict:
            raise Corrupt(f"NEWOBJ_EX of {brief(cls)} with {brief(args)}")
        self.append(cls.__new__(cls, *args, **kwargs))
    dispatch[pickle.NEWOBJ_EX[0]] = _load_newobj_ex

    def _load_build(self) -> None:
        inst = self.stack[-2]
        # Only records, numpy arrays and dtypes take pickled state (OrderedDict its __dict__;
        # Allowed refuses it itself); a state on anything else would reach C code unchecked.
        if type(inst) is np.ndarray:
            check_array_state(self.stack[-1])
        elif not isinstance(inst, (Record, Allowed, np.dtype, OrderedDict)):
            raise Corrupt(f"the pickle sets the state of {brief(inst)}")
        pickle._Unpickler.dispatch[pickle.BUILD[0]](self)
    dispatch[pickle.BUILD[0]] = _load_build
