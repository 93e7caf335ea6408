"""Bind an optimised BLAS before ``mlx.core`` loads (Linux only).

MLX's Linux CPU wheel links the reference BLAS/LAPACK (matmul ~5 GFLOP/s). Loading
OpenBLAS (PyPI ``cmeel-openblas``) with RTLD_GLOBAL first makes the dynamic linker
resolve MLX's ``cblas_*``/LAPACK symbols to it (~300 GFLOP/s on 2 cores).
``MLXNET_BLAS=reference`` skips the binding (for benchmarks and bug hunts).
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
import tempfile
import warnings
from pathlib import Path

_state: dict[str, str | None] = {"blas": None, "why": None}


def _site_dirs() -> list[Path]:
    return [Path(p) for p in sys.path if p and Path(p).is_dir()]


def _find(relative: str) -> Path | None:
    for d in _site_dirs():
        p = d / relative
        if p.exists():
            return p
    return None


def cache_dir(name: str) -> Path:
    """mlxnet's per-user cache folder ``name`` (XDG_CACHE_HOME or ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mlxnet" / name


def opted_out(variable: str, word: str) -> bool:
    """Whether the environment turns a process-wide setting off: ``variable`` set to ``word``,
    ``0`` or ``off`` (MLXNET_BLAS=reference, MLXNET_MALLOC=system, MLXNET_JIT=default)."""
    return os.environ.get(variable, "").lower() in (word, "0", "off")


def _load_gfortran_from_mlx() -> None:
    """OpenBLAS needs ``libgfortran.so.5``, which many Linux machines lack.

    ``mlx[cpu]`` bundles one under a mangled soname; a cached copy whose SONAME reads
    ``libgfortran.so.5`` satisfies OpenBLAS's NEEDED entry once loaded globally.
    """
    libs = _find("mlx_cpu.libs")
    if libs is None:
        raise OSError("mlx_cpu.libs not found")
    gfortran = next(libs.glob("libgfortran-*.so*"))
    for quadmath in libs.glob("libquadmath-*.so*"):
        ctypes.CDLL(str(quadmath), mode=ctypes.RTLD_GLOBAL)
    target = cache_dir("blas") / f"{gfortran.name}.as-libgfortran.so.5"
    if not target.exists():
        old = gfortran.name.encode() + b"\0"
        new = b"libgfortran.so.5\0"
        data = gfortran.read_bytes()
        if data.count(old) != 1:
            raise OSError(f"unexpected layout of {gfortran.name}")
        data = data.replace(old, new + b"\0" * (len(old) - len(new)))
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    ctypes.CDLL(str(target), mode=ctypes.RTLD_GLOBAL)


def bind() -> None:
    """Load OpenBLAS globally if we are on Linux, before mlx.core, and it is installed."""
    if _state["blas"] is not None:
        return
    if sys.platform == "darwin":
        _state["blas"] = "Accelerate"
        return
    if opted_out("MLXNET_BLAS", "reference"):
        _state["blas"], _state["why"] = "reference", "MLXNET_BLAS=reference"
        return
    if "mlx.core" in sys.modules:
        _state["blas"], _state["why"] = "reference", "mlx.core was imported before mlxnet"
        warnings.warn(
            "mlxnet: mlx.core was imported before mlxnet, so MLX keeps its slow reference "
            "BLAS on this Linux CPU; import mlxnet first for OpenBLAS.",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    lib = _find("cmeel.prefix/lib/libopenblas.so.0")
    if lib is None or importlib.util.find_spec("mlx") is None:
        _state["blas"], _state["why"] = "reference", "cmeel-openblas not installed"
        return
    try:
        try:
            handle = ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            if "libgfortran" not in str(e):
                raise
            _load_gfortran_from_mlx()
            handle = ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    except (OSError, StopIteration) as e:
        _state["blas"], _state["why"] = "reference", f"OpenBLAS failed to load: {e}"
        return
    handle.openblas_get_config.restype = ctypes.c_char_p
    _state["blas"] = handle.openblas_get_config().decode().strip()  # "OpenBLAS 0.3.x ..."


def blas_info() -> str:
    """Which BLAS MLX's CPU back end uses in this process, and why when it is the slow one."""
    name = _state["blas"] or "unknown"
    return f"{name} ({_state['why']})" if _state["why"] else name
