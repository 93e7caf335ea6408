"""The wheel: one import root, kernel sources inside it, OpenBLAS bound on Linux."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import mlxnet

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_has_one_import_root_and_ships_kernels(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("mlxnet-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    roots = {n.split("/")[0] for n in names if not n.startswith("mlxnet-")}
    assert roots == {"mlxnet"}, roots
    kernels = {Path(n).name for n in names if n.startswith("mlxnet/custom_kernels/")}
    shipped = {p.name for p in (ROOT / "custom_kernels").glob("*.kern")}
    assert shipped and shipped <= kernels
    assert "mlxnet/models/__init__.py" in names


def _has_cmeel_openblas() -> bool:
    from importlib import metadata

    try:
        metadata.distribution("cmeel-openblas")
        return True
    except metadata.PackageNotFoundError:
        return False


@pytest.mark.skipif(sys.platform != "linux" or not _has_cmeel_openblas(),
                    reason="the BLAS binding is Linux-only and needs cmeel-openblas (a Linux dependency)")
def test_openblas_is_bound_before_mlx_loads():
    assert mlxnet.blas_info().startswith("OpenBLAS"), mlxnet.blas_info()


@pytest.mark.skipif(sys.platform != "linux", reason="the BLAS binding is Linux-only")
def test_importing_mlx_first_warns_once():
    code = "import warnings; warnings.simplefilter('always'); import mlx.core; import mlxnet; print(mlxnet.blas_info())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "mlx.core was imported before mlxnet" in out.stdout
    assert out.stderr.count("RuntimeWarning") == 1


_FAULTS = """
import resource, mlxnet, mlx.core as mx
x = mx.random.normal((4096, 4096)); mx.eval(x)      # 64 MiB: glibc would mmap it
mx.eval(x * 2.0)                                      # first use: the heap grows
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    mx.eval(x * 2.0)                                  # each result freed, then reused
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, mlxnet.malloc_info())
"""


@pytest.mark.skipif(sys.platform != "linux", reason="the malloc setting is for Linux (glibc)")
def test_freed_arrays_are_reused_without_page_faults():
    """A 64 MiB result is 16384 fresh pages per call under glibc's defaults; kept memory is not."""
    def faults(env: dict) -> tuple[int, str]:
        out = subprocess.run([sys.executable, "-c", _FAULTS], capture_output=True, text=True, check=True,
                             env={**os.environ, **env})
        n, info = out.stdout.split(" ", 1)
        return int(n), info.strip()

    kept, info = faults({})
    system, system_info = faults({"MLXNET_MALLOC": "system"})
    assert info == "glibc, freed memory kept for reuse" and system_info.startswith("system")
    assert system > 5 * 16000, system  # the measurement itself works
    assert kept < 1000, kept


_JIT = """
import glob, os, mlxnet, mlx.core as mx
f = mx.compile(lambda a, b: (a * 1.5 + b) / (1.0 + b * b))
mx.eval(f(mx.ones((4096,)), mx.ones((4096,))))
print(mlxnet.jit_info())
print(*glob.glob(os.path.join(os.environ["TMPDIR"], "mlx", "*", "cpu", "*.so")))
"""


def _avx2() -> bool:
    try:
        return " avx2" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.mark.skipif(sys.platform != "linux" or not _avx2() or not shutil.which("objdump"),
                    reason="the JIT wrapper is for Linux x86-64 with AVX2 (and objdump to inspect it)")
def test_cpu_jit_builds_for_this_machines_vector_units(tmp_path):
    def build(env: dict, where: Path) -> tuple[str, str]:
        where.mkdir()
        # This process put the wrapper on PATH when it imported mlxnet: start from a clean PATH.
        path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if "mlxnet" not in p)
        out = subprocess.run([sys.executable, "-c", _JIT], capture_output=True, text=True, check=True,
                             env={**os.environ, "PATH": path, "TMPDIR": str(where), **env})
        info, libs = out.stdout.strip().split("\n")
        code = "".join(subprocess.run(["objdump", "-d", lib], capture_output=True, text=True).stdout
                       for lib in libs.split())
        return info, code

    info, code = build({}, tmp_path / "native")
    assert info.startswith("g++ -march=native") and ("ymm" in code or "zmm" in code)
    info, code = build({"MLXNET_JIT": "default"}, tmp_path / "default")
    assert info.startswith("MLX default") and "xmm" in code and "ymm" not in code
