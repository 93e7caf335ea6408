"""Redirect a loaded shared library's imported functions (Linux, 64-bit little-endian ELF).

A shared library calls the functions it imports through its global offset table (GOT): one
pointer per import, filled by the dynamic linker. Python loads extensions with RTLD_NOW, so by
the time ``mlx.core`` is imported every pointer already targets the library MLX was linked
against. Rewriting those pointers redirects the calls of that one library and of no other: the
process's symbol scope, other libraries' bindings and the files on disk stay as they were.
"""
from __future__ import annotations

import ctypes
import mmap
import struct
from pathlib import Path
from typing import Callable

# Relocation types that fill a GOT slot with a function's address, by ELF machine.
_SLOT_TYPES = {62: {6, 7},          # x86-64: R_X86_64_GLOB_DAT, R_X86_64_JUMP_SLOT
               183: {1025, 1026}}   # AArch64: R_AARCH64_GLOB_DAT, R_AARCH64_JUMP_SLOT
_SHT_RELA, _SHT_DYNSYM = 4, 11
_PROT_READ, _PROT_WRITE = 1, 2


class _PhdrInfo(ctypes.Structure):
    _fields_ = [("addr", ctypes.c_size_t), ("name", ctypes.c_char_p)]


_ITERATE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_PhdrInfo), ctypes.c_size_t, ctypes.c_void_p)


def loaded_objects() -> dict[str, int]:
    """Path -> load address of every shared object in the process (``dl_iterate_phdr``)."""
    found: dict[str, int] = {}

    def visit(info, _size, _data) -> int:
        name = info.contents.name
        if name:
            found[name.decode(errors="replace")] = info.contents.addr
        return 0
    libc = ctypes.CDLL(None)
    libc.dl_iterate_phdr(_ITERATE(visit), None)
    return found


def import_slots(path: Path) -> dict[str, list[int]]:
    """Imported function name -> offsets (from the load address) of the GOT slots holding it."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as image:
        if image[:4] != b"\x7fELF" or image[4] != 2 or image[5] != 1:
            raise OSError(f"{path.name}: not a 64-bit little-endian ELF file")
        machine, = struct.unpack_from("<H", image, 18)
        if machine not in _SLOT_TYPES:
            raise OSError(f"{path.name}: ELF machine {machine} is not x86-64 or AArch64")
        shoff, = struct.unpack_from("<Q", image, 40)
        shentsize, shnum = struct.unpack_from("<HH", image, 58)
        sections = [struct.unpack_from("<IIQQQQIIQQ", image, shoff + i * shentsize) for i in range(shnum)]
        slots: dict[str, list[int]] = {}
        for _name, kind, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
            if kind != _SHT_RELA or sections[link][1] != _SHT_DYNSYM:
                continue
            symtab = sections[link]
            strtab_offset = sections[symtab[6]][4]
            for at in range(offset, offset + size, entsize or 24):
                r_offset, r_info = struct.unpack_from("<QQ", image, at)
                if r_info & 0xFFFFFFFF not in _SLOT_TYPES[machine]:
                    continue
                st_name, = struct.unpack_from("<I", image, symtab[4] + (r_info >> 32) * 24)
                end = image.find(b"\0", strtab_offset + st_name)
                name = image[strtab_offset + st_name:end].decode(errors="replace")
                slots.setdefault(name, []).append(r_offset)
        return slots


def _page_protection(address: int) -> int:
    """PROT_* bits of the mapping that holds ``address`` (from /proc/self/maps)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, perms = line.split()[:2]
            lo, hi = (int(v, 16) for v in span.split("-"))
            if lo <= address < hi:
                return (_PROT_READ if perms[0] == "r" else 0) | (_PROT_WRITE if perms[1] == "w" else 0)
    raise OSError(f"address {address:#x} is not mapped")


def rebind(path: Path, base: int, target: Callable[[str], int | None]) -> list[str]:
    """Point every GOT slot of the object loaded from ``path`` at ``base`` whose function
    ``target(name)`` resolves to an address; returns the names redirected."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    page = mmap.PAGESIZE
    done = []
    for name, offsets in sorted(import_slots(path).items()):
        address = target(name)
        if address is None:
            continue
        for offset in offsets:
            slot = base + offset
            start = slot & ~(page - 1)
            protection = _page_protection(slot)
            if not protection & _PROT_WRITE:  # full RELRO: writable only for this store
                if libc.mprotect(start, page, protection | _PROT_WRITE) != 0:
                    raise OSError(ctypes.get_errno(), f"mprotect failed for {name}'s GOT slot")
            ctypes.c_void_p.from_address(slot).value = address
            if not protection & _PROT_WRITE:
                libc.mprotect(start, page, protection)
        done.append(name)
    return done
