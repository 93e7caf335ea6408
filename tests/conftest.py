"""Shared test setup: GPU-marked tests run only where MLX sees a Metal or CUDA GPU."""
from __future__ import annotations

import mlxnet  # first: on Linux it binds OpenBLAS before mlx.core loads

import mlx.core as mx  # noqa: E402
import pytest  # noqa: E402

from mlxnet.device import gpu_backend  # noqa: E402

HAS_GPU = gpu_backend() is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a Metal or CUDA GPU (run on the GPU machine or a Mac)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _restore_device():
    """Each test starts on the process default and may switch freely."""
    before = mx.default_device()
    yield
    mx.set_default_device(before)


@pytest.fixture
def gpu() -> str:
    """The GPU back end name ('metal' or 'cuda'); use with @pytest.mark.gpu."""
    mlxnet.use_device("gpu")
    return mlxnet.backend()
