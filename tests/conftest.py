"""Shared test setup: GPU-marked tests run only where MLX sees a Metal or CUDA GPU."""
from __future__ import annotations

import os

import mlxnet  # on Linux it gives MLX OpenBLAS

import mlx.core as mx  # noqa: E402
import pytest  # noqa: E402

from mlxnet.device import gpu_backend  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# Property tests: the default run replays the same examples every time and writes no example
# database; HYPOTHESIS_PROFILE=sweep draws fresh ones (MLXNET_SWEEP_EXAMPLES per test).
_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile("default", max_examples=25, deadline=None, derandomize=True, database=None,
                          suppress_health_check=_QUIET)
settings.register_profile("sweep", max_examples=int(os.environ.get("MLXNET_SWEEP_EXAMPLES", "400")),
                          deadline=None, derandomize=False, database=None, print_blob=True,
                          suppress_health_check=_QUIET)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

HAS_GPU = gpu_backend() is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a Metal or CUDA GPU")
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
