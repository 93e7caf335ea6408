"""The legacy (before torch 1.6) file: the magic number, protocol and sys_info pickles, the
pickle itself, the list of storage keys, then each storage as an int64 element count and its
bytes. A storage's declared element count must fit in the bytes left in the file.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from ..file_kinds import Kind
from .errors import Corrupt, NotACheckpoint, Truncated
from .limits import brief
from .tensors import Storage, np_dtype
from .unpickler import SafeUnpickler

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001


def read_legacy(path: Path) -> Any:
    size = path.stat().st_size
    with open(path, "rb") as f:
        def plain() -> Any:  # the small header pickles hold only ints and dicts
            return SafeUnpickler(f, size, _no_storage).load()

        if plain() != LEGACY_MAGIC:
            raise NotACheckpoint(Kind("a Python pickle without torch.save's magic number"))
        if plain() != LEGACY_PROTOCOL:
            raise Corrupt("unsupported legacy protocol version")
        sys_info = plain()
        byteorder = "little" if not isinstance(sys_info, dict) or sys_info.get("little_endian", True) else "big"
        start = f.tell()
        # The storages follow the pickle that refers to them: unpickle once to find where it
        # ends (tensors left empty), read the storages, then unpickle again with them.
        pending: dict[str, Storage] = {}
        SafeUnpickler(f, size, lambda key, dtype, numel: pending.setdefault(
            key, Storage(dtype, None, byteorder, key))).load()
        keys = plain()
        if not isinstance(keys, list):
            raise Corrupt(f"the storage key list is {brief(keys)}")
        data: dict[str, Storage] = {}
        for key in keys:
            if not isinstance(key, str) or key not in pending:
                raise Corrupt(f"storage key {brief(key)} is not referenced by the pickle")
            dtype = pending[key].dtype
            itemsize = np_dtype(dtype, byteorder).itemsize
            head = f.read(8)
            if len(head) != 8:
                raise Truncated(f"storage {key}'s element count is missing")
            (count,) = struct.unpack("<q", head)
            # The count is the file's word for how much follows: check it against what does
            # before reading (f.read(n) reserves n bytes first).
            left = size - f.tell()
            if count < 0 or count * itemsize > left:
                raise Truncated(f"storage {key} declares {count} elements of {itemsize} bytes "
                                f"({count * itemsize} bytes) but only {left} bytes remain in the file")
            data[key] = Storage(dtype, f.read(count * itemsize), byteorder, key)
        f.seek(start)

        def load_storage(key: str, dtype: Any, numel: Any) -> Storage:
            if key not in data:
                raise Corrupt(f"storage {key} is missing")
            return data[key]

        return SafeUnpickler(f, size, load_storage).load()


def _no_storage(key: str, dtype: Any, numel: Any) -> Storage:
    raise Corrupt("tensor data inside a header pickle")
