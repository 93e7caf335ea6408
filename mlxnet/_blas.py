"""Give MLX's CPU back end an optimised BLAS (Linux only), whatever was imported first.

MLX's Linux CPU wheel links the reference BLAS/LAPACK (orders of magnitude slower) and calls it
through its global offset table. :func:`bind` loads PyPI's ``scipy-openblas32`` privately
(RTLD_LOCAL: no other library can see its symbols) and points ``libmlx``'s BLAS/LAPACK imports at
it (:mod:`mlxnet._elf_imports`), so the binding holds whether ``mlx.core`` was imported before
mlxnet or not. Only MLX's calls change: numpy, other libraries and the symbol scope are left as
they were, and nothing is written to disk.

``scipy-openblas32`` is OpenBLAS built with DYNAMIC_ARCH (it picks its kernels for the CPU it
runs on, at run time), pthreads (it honours OPENBLAS_NUM_THREADS and OMP_NUM_THREADS) and 32-bit
integers (MLX's LAPACK calls pass ``int``); its symbols carry a ``scipy_`` prefix. When anything
is missing or fails, MLX keeps its own BLAS and :func:`blas_info` says why.
Its worker threads spin briefly after each GEMM, not OpenBLAS's default tenth of a second
(:data:`THREAD_TIMEOUT`; a user's OPENBLAS_THREAD_TIMEOUT wins).
``MLXNET_BLAS=reference`` (or ``off``/``0``) skips the binding; a value :mod:`mlxnet.env` does
not accept skips it too, and the first use raises the problem.
"""
from __future__ import annotations

import ctypes
import importlib
import importlib.util
import os
import sys
from pathlib import Path

from . import _elf_imports, env
from .errors import MlxnetError

_PREFIX = "scipy_"

_state: dict = {"blas": None, "why": None, "handle": None, "rebound": ()}


def _library() -> Path | None:
    spec = importlib.util.find_spec("scipy_openblas32")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(spec.submodule_search_locations[0], "lib").glob("libscipy_openblas*.so"))
    return found[0] if found else None


def _libmlx() -> tuple[Path, int]:
    """Path and load address of MLX's core library (loading ``mlx.core`` if it is not yet)."""
    importlib.import_module("mlx.core")
    for name, base in _elf_imports.loaded_objects().items():
        if Path(name).name.startswith("libmlx."):
            return Path(name), base
    raise OSError("libmlx is not among the loaded libraries")


def _address(handle: ctypes.CDLL, name: str) -> int | None:
    try:
        return ctypes.cast(getattr(handle, _PREFIX + name), ctypes.c_void_p).value
    except AttributeError:
        return None


# How long OpenBLAS's worker threads spin after a GEMM before they sleep, as log2 of CPU cycles
# (OpenBLAS reads OPENBLAS_THREAD_TIMEOUT when it loads; its default, 28, spins ~0.1 s). A
# spinning worker holds a core that mlxnet's CPU primitives and MLX's own ops, which run
# between the GEMMs, need (docs/train-detect.md measures a training step either way); 16 is
# about 20 µs, enough for back-to-back GEMMs.
THREAD_TIMEOUT = "16"


def _load_openblas(source: Path) -> ctypes.CDLL:
    """The private copy of OpenBLAS, its spin timeout ``THREAD_TIMEOUT`` unless the user set
    OPENBLAS_THREAD_TIMEOUT; the environment is restored as it was once the library has read it."""
    if "OPENBLAS_THREAD_TIMEOUT" in os.environ:
        return ctypes.CDLL(str(source), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = THREAD_TIMEOUT
    try:
        return ctypes.CDLL(str(source), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    finally:
        del os.environ["OPENBLAS_THREAD_TIMEOUT"]


def bind() -> None:
    """Point MLX's BLAS/LAPACK calls at OpenBLAS on Linux (idempotent)."""
    if _state["blas"] is not None:
        return
    if sys.platform == "darwin":
        _state["blas"] = "Accelerate"
        return
    try:
        wanted = env.switch("MLXNET_BLAS")
    except MlxnetError as e:  # this runs inside ``import mlxnet``: the first use raises it
        env.defer("MLXNET_BLAS", str(e))
        _state["blas"], _state["why"] = "MLX's own", str(e)
        return
    if wanted == "reference":
        _state["blas"], _state["why"] = "MLX's own", f"MLXNET_BLAS={os.environ['MLXNET_BLAS'].strip()}"
        return
    source = _library()
    if source is None:
        _state["blas"], _state["why"] = "MLX's own", "scipy-openblas32 is not installed"
        return
    try:
        handle = _load_openblas(source)
        path, base = _libmlx()
        rebound = _elf_imports.rebind(path, base, lambda name: _address(handle, name))
    except OSError as e:
        _state["blas"], _state["why"] = "MLX's own", f"OpenBLAS could not be bound: {e}"
        return
    if "cblas_sgemm" not in rebound:
        _state["blas"], _state["why"] = "MLX's own", f"{path.name} imports no cblas_sgemm to rebind"
        return
    _state["handle"], _state["rebound"] = handle, tuple(rebound)
    _state["blas"] = "OpenBLAS"


def details() -> dict[str, str | int]:
    """The bound OpenBLAS: version/build, the kernel family it chose here, its threads."""
    handle = _state["handle"]
    if handle is None:
        return {}
    handle.scipy_openblas_get_config.restype = ctypes.c_char_p
    handle.scipy_openblas_get_corename.restype = ctypes.c_char_p
    return {"config": handle.scipy_openblas_get_config().decode().strip(),
            "kernels": handle.scipy_openblas_get_corename().decode().strip(),
            "threads": int(handle.scipy_openblas_get_num_threads())}


def blas_info() -> str:
    """Which BLAS MLX's CPU back end uses in this process, and why when it is MLX's own."""
    info = details()
    if info:
        version = str(info["config"]).split()[1] if len(str(info["config"]).split()) > 1 else ""
        return f"OpenBLAS {version} ({info['kernels']} kernels, {info['threads']} threads)"
    name = _state["blas"] or "unknown"
    return f"{name} ({_state['why']})" if _state["why"] else name
