"""Type-check a kernel's Metal rendering with clang (libclang, from PyPI), without a Mac.

The rendered source is what ``mx.fast.metal_kernel`` generates (see ``Launch.metal_source``);
``metal_shim.h`` stands where MLX's preamble stands. Clang parses it as C++14 (Metal's base)
with Metal's address spaces enforced. Two spellings that are Metal but not C++ are rewritten,
and only those:

- ``threadgroup T name[N];`` declarations in a kernel get ``static``: threadgroup memory is
  shared by the group, which C++ can only express as static storage (clang refuses an address
  space on an automatic variable);
- MLX's explicit instantiation ``template [[host_name("…")]] [[kernel]] decltype(f<…>) f<…>;``
  loses its two attribute lists, which C++ does not allow there. The instantiation itself
  stays, so every template body is checked with the real template arguments.

Warnings (Metal's own attributes, unknown to clang) are ignored; every error is reported.
"""
from __future__ import annotations

import re
from pathlib import Path

SHIM = Path(__file__).with_name("metal_shim.h")
_THREADGROUP_ARRAY = re.compile(r"^(\s*)((?:threadgroup|MX_SHARED)\s+\w+\s+\w+\s*\[)", re.MULTILINE)
_INSTANTIATION = re.compile(r"^template \[\[host_name\(\"\w+\"\)\]\] \[\[kernel\]\] ", re.MULTILINE)
_ARGS = ["-x", "c++", "-std=c++14", "-fsyntax-only", "-nostdinc", "-nostdinc++",
         "-Wno-unknown-attributes", "-ferror-limit=0"]


def as_cxx(source: str) -> str:
    """The shim and the source, with the two Metal-only spellings rewritten (see above)."""
    body = _THREADGROUP_ARRAY.sub(r"\1static \2", source)
    body = _INSTANTIATION.sub("template ", body)
    return SHIM.read_text() + "\n#line 1 \"kernel.metal\"\n" + body


def metal_errors(source: str) -> list[str]:
    """clang's errors for one rendered Metal kernel ('line: message'), empty when it checks."""
    import clang.cindex as cindex  # the libclang wheel (test extra)

    index = cindex.Index.create()
    tu = index.parse("kernel.cpp", args=_ARGS, unsaved_files=[("kernel.cpp", as_cxx(source))])
    return [f"{d.location.line}: {d.spelling}" for d in tu.diagnostics
            if d.severity >= cindex.Diagnostic.Error]
