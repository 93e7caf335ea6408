"""mlxnet's CPU primitives (``custom_kernels/cpu_ops.cpp``): built once per machine, then loaded.

MLX has no custom-kernel hook on the CPU, so the hot spots that MLX ops cannot make fast there
(a convolution's patch matrix, a direct convolution at small channel counts, bias + SiLU,
sigmoid, GELU, softmax and layer norm on every core, attention of many queries over a few keys;
MLX's CPU erf runs one scalar at a time) are MLX primitives in C++. Sigmoid and softmax being here
also spares every fresh ``$TMPDIR`` the g++ runs of MLX's CPU JIT for their compiled passes
(about 1.8 s before a detector's first result), since this module is built once per machine.
On Linux they are compiled on first use, the way MLX's own CPU JIT compiles fused kernels:
``g++`` against the installed MLX headers and ``libmlx``, with nanobind (a dependency on
Linux) for the Python binding, cached under ``~/.cache/mlxnet/native/<key>/`` (the key hashes
the source, the MLX, nanobind and compiler versions and the instruction-set level). The build
takes about 10 s, announced by one line on stderr when it starts.

The code is built for the x86-64 level (v2, v3 or v4) that the CPU running this process reports
through CPUID (numpy's run-time detection, which is also what an emulator presents), never with
``-march=native``: a cache shared by different CPUs holds one build per level, and a build is
only ever loaded on a CPU of its level. A build is published atomically under a file lock (one
build for concurrent first uses), its size and hash recorded; a cached library that no longer
matches its record is rebuilt, with a one-line warning, instead of being loaded.

When it cannot be used (macOS, no compiler, a nanobind whose ABI differs from MLX's, or
``MLXNET_NATIVE=off``/``0``), :func:`module` returns None and the ops run their MLX-composed CPU
paths; :func:`native_info` says why (``mlxnet info`` shows it). A value of ``MLXNET_NATIVE``
that :mod:`mlxnet.env` does not accept raises MlxnetError at the first CPU use.
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import warnings
from importlib import resources
from pathlib import Path
from types import ModuleType

from . import env
from ._cache import cache_dir, is_intact, publish
from .device import current_device

NAME = "mlxnet_cpu_ops"
_state: dict = {"tried": False, "module": None, "why": "not built yet (first CPU use builds it)"}
_lock = threading.Lock()


class _Unavailable(Exception):
    """Why the primitives cannot be used; ``broken`` when that is a fault worth a warning (a
    failed build, a mismatched nanobind), not a machine without the tools."""

    def __init__(self, why: str, broken: bool = False) -> None:
        super().__init__(why)
        self.broken = broken


# x86-64 micro-architecture levels and the CPUID features (numpy's names) each one needs.
_X86_LEVELS = (
    ("x86-64-v4", ("AVX512F", "AVX512CD", "AVX512BW", "AVX512DQ", "AVX512VL")),
    ("x86-64-v3", ("AVX", "AVX2", "FMA3", "F16C")),
    ("x86-64-v2", ("SSE3", "SSSE3", "SSE41", "SSE42", "POPCNT")),
)


def instruction_set() -> str:
    """The ``-march`` level this CPU runs, from CPUID as this process sees it."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return "armv8-a" if platform.machine() in ("aarch64", "arm64") else "generic"
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:  # numpy < 2
        from numpy.core._multiarray_umath import __cpu_features__ as features
    for level, needed in _X86_LEVELS:
        if all(features.get(f) for f in needed):
            return level
    return "x86-64"


def _toolchain() -> dict:
    import mlx.core as mx

    try:
        import nanobind
    except ImportError:
        raise _Unavailable("nanobind is not installed (pip install nanobind)") from None
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx or not shutil.which(cxx.split()[0]):
        raise _Unavailable("no C++ compiler (g++ or $CXX) on PATH")
    try:
        version = subprocess.run([*cxx.split(), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise _Unavailable(f"{cxx} --version failed: {e}") from None
    mlx_dir = Path(mx.__file__).parent
    return {"cxx": cxx.split(), "cxx_version": version.splitlines()[0] if version else cxx,
            "mlx": mx.__version__, "mlx_include": mlx_dir / "include", "mlx_lib": mlx_dir / "lib",
            "nanobind": nanobind.__version__, "nb_include": Path(nanobind.include_dir()),
            "nb_source": Path(nanobind.source_dir()), "python_include": sysconfig.get_paths()["include"],
            "suffix": sysconfig.get_config_var("EXT_SUFFIX") or ".so"}


# How the primitives are compiled (part of the cache key). No FMA contraction: bias_silu rounds
# exactly as the MLX-composed reference does. No trapping math: the exp polynomial's clamps and
# float-to-int rounding vectorise only when GCC may assume that floating-point operations do not
# trap (mlxnet never enables FP traps; the values computed are the same, one vector at a time
# instead of one scalar).
CODEGEN = ("-ffp-contract=off", "-fno-trapping-math")


def _commands(tc: dict, source: Path, work: Path, target: Path) -> list[list[str]]:
    common = ["-O3", "-std=gnu++20", "-fPIC", "-fvisibility=hidden", "-I", tc["python_include"],
              "-I", str(tc["nb_include"])]
    nanobind = [*tc["cxx"], *common, "-DNB_BUILD", "-DNB_COMPACT_ASSERTIONS", "-fno-strict-aliasing",
                "-isystem", str(tc["nb_source"].parent / "ext" / "robin_map" / "include"),
                "-c", str(tc["nb_source"] / "nb_combined.cpp"), "-o", str(work / "nanobind.o")]
    level = instruction_set()
    arch = [f"-march={level}", "-mtune=generic"] if level.startswith("x86-64") else []
    ops = [*tc["cxx"], *common, *arch, *CODEGEN, "-DNB_DOMAIN=mlx",
           "-isystem", str(tc["mlx_include"]), "-c", str(source), "-o", str(work / "cpu_ops.o")]
    link = [*tc["cxx"], "-shared", str(work / "nanobind.o"), str(work / "cpu_ops.o"), "-o", str(target),
            "-L", str(tc["mlx_lib"]), "-lmlx", f"-Wl,-rpath,{tc['mlx_lib']}"]
    return [nanobind, ops, link]


def _build(tc: dict, text: str, folder: Path) -> Path:
    """The intact cached library, else a fresh build published atomically, one at a time."""
    target = folder / f"{NAME}{tc['suffix']}"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent first uses: one builds, the others wait
        if is_intact(target):
            return target
        if target.exists():
            warnings.warn(f"mlxnet: cached CPU primitives {target} do not match their record "
                          "(truncated or changed); rebuilding", RuntimeWarning, stacklevel=5)
            target.unlink()
        return _compile(tc, text, target)


def _compile(tc: dict, text: str, target: Path) -> Path:
    # The first command on a machine would otherwise sit silent for the build's ~10 s. One line,
    # only when a build really starts (not on a cache hit), on stderr: stdout may be --json.
    print("mlxnet: building CPU primitives for this CPU (once, ~10 s)...", file=sys.stderr, flush=True)
    folder = target.parent
    work = Path(tempfile.mkdtemp(prefix="build-", dir=folder.parent))
    source = work / "cpu_ops.cpp"
    source.write_text(text)
    built = work / target.name
    nanobind, ops, link = _commands(tc, source, work, built)
    log = work / "build.log"
    with open(log, "w") as out:
        jobs = [subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT) for cmd in (nanobind, ops)]
        if any(job.wait() for job in jobs) or subprocess.run(link, stdout=out, stderr=subprocess.STDOUT).returncode:
            raise _Unavailable(f"building {source.name} failed: see {log}", broken=True)
    publish(built, target)
    shutil.rmtree(work, ignore_errors=True)
    return target


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(NAME, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import mlx.core as mx

    try:  # a nanobind with another ABI than mlx.core's cannot take mx.array arguments
        mx.eval(module.bias_silu(mx.zeros((1, 2))))
    except TypeError as e:
        raise _Unavailable(f"{path.name} cannot take MLX arrays (nanobind ABI differs from MLX's): {e}",
                           broken=True) from None
    return module


def module() -> ModuleType | None:
    """The loaded extension, or None (see :func:`native_info`). Builds it on the first call."""
    if _state["tried"]:
        return _state["module"]
    with _lock:
        if _state["tried"]:
            return _state["module"]
        _state["module"], _state["why"] = _try_load()
        _state["tried"] = True
    return _state["module"]


def _try_load() -> tuple[ModuleType | None, str]:
    if not sys.platform.startswith("linux"):
        return None, f"not built on {sys.platform} (the MLX-composed CPU paths run)"
    if env.switch("MLXNET_NATIVE") == "off":  # a value it does not accept raises here, at first use
        return None, f"off (MLXNET_NATIVE={os.environ['MLXNET_NATIVE'].strip()})"
    try:
        tc = _toolchain()
        text = resources.files("mlxnet.custom_kernels").joinpath("cpu_ops.cpp").read_text()
        key = hashlib.sha256("\n".join([text, tc["mlx"], tc["nanobind"], tc["cxx_version"], " ".join(tc["cxx"]),
                                        instruction_set(), tc["suffix"], *CODEGEN]).encode()).hexdigest()[:16]
        path = _build(tc, text, cache_dir("native") / key)
        where = str(path.parent).replace(str(Path.home()), "~", 1)
        return _load(path), f"on ({instruction_set()} build, {where})"
    except _Unavailable as e:
        if e.broken:
            warnings.warn(f"mlxnet: CPU primitives unavailable, using MLX-composed paths: {e}",
                          RuntimeWarning, stacklevel=3)
        return None, str(e)


def native_info(build: bool = False) -> str:
    """Whether the CPU primitives are in use, and why not; ``build`` builds or loads them now
    (otherwise the first CPU use does)."""
    if build:
        module()
    return _state["why"]


def on_cpu() -> ModuleType | None:
    """The extension when this call runs on the CPU device (its primitives are CPU-only)."""
    return module() if current_device() == "cpu" else None
