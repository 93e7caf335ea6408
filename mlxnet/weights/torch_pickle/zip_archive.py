"""The zip container ``torch.save`` writes since torch 1.6: ``<name>/data.pkl``, the storages as
``<name>/data/<key>`` and optionally ``<name>/byteorder``.

Every member is checked against what it declares before it is read:

* A storage member must hold exactly element count x dtype size bytes, read in chunks and never
  past that (a member that decompresses to more is an error); the buffer grows with the bytes
  that arrive, so memory follows what the archive holds, not what its headers declare.
* Stored members together may not exceed the archive (overlapping entries); deflated ones may
  inflate to at most 16x the archive + 16 MiB in all (torch writes them stored, so a real
  checkpoint reads 1x); other compression methods and encrypted members are refused.
"""
from __future__ import annotations

import copy
import io
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from ..file_kinds import zip_contents
from .errors import Corrupt, NotACheckpoint, Truncated
from .limits import CHUNK, INFLATION_SLACK, MAX_INFLATION, brief, index
from .tensors import BF16, Storage, np_dtype
from .unpickler import SafeUnpickler


class ZipMembers:
    """Reads members of one archive with the limits of the module docstring: what each member
    declares is checked before it is read, and it is read in chunks up to that size only."""

    def __init__(self, zf: zipfile.ZipFile, archive_size: int) -> None:
        self.zf, self.archive_size = zf, archive_size
        self.stored = self.inflated = 0

    def read(self, info: zipfile.ZipInfo, expected: int | None = None, what: str = "") -> bytearray:
        name, size = info.filename, info.file_size
        if expected is not None and size != expected:
            raise Corrupt(f"{name} holds {size} bytes but {what} needs {expected}")
        if info.flag_bits & 0x1:
            raise Corrupt(f"{name} is encrypted")
        if info.compress_type == zipfile.ZIP_STORED:
            if info.compress_size != size:
                raise Corrupt(f"{name} is stored but declares {info.compress_size} bytes in the archive for {size}")
            self.stored += size
            if self.stored > self.archive_size:  # entries that overlap reuse the same bytes
                raise Corrupt(f"{name}: the stored members read so far hold {self.stored} bytes, "
                              f"more than the whole {self.archive_size}-byte archive (overlapping entries)")
        elif info.compress_type == zipfile.ZIP_DEFLATED:
            self.inflated += size
            limit = INFLATION_SLACK + MAX_INFLATION * self.archive_size
            if self.inflated > limit:
                raise Corrupt(f"{name} inflates {info.compress_size} bytes to {size}; more than {limit} bytes in all "
                              f"from a {self.archive_size}-byte archive is refused")
        else:
            raise Corrupt(f"{name} uses zip compression method {info.compress_type}; only stored and deflated "
                          "members are read")
        # Let zipfile hand over one byte more than the header declares, so that a stream longer
        # than its header says shows up (zipfile would cut it off there and only report a bad
        # CRC); the CRC is checked here instead, over exactly the declared bytes.
        probe = copy.copy(info)
        probe.file_size = size + 1
        del probe.CRC
        # The buffer grows as bytes arrive, never to the declared size up front: a deflated
        # member declaring gigabytes that inflates to a few bytes costs those few bytes.
        buf = bytearray()
        with self.zf.open(probe) as f:
            while len(buf) < size:
                chunk = f.read(min(CHUNK, size - len(buf)))
                if not chunk:
                    raise Truncated(f"{name} ends after {len(buf)} of its {size} bytes")
                buf += chunk
            if f.read(1):
                raise Corrupt(f"{name} decompresses to more than the {size} bytes it declares")
        if zlib.crc32(buf) != info.CRC:
            raise Corrupt(f"{name} fails its CRC check")
        return buf


def read_zip(path: Path) -> Any:
    with zipfile.ZipFile(path) as zf:
        infos = {i.filename: i for i in zf.infolist()}
        pkls = [n for n in infos if n.count("/") == 1 and n.endswith("/data.pkl")]
        if not pkls:
            raise NotACheckpoint(zip_contents(path))
        root = pkls[0][: -len("data.pkl")]
        members = ZipMembers(zf, path.stat().st_size)
        byteorder = "little"
        if root + "byteorder" in infos:
            info = infos[root + "byteorder"]
            if info.file_size > 16:
                raise Corrupt(f"{info.filename} holds {info.file_size} bytes; expected 'little' or 'big'")
            byteorder = bytes(members.read(info)).decode()
            if byteorder not in ("little", "big"):
                raise Corrupt(f"{info.filename} is {brief(byteorder)}; expected 'little' or 'big'")

        def load_storage(key: str, dtype: Any, numel: Any) -> Storage:
            name = f"{root}data/{key}"
            if name not in infos:
                raise Corrupt(f"storage {name} is missing from the archive")
            count = index(numel, f"storage {name}'s element count")
            itemsize = np_dtype(dtype, byteorder).itemsize
            what = f"its storage of {count} {dtype if dtype == BF16 else np.dtype(dtype).name} elements"
            return Storage(dtype, members.read(infos[name], count * itemsize, what), byteorder, name)

        pkl = members.read(infos[pkls[0]])
        return SafeUnpickler(io.BytesIO(pkl), len(pkl), load_storage).load()
