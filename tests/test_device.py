"""The one-default-device rules."""
from __future__ import annotations

import subprocess
import sys

import mlx.core as mx
import pytest

import mlxnet
from mlxnet import ops
from mlxnet.device import gpu_backend
from testutil import assert_close

RUN = [sys.executable, "-c"]


def test_backend_follows_mlx_default_device_at_call_time():
    mlxnet.use_device("cpu")
    assert mlxnet.backend() == "cpu"
    assert mlxnet.current_device() == "cpu"
    mx.set_default_device(mx.cpu)  # behind our back: still read live
    assert mlxnet.backend() == "cpu"


def test_use_device_context_restores_previous():
    before = mx.default_device()
    with mlxnet.use_device("cpu"):
        assert mx.default_device() == mx.cpu
    assert mx.default_device() == before


def test_unknown_device_name_is_a_clear_error():
    with pytest.raises(mlxnet.MlxnetError, match="unknown device 'tpu'"):
        mlxnet.use_device("tpu")  # type: ignore[arg-type]


@pytest.mark.skipif(gpu_backend() is not None, reason="this machine has a GPU")
def test_gpu_without_one_names_what_is_available():
    with pytest.raises(mlxnet.MlxnetError, match="no Metal or CUDA GPU.*available: cpu"):
        mlxnet.use_device("gpu")


def test_env_override_is_read_at_import():
    out = subprocess.run(RUN + ["import mlxnet; print(mlxnet.backend())"], capture_output=True,
                         text=True, env={**_env(), "MLXNET_DEVICE": "cpu"}, check=True)
    assert out.stdout.strip() == "cpu"


def test_env_override_bad_value_is_a_one_line_error_at_first_use():
    """import never fails on a setting (the CLI could not catch it); the first use says it."""
    code = "import mlxnet\ntry:\n    mlxnet.backend()\nexcept mlxnet.MlxnetError as e:\n    print(e)"
    out = subprocess.run(RUN + [code], capture_output=True, text=True, env={**_env(), "MLXNET_DEVICE": "npu"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "MLXNET_DEVICE: unknown device 'npu': expected 'cpu' or 'gpu'"


def test_kernel_switch_reads_env_at_call_time(monkeypatch):
    monkeypatch.setenv("MLXNET_KERNELS", "0")
    assert not mlxnet.kernels_enabled()
    monkeypatch.setenv("MLXNET_KERNELS", "1")
    assert mlxnet.kernels_enabled()
    with mlxnet.use_kernels(False):
        assert not mlxnet.kernels_enabled()
    assert mlxnet.kernels_enabled()


@pytest.mark.gpu
def test_switching_devices_mid_program_gives_equal_results(gpu):
    x = mx.random.normal((3, 9, 11, 64), key=mx.random.key(0))
    w, b = mx.random.normal((64,), key=mx.random.key(1)), mx.random.normal((64,), key=mx.random.key(2))
    on_gpu = ops.layer_norm(x, w, b)
    assert ops.get("layer_norm").uses_kernel()
    mlxnet.use_device("cpu")
    assert mlxnet.backend() == "cpu"
    on_cpu = ops.layer_norm(x, w, b)
    mlxnet.use_device("gpu")
    again = ops.layer_norm(x, w, b)
    assert_close(on_gpu, on_cpu)
    assert_close(again, on_cpu)


@pytest.mark.gpu
def test_cpu_stream_inside_gpu_default_uses_reference(gpu):
    x = mx.random.normal((4, 7, 48), key=mx.random.key(3))
    on_gpu = ops.layer_norm(x)
    with mx.stream(mx.cpu):
        assert mlxnet.backend() == "cpu"
        assert not ops.get("layer_norm").uses_kernel()
        on_cpu = ops.layer_norm(x)
        mx.eval(on_cpu)
    assert mlxnet.backend() == gpu
    assert_close(on_gpu, on_cpu)


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("MLXNET_")}
