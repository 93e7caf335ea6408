"""The wheel: one import root, kernel sources inside it, OpenBLAS bound on Linux."""
from __future__ import annotations

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
                             env={**__import__("os").environ, **env})
        n, info = out.stdout.split(" ", 1)
        return int(n), info.strip()

    kept, info = faults({})
    system, system_info = faults({"MLXNET_MALLOC": "system"})
    assert info == "glibc, freed memory kept for reuse" and system_info.startswith("system")
    assert system > 5 * 16000, system  # the measurement itself works
    assert kept < 1000, kept
