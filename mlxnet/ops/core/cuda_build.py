"""mlxnet's CUDA kernels, compiled once per machine instead of once per process.

``mx.fast.cuda_kernel`` compiles its kernel with NVRTC in every process that launches it (MLX
keeps those builds in memory only), against MLX's device headers: 1.5–2.5 s a kernel, so a
process that trains a detector spent about 5 s compiling its three pooling kernels before the
first step. Here a launch's whole kernel is generated as plain CUDA (no MLX headers; the fp16
and bf16 headers only where a dtype needs them), compiled by the NVRTC that MLX's CUDA build
already uses, for this GPU's architecture, and the binary is kept in mlxnet's cache
(``~/.cache/mlxnet/cuda/<key>/``, the key naming the NVRTC version and the architecture), each
file published atomically with its digest. MLX loads it through
``mx.fast.precompiled_cuda_kernel``.

A kernel that reads its inputs' shapes or strides (which MLX passes only to its own generated
signatures), or a machine where NVRTC or the CUDA headers cannot be found, keeps
``mx.fast.cuda_kernel``; :func:`info` says which (``mlxnet info`` shows it).
"""
from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import site
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Sequence

import mlx.core as mx

from ..._cache import cache_dir, is_intact, publish

_CUDA_TYPES = {
    mx.float32: "float", mx.float16: "__half", mx.bfloat16: "__nv_bfloat16",
    mx.int32: "int", mx.uint32: "unsigned int", mx.int64: "long long",
    mx.uint64: "unsigned long long", mx.int16: "short", mx.uint16: "unsigned short",
    mx.int8: "signed char", mx.uint8: "unsigned char", mx.bool_: "bool",
}
_SIZE_SUFFIXES = ("_shape", "_strides", "_ndim")
_INTEGERS = """typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;"""

_lock = threading.Lock()
_state: dict = {"nvrtc": None, "tried": False, "why": "not needed yet (first CUDA kernel launch decides)"}


class NvrtcError(RuntimeError):
    """NVRTC rejected a generated kernel (the log says why)."""


def cuda_type(dtype: mx.Dtype) -> str:
    if dtype not in _CUDA_TYPES:
        raise NvrtcError(f"no CUDA type for {dtype}")
    return _CUDA_TYPES[dtype]


def _template_line(name: str, value: object) -> str:
    if isinstance(value, mx.Dtype):
        return f"  using {name} = {cuda_type(value)};"
    if isinstance(value, bool):
        return f"  constexpr bool {name} = {'true' if value else 'false'};"
    return f"  constexpr int {name} = {int(value)};"


def needs_mlx_signature(body: str, input_names: Sequence[str]) -> bool:
    """Whether a body reads an input's shape, strides or rank, which only MLX's own generated
    signature (``mx.fast.cuda_kernel``) passes."""
    return any(n + s in body for n in input_names for s in _SIZE_SUFFIXES)


def kernel_source(symbol: str, header: str, body: str, input_names: Sequence[str],
                  input_dtypes: Sequence[mx.Dtype], output_names: Sequence[str],
                  output_dtypes: Sequence[mx.Dtype], template: Sequence[tuple[str, object]]) -> str:
    """A launch's whole kernel as one CUDA translation unit: the parameters in MLX's order for
    precompiled kernels (inputs, then outputs), the template arguments as constants."""
    dtypes = list(input_dtypes) + list(output_dtypes) + [v for _, v in template if isinstance(v, mx.Dtype)]
    includes = []
    if mx.float16 in dtypes:
        includes.append("#include <cuda_fp16.h>")
    if mx.bfloat16 in dtypes:
        includes.append("#include <cuda_bf16.h>")
    params = [f"const {cuda_type(d)}* {n}" for n, d in zip(input_names, input_dtypes)]
    params += [f"{cuda_type(d)}* {n}" for n, d in zip(output_names, output_dtypes)]
    constants = "\n".join(_template_line(n, v) for n, v in template)
    # MLX's device headers define the fixed-width integers; without them they are defined here,
    # in a namespace of the kernel's own so that a header that also defines them cannot clash.
    return "\n".join([*includes, "namespace mlxnet_kernel {", _INTEGERS, header,
                      f'extern "C" __global__ void {symbol}(', "    " + ",\n    ".join(params) + ") {",
                      constants, body, "}", "}  // namespace mlxnet_kernel", ""])


def symbol_for(kernel_name: str, source_without_symbol: str) -> str:
    return f"{kernel_name}_{hashlib.sha256(source_without_symbol.encode()).hexdigest()[:16]}"


def _site_dirs() -> list[str]:
    dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    user = site.getusersitepackages() if hasattr(site, "getusersitepackages") else None
    found = dirs + ([user] if user else []) + [p for p in sys.path if p.endswith("site-packages")]
    return list(dict.fromkeys(os.path.realpath(d) for d in found))


def _cuda_homes() -> list[str]:
    homes = [os.environ.get(k) for k in ("CUDA_HOME", "CUDA_PATH")]
    return [h for h in homes if h] + ["/usr/local/cuda"]


def _find_nvrtc() -> ctypes.CDLL:
    """NVRTC as MLX's CUDA build finds it: the nvidia wheels beside it, else the toolkit."""
    candidates = []
    for d in _site_dirs():
        candidates += sorted(glob.glob(os.path.join(d, "nvidia", "*", "lib", "libnvrtc.so*")), reverse=True)
    for h in _cuda_homes():
        candidates += sorted(glob.glob(os.path.join(h, "lib64", "libnvrtc.so*")), reverse=True)
    candidates += ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
    for path in candidates:
        if "builtins" in path or ".alt." in path:
            continue
        folder = os.path.dirname(path)
        try:
            # NVRTC opens its builtins library by name at compile time: load it first from the
            # same folder so the name resolves without changing the process's search path.
            for builtins in sorted(glob.glob(os.path.join(folder, "libnvrtc-builtins.so*"))) if folder else []:
                if ".alt." not in builtins:
                    ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        return lib
    raise NvrtcError("NVRTC (libnvrtc) was not found")


def _include_dirs() -> list[str]:
    dirs = []
    for d in _site_dirs():
        dirs += sorted(os.path.dirname(p) for p in glob.glob(os.path.join(d, "nvidia", "*", "include", "cuda_fp16.h")))
    dirs += [os.path.join(h, "include") for h in _cuda_homes()
             if os.path.exists(os.path.join(h, "include", "cuda_fp16.h"))]
    return dirs


def nvrtc_version(lib: ctypes.CDLL) -> str:
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"{major.value}.{minor.value}"


def compile_source(lib: ctypes.CDLL, source: str, arch: str) -> bytes:
    """NVRTC's binary for ``source`` on ``arch`` (``sm_90`` gives a cubin, ``compute_90`` PTX)."""
    prog = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"mlxnet_kernel.cu", 0, None, None))
    try:
        options = [f"--gpu-architecture={arch}", "-std=c++17"]
        options += [f"--include-path={d}" for d in _include_dirs()]
        raw = [o.encode() for o in options]
        result = lib.nvrtcCompileProgram(prog, len(raw), (ctypes.c_char_p * len(raw))(*raw))
        if result != 0:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            raise NvrtcError(log.value.decode(errors="replace").strip())
        cubin = arch.startswith("sm_")
        size = ctypes.c_size_t()
        _check(lib, (lib.nvrtcGetCUBINSize if cubin else lib.nvrtcGetPTXSize)(prog, ctypes.byref(size)))
        out = ctypes.create_string_buffer(size.value)
        _check(lib, (lib.nvrtcGetCUBIN if cubin else lib.nvrtcGetPTX)(prog, out))
        return out.raw if cubin else out.value
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _check(lib: ctypes.CDLL, result: int) -> None:
    if result != 0:
        raise NvrtcError(lib.nvrtcGetErrorString(result).decode())


def device_arch() -> str:
    """This GPU's SASS architecture as NVRTC names it (``sm_90``)."""
    info = mx.device_info()
    major, minor = info.get("compute_capability_major"), info.get("compute_capability_minor")
    if major is None or minor is None:
        raise NvrtcError("MLX does not report this GPU's compute capability")
    return f"sm_{int(major)}{int(minor)}"


def _nvrtc() -> ctypes.CDLL | None:
    with _lock:
        if not _state["tried"]:
            _state["tried"] = True
            try:
                lib = _find_nvrtc()
                arch = device_arch()
                _state.update(nvrtc=lib, arch=arch, key=f"nvrtc{nvrtc_version(lib)}-{arch}",
                              why=f"compiled once per machine (NVRTC {nvrtc_version(lib)}, {arch})")
            except (NvrtcError, OSError) as e:
                _state["why"] = f"compiled by MLX in every process ({e})"
        return _state["nvrtc"]


def info(probe: bool = True) -> str:
    """How mlxnet's CUDA kernels are built on this machine, and why (``probe``: look for
    NVRTC now rather than at the first launch)."""
    if probe:
        _nvrtc()
    return _state["why"]


def binary(symbol: str, source: str) -> bytes | None:
    """The compiled kernel for ``source`` from mlxnet's cache, compiled there first if needed;
    None where this machine cannot (the caller keeps MLX's per-process compile). Each launch
    signature asks once per process (``PortableKernel`` keeps the answer)."""
    lib = _nvrtc()
    if lib is None:
        return None
    folder = cache_dir("cuda") / _state["key"]
    target = folder / f"{symbol}.cubin"
    if not is_intact(target):
        try:
            built = compile_source(lib, source, _state["arch"])
        except NvrtcError as e:
            warnings.warn(f"mlxnet: NVRTC could not compile {symbol} ({e.args[0].splitlines()[0]}); "
                          "MLX compiles it instead", stacklevel=3)
            return None
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{symbol}.")
            with os.fdopen(fd, "wb") as f:
                f.write(built)
            os.chmod(tmp, 0o644)
            publish(Path(tmp), target)
        except OSError:
            pass  # an unwritable cache costs a compile per process, nothing else
        return built
    return target.read_bytes()
