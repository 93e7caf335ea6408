"""The wheel: one import root, kernel sources inside it, OpenBLAS bound on Linux, an import
that changes nothing else, opt-in process tuning."""
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


@pytest.mark.skipif(sys.platform != "linux", reason="the BLAS binding is Linux-only")
def test_openblas_is_bound_with_run_time_kernels_and_all_threads():
    info = mlxnet._blas.details()
    assert mlxnet.blas_info().startswith("OpenBLAS"), mlxnet.blas_info()
    assert "DYNAMIC_ARCH" in info["config"] and info["kernels"]
    code = "import mlxnet; print(mlxnet._blas.details()['threads'])"
    one = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    assert one.stdout.strip() == "1"


@pytest.mark.skipif(sys.platform != "linux" or (os.cpu_count() or 1) < 2, reason="OpenBLAS workers: Linux, 2+ cores")
def test_openblas_workers_sleep_soon_after_a_gemm():
    """A GEMM's worker threads stop spinning within microseconds (mlxnet's THREAD_TIMEOUT), so
    the ops that follow have the cores; with OpenBLAS's own timeout (a user's setting wins) they
    spin on for about 0.1 s, which shows as CPU time while the process sleeps."""
    code = ("import time, mlxnet, mlx.core as mx\n"
            "a = mx.random.normal((1024, 1024)); mx.eval(a)\n"
            "spins = []\n"
            "for _ in range(3):\n"
            "    mx.eval(a @ a); t0 = time.process_time(); time.sleep(0.05); spins.append(time.process_time() - t0)\n"
            "print(min(spins))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_THREAD_TIMEOUT", "OPENBLAS_NUM_THREADS")}
    ours = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    theirs = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={**env, "OPENBLAS_THREAD_TIMEOUT": "28"})
    assert float(ours.stdout) < 0.01, ours.stdout
    assert float(theirs.stdout) > 0.02, theirs.stdout


_BLAS_RUN = """
import sys, ctypes
if sys.argv[1] == "mlx-first":
    import mlx.core as mx
    import mlxnet
else:
    import mlxnet
    import mlx.core as mx
from mlxnet import _blas, _elf_imports
a = mx.random.normal((96, 96), key=mx.random.key(0)) + 20 * mx.eye(96)
err = float(mx.abs(a @ mx.linalg.inv(a, stream=mx.cpu) - mx.eye(96)).max())
path, base = _blas._libmlx()
(slot,) = _elf_imports.import_slots(path)["cblas_sgemm"]
in_got = ctypes.c_void_p.from_address(base + slot).value
openblas = _blas._address(_blas._state["handle"], "cblas_sgemm")
try:
    ctypes.CDLL(None).scipy_cblas_sgemm
    visible = True
except AttributeError:
    visible = False
print(mlxnet.blas_info(), "|", err, "|", in_got == openblas, "|", visible)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="the BLAS binding is Linux-only")
@pytest.mark.parametrize("order", ["mlxnet-first", "mlx-first"])
def test_openblas_is_bound_in_either_import_order(order, tmp_path):
    """MLX's own GOT entry for cblas_sgemm points at OpenBLAS, LAPACK results are right, no
    warning is raised, nothing is written to the cache and OpenBLAS's names stay out of the
    process's global symbol scope."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", _BLAS_RUN, order],
                         capture_output=True, text=True, check=True, env=env)
    info, err, in_got, visible = (part.strip() for part in out.stdout.split("|"))
    assert info.startswith("OpenBLAS"), out.stdout
    assert float(err) < 1e-3 and in_got == "True" and visible == "False", out.stdout
    assert not out.stderr.strip(), out.stderr
    assert not (tmp_path / "mlxnet" / "blas").exists()


def test_import_slots_name_every_blas_import_of_libmlx():
    from mlxnet import _blas, _elf_imports
    if sys.platform != "linux":
        pytest.skip("ELF imports are Linux-only")
    path, _ = _blas._libmlx()
    slots = _elf_imports.import_slots(path)
    assert {"cblas_sgemm", "sgetrf_", "sgesdd_"} <= set(slots), sorted(slots)[:20]
    with pytest.raises(OSError, match="not a 64-bit"):
        _elf_imports.import_slots(Path(__file__))


@pytest.mark.skipif(sys.platform != "linux", reason="the BLAS binding is Linux-only")
def test_blas_opt_out_names_the_setting():
    code = "import mlxnet; print(mlxnet.blas_info())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "MLXNET_BLAS": "off"})
    assert out.stdout.strip() == "MLX's own (MLXNET_BLAS=off)"


def test_import_changes_nothing_in_the_process():
    code = ("import os, ctypes; before = dict(os.environ); import mlxnet; "
            "print(dict(os.environ) == before, mlxnet.malloc_info())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "system"], out.stdout


_FAULTS = """
import os, resource, mlxnet, mlx.core as mx
if os.environ.get("TUNE"):
    mlxnet.tune_cpu()
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

    kept, info = faults({"TUNE": "1"})
    system, system_info = faults({})
    assert info == "glibc, freed memory kept for reuse" and system_info.startswith("system")
    assert system > 5 * 16000, system  # the measurement itself works
    assert kept < 1000, kept


def test_every_mlxnet_subpackage_is_packaged():
    """setuptools installs only the packages pyproject.toml names (a non-editable install once
    lacked mlxnet.training)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"mlxnet." + ".".join(p.parent.relative_to(ROOT / "mlxnet").parts)
             for p in (ROOT / "mlxnet").rglob("__init__.py")} - {"mlxnet."}
    assert found | {"mlxnet"} <= listed, sorted(found - listed)


_TUNE_GPU = ("import os, mlxnet; before = os.environ.get('MLX_USE_CUDA_GRAPHS'); mlxnet.tune_gpu(); "
             "print(before, os.environ.get('MLX_USE_CUDA_GRAPHS'), '|', mlxnet.cuda_graphs_info())")


@pytest.mark.parametrize("user, expected, graphs", [(None, "0", False), ("1", "1", True),
                                                    ("true", "true", False), (" 2", " 2", True)])
def test_tune_gpu_asks_mlx_for_direct_launches_unless_the_user_chose(user, expected, graphs):
    env = {k: v for k, v in os.environ.items() if k != "MLX_USE_CUDA_GRAPHS"}
    if user is not None:
        env["MLX_USE_CUDA_GRAPHS"] = user
    out = subprocess.run([sys.executable, "-c", _TUNE_GPU], capture_output=True, text=True, check=True,
                         env=env).stdout.split("|")
    assert out[0].split() == [str(user).strip(), expected.strip()]
    # As MLX reads it (C's atoi): 'true' is 0 to MLX.
    assert ("CUDA graphs" if graphs else "direct launches") in out[1]


def test_the_command_restarts_once_with_the_load_time_settings_on_cuda_only(monkeypatch):
    """MLX sizes its convolution-plan cache when its library loads: the command starts itself
    again with MLX_CUDA_CONV_CACHE_SIZE where MLX has CUDA and the user did not set it."""
    from mlxnet import _cuda_graphs

    monkeypatch.delenv("MLX_CUDA_CONV_CACHE_SIZE", raising=False)
    assert _cuda_graphs.missing_load_time_settings(cuda=False) == {}
    assert _cuda_graphs.missing_load_time_settings(cuda=True) == {"MLX_CUDA_CONV_CACHE_SIZE": "16384"}
    monkeypatch.setenv("MLX_CUDA_CONV_CACHE_SIZE", "64")
    assert _cuda_graphs.missing_load_time_settings(cuda=True) == {}


def test_the_command_has_the_load_time_settings_from_its_first_start(tmp_path, monkeypatch):
    """The command's own process (a console script named mlxnet, or python -m mlxnet) gets
    MLX_CUDA_CONV_CACHE_SIZE at `import mlxnet`, before MLX loads, so it never starts twice;
    a library user's process is left as it is, and a user's value wins."""
    from mlxnet import _cuda_graphs

    probe = ("import os, sys; import mlxnet; "
             "print(os.environ.get('MLX_CUDA_CONV_CACHE_SIZE'), mlxnet._cuda_graphs.missing_load_time_settings(cuda=True))")
    script = tmp_path / "mlxnet"
    script.write_text(probe + "\n")
    env = {k: v for k, v in os.environ.items() if k != "MLX_CUDA_CONV_CACHE_SIZE"}
    run = lambda *argv, **extra: subprocess.run([sys.executable, *argv], capture_output=True, text=True,  # noqa: E731
                                               check=True, env={**env, **extra}, cwd=tmp_path).stdout.split()
    assert run(str(script)) == ["16384", "{}"]
    assert run("-c", probe) == ["None", "{'MLX_CUDA_CONV_CACHE_SIZE':", "'16384'}"]
    assert run(str(script), MLX_CUDA_CONV_CACHE_SIZE="64")[0] == "64"
    # python -m mlxnet: the package is imported while sys.argv[0] is still "-m"
    monkeypatch.setattr(sys, "argv", ["-m", "detect"])
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-X", "dev", "-m", "mlxnet", "detect"])
    assert _cuda_graphs.is_the_command()
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-m", "other", "mlxnet"])
    assert not _cuda_graphs.is_the_command()


@pytest.mark.gpu
def test_on_cuda_the_command_runs_with_a_larger_convolution_plan_cache():
    import mlx.core as mx

    if not mx.cuda.is_available():
        pytest.skip("a CUDA build's setting")
    env = {k: v for k, v in os.environ.items() if k != "MLX_CUDA_CONV_CACHE_SIZE"}
    env["COLUMNS"] = "300"  # one table row, one line
    out = subprocess.run([sys.executable, "-m", "mlxnet", "info"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0 and "convolution plans kept: 16384" in out.stdout, out.stdout[-800:]


def test_the_command_tunes_its_own_process_for_the_gpu():
    code = ("import os; from typer.testing import CliRunner; from mlxnet.cli import app; "
            "r = CliRunner().invoke(app, ['ops']); print(r.exit_code, os.environ.get('MLX_USE_CUDA_GRAPHS'))")
    env = {k: v for k, v in os.environ.items() if k != "MLX_USE_CUDA_GRAPHS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split()[-2:] == ["0", "0"], out.stdout[-500:]


def _unset_for_this_test(monkeypatch, *names: str) -> None:
    """Unset variables that the code under test sets itself: set first, so that monkeypatch
    records their state and restores it afterwards (deleting an absent variable records
    nothing, and a value the test's code set would then outlive the test)."""
    for name in names:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def test_low_memory_asks_cuda_builds_for_one_kernel_per_command_buffer(monkeypatch):
    """tune_gpu(low_memory=True) sets MLX_MAX_OPS_PER_BUFFER=1 on CUDA builds only (Metal
    commits by size already), and never over the user's own value."""
    from mlxnet import _cuda_graphs

    _unset_for_this_test(monkeypatch, "MLX_MAX_OPS_PER_BUFFER", "MLX_USE_CUDA_GRAPHS")
    _cuda_graphs.configure(low_memory=True, cuda=False)
    assert "MLX_MAX_OPS_PER_BUFFER" not in os.environ and os.environ["MLX_USE_CUDA_GRAPHS"] == "0"
    _cuda_graphs.configure(low_memory=False, cuda=True)
    assert "MLX_MAX_OPS_PER_BUFFER" not in os.environ
    _cuda_graphs.configure(low_memory=True, cuda=True)
    assert os.environ["MLX_MAX_OPS_PER_BUFFER"] == "1"
    assert "kernels per command buffer: 1" in _cuda_graphs.cuda_graphs_info()
    monkeypatch.setenv("MLX_MAX_OPS_PER_BUFFER", "8")
    _cuda_graphs.configure(low_memory=True, cuda=True)
    assert os.environ["MLX_MAX_OPS_PER_BUFFER"] == "8"


def test_a_command_sized_command_buffer_is_asked_of_cuda_builds_only(monkeypatch):
    """tune_gpu(ops_per_buffer=N) (what `mlxnet train detect` asks for) sets MLX's kernels per
    command buffer on CUDA builds only, never over the user's value, and low memory's 1 wins."""
    import mlxnet
    from mlxnet import _cuda_graphs
    from mlxnet.errors import MlxnetError

    _unset_for_this_test(monkeypatch, "MLX_MAX_OPS_PER_BUFFER", "MLX_USE_CUDA_GRAPHS")
    _cuda_graphs.configure(ops_per_buffer=10, cuda=False)
    assert "MLX_MAX_OPS_PER_BUFFER" not in os.environ
    _cuda_graphs.configure(ops_per_buffer=10, cuda=True)
    assert os.environ["MLX_MAX_OPS_PER_BUFFER"] == "10"
    monkeypatch.delenv("MLX_MAX_OPS_PER_BUFFER")
    _cuda_graphs.configure(low_memory=True, ops_per_buffer=10, cuda=True)
    assert os.environ["MLX_MAX_OPS_PER_BUFFER"] == "1"
    monkeypatch.setenv("MLX_MAX_OPS_PER_BUFFER", "3")
    _cuda_graphs.configure(ops_per_buffer=10, cuda=True)
    assert os.environ["MLX_MAX_OPS_PER_BUFFER"] == "3"
    with pytest.raises(MlxnetError, match="ops_per_buffer must be at least 1, got 0"):
        mlxnet.tune_gpu(ops_per_buffer=0)


@pytest.mark.parametrize("setting, expected, waits", [("low", "1", False), ("min", "1", True),
                                                     ("default", None, False), ("", None, False)])
@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_the_command_asks_for_low_gpu_memory_when_told(setting, expected, waits, device):
    """MLXNET_GPU_MEMORY on a GPU run: low is one kernel per command buffer on CUDA builds; min
    is that and MLX's memory limit at 0 (MLX waits for each kernel) on every GPU back end. A CPU
    run keeps MLX's defaults."""
    import mlx.core as mx

    if device == "gpu" and not mx.is_available(mx.gpu):
        pytest.skip("no GPU in this MLX build")
    code = ("import os, mlx.core as mx; from typer.testing import CliRunner; from mlxnet.cli import app; "
            f"r = CliRunner().invoke(app, ['--device', '{device}', 'ops']); "
            "print(r.exit_code, os.environ.get('MLX_MAX_OPS_PER_BUFFER'), mx.get_memory_limit() == 0)")
    env = {k: v for k, v in os.environ.items() if k != "MLX_MAX_OPS_PER_BUFFER"}
    env["MLXNET_GPU_MEMORY"] = setting
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    on_gpu = device == "gpu"
    got = expected if on_gpu and mx.cuda.is_available() else None  # a setting of MLX's CUDA back end only
    assert out.stdout.split()[-3:] == ["0", str(got), str(waits and on_gpu)], out.stdout[-500:]


def test_tune_gpu_sets_mlxs_memory_limit_only_when_asked():
    code = ("import mlx.core as mx, mlxnet; before = mx.get_memory_limit(); mlxnet.tune_gpu(low_memory=True); "
            "same = mx.get_memory_limit() == before; mlxnet.tune_gpu(memory_limit=123 << 20); "
            "print(same, mx.get_memory_limit() == 123 << 20)\n"
            "try:\n    mlxnet.tune_gpu(memory_limit=-1)\nexcept mlxnet.MlxnetError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    assert lines[0] == "True True", out.stdout
    assert lines[1] == "tune_gpu: memory_limit must be a number of bytes >= 0, got -1", out.stdout


# The plain-MLX chain of scripts/bench/mlx_conv_memory.py, in a process tuned by mlxnet first.
_CHAIN_PEAK = """
import importlib.util, sys, mlxnet
mlxnet.tune_gpu(**mlxnet.GPU_MEMORY_SETTINGS[sys.argv[1]])
spec = importlib.util.spec_from_file_location("mlx_conv_memory", sys.argv[2])
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)
print(script.mlx_chain(64, "float16", "gpu"))
"""


@pytest.mark.gpu
def test_low_memory_frees_a_chains_intermediates_as_they_die():
    """64 chained convolutions evaluated at once: MLX's CUDA back end holds every intermediate
    until its command buffer (100 kernels) completes; with low memory, set in the process
    before its first GPU work, a map is freed once the kernel reading it has run, so only the
    maps of kernels in flight are alive (a few on an idle GPU, more on a busy one: measured 22
    of 32 beside a parallel test run). With min memory MLX waits for each kernel before it
    queues the next, so none is in flight with a dead input: the map read, the map written
    and the convolution's workspace, however busy the GPU."""
    import mlx.core as mx

    if not mx.cuda.is_available():
        pytest.skip("a CUDA build's setting")
    env = {k: v for k, v in os.environ.items() if k != "MLX_MAX_OPS_PER_BUFFER"}
    script = str(ROOT / "scripts" / "bench" / "mlx_conv_memory.py")
    maps = {s: float(subprocess.run([sys.executable, "-c", _CHAIN_PEAK, s, script], capture_output=True,
                                    text=True, check=True, env=env, timeout=120).stdout.split()[-1])
            for s in ("default", "low", "min")}
    assert maps["default"] >= 56 and maps["low"] <= maps["default"] / 2, maps
    assert maps["min"] <= 4 and maps["min"] <= maps["low"], maps
