"""Hostile environments (issue 22): every MLXNET_* switch validated with one line naming what it
accepts, a GPU asked for where there is none, and an import that leaves the environment alone."""
from __future__ import annotations

import os
import subprocess
import sys

import mlx.core as mx
import pytest

import mlxnet
from mlxnet import env
from mlxnet.device import gpu_backend


def clean_env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MLXNET_")}
    return {**base, **extra}


def python(code: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=clean_env(**extra), timeout=120)


def cli(*args: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlxnet", *args], capture_output=True, text=True,
                          env=clean_env(**extra), timeout=120)


BOGUS = {
    "MLXNET_DEVICE": ("npu", "expected 'cpu' or 'gpu'"),
    "MLXNET_BLAS": ("fast", "expected 'openblas', '1', 'on', 'reference', '0' or 'off'"),
    "MLXNET_KERNELS": ("maybe", "expected '1', 'on', 'true', 'yes', '0', 'off', 'false' or 'no'"),
    "MLXNET_NATIVE": ("sometimes", "expected '1', 'on', 'true', 'yes', '0', 'off', 'false' or 'no'"),
    "MLXNET_MALLOC": ("jemalloc", "expected 'tuned' or 'system'"),
}


@pytest.mark.parametrize("variable", list(BOGUS))
def test_the_command_rejects_a_bogus_value_in_one_line(variable):
    value, accepted = BOGUS[variable]
    out = cli("ops", **{variable: value})
    assert out.returncode == 1, out.stdout
    assert out.stderr.strip().splitlines() == [f"error: {variable}: unknown {env.SWITCHES[variable].what} "
                                               f"{value!r}: {accepted}"]
    assert out.stdout == ""


# How a library user meets each bogus value: at the first use that depends on it.
FIRST_USE = {
    "MLXNET_DEVICE": "mlxnet.backend()",
    "MLXNET_BLAS": "mlxnet.backend()",
    "MLXNET_KERNELS": "mlxnet.kernels_enabled()",
    "MLXNET_NATIVE": "mlxnet.use_device('cpu'); mlxnet.native_info(build=True)",
}


def test_the_library_imports_and_raises_at_first_use():
    # One process per variable (they are read at import); the code reports instead of raising,
    # so each run's whole answer is one line.
    for variable, use in FIRST_USE.items():
        value, accepted = BOGUS[variable]
        code = ("import mlxnet\n"
                "try:\n"
                f"    {use}\n"
                "    print('no error')\n"
                "except mlxnet.MlxnetError as e:\n"
                "    print(type(e).__name__, str(e))\n")
        out = python(code, **{variable: value})
        assert out.returncode == 0 and out.stderr == "", (variable, out.stderr)
        assert out.stdout.strip() == (f"MlxnetError {variable}: unknown {env.SWITCHES[variable].what} "
                                      f"{value!r}: {accepted}"), variable


@pytest.mark.skipif(gpu_backend() is not None, reason="this machine has a GPU")
def test_gpu_asked_for_without_one():
    out = cli("ops", MLXNET_DEVICE="gpu")
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        "error: MLXNET_DEVICE=gpu: device 'gpu' requested but MLX sees no Metal or CUDA GPU here; "
        "available: cpu"]
    # --device replaces the variable's default, and so its problem
    assert cli("--device", "cpu", "ops", MLXNET_DEVICE="gpu").returncode == 0
    # the library: the import works, the first use says why, an explicit device replaces it
    code = ("import mlxnet\n"
            "try:\n"
            "    mlxnet.backend()\n"
            "except mlxnet.MlxnetError as e:\n"
            "    print(e)\n"
            "mlxnet.use_device('cpu'); print(mlxnet.backend())\n")
    out = python(code, MLXNET_DEVICE="gpu")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert out.stdout.splitlines() == [
        "MLXNET_DEVICE=gpu: device 'gpu' requested but MLX sees no Metal or CUDA GPU here; available: cpu",
        "cpu"]


def test_switch_spellings(monkeypatch):
    for raw, meaning in [("", "on"), ("  ", "on"), ("OFF", "off"), (" no ", "off"), ("True", "on")]:
        monkeypatch.setenv("MLXNET_KERNELS", raw)
        assert env.switch("MLXNET_KERNELS") == meaning
    monkeypatch.delenv("MLXNET_KERNELS")
    assert env.switch("MLXNET_KERNELS") == "on"
    monkeypatch.setenv("MLXNET_KERNELS", "o\nff")  # one line, whatever the value holds
    with pytest.raises(mlxnet.MlxnetError) as err:
        mlxnet.kernels_enabled()
    assert "\n" not in str(err.value) and "'o\\nff'" in str(err.value)


def test_an_explicit_device_scope_restores_the_deferred_problem():
    before = env.deferred("MLXNET_DEVICE")
    env.defer("MLXNET_DEVICE", "MLXNET_DEVICE=gpu: no GPU here")
    try:
        with pytest.raises(mlxnet.MlxnetError, match="no GPU here"):
            mlxnet.current_device()
        with mlxnet.use_device("cpu"):
            assert mlxnet.backend() == "cpu"
        with pytest.raises(mlxnet.MlxnetError, match="no GPU here"):
            mlxnet.backend()
    finally:
        env.defer("MLXNET_DEVICE", before)
        mx.set_default_device(mx.cpu)


def test_import_and_first_use_leave_the_environment_alone():
    # os.environ, PATH and the C library's own environment (what a native library could change
    # with setenv) compared before and after: import, first use, the opt-in tuning.
    code = ("import ctypes, os\n"
            "def c_environ():\n"
            "    table = ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), 'environ')\n"
            "    out, i = [], 0\n"
            "    while table[i] is not None:\n"
            "        out.append(table[i]); i += 1\n"
            "    return sorted(out)\n"
            "before, path, c_before = dict(os.environ), os.environ['PATH'], c_environ()\n"
            "import mlxnet\n"
            "mlxnet.backend(); mlxnet.kernels_enabled(); mlxnet.blas_info(); mlxnet.tune_cpu()\n"
            "print(dict(os.environ) == before, os.environ['PATH'] == path, c_environ() == c_before)\n")
    for extra in ({}, {"MLXNET_DEVICE": "cpu", "MLXNET_BLAS": "off", "MLXNET_KERNELS": "0"},
                  {"OPENBLAS_THREAD_TIMEOUT": "20"}):
        out = python(code, **extra)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["True", "True", "True"], (extra, out.stdout)
