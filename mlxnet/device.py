"""One default device for the whole process.

MLX arrays carry no device: every op runs on the default device (or the stream of an
enclosing ``mx.stream``). mlxnet therefore never takes a device argument. The device is
chosen once at import (Apple GPU, else CUDA GPU, else CPU; ``MLXNET_DEVICE`` overrides),
and :func:`backend` reads the device in force *at call time*, so a user who switches MLX's
default device, or wraps code in ``with mx.stream(mx.cpu)``, still gets the right code path.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator, Literal

import mlx.core as mx

from .errors import MlxnetError

DeviceName = Literal["cpu", "gpu"]
Backend = Literal["metal", "cuda", "cpu"]


def gpu_backend() -> Backend | None:
    """The GPU back end MLX was built with and can reach here, or None."""
    if mx.metal.is_available():
        return "metal"
    cuda = getattr(mx, "cuda", None)
    if cuda is not None and cuda.is_available():
        return "cuda"
    return None


def available_devices() -> list[str]:
    gpu = gpu_backend()
    return ["cpu"] + ([f"gpu ({gpu})"] if gpu else [])


def _to_mx(name: str) -> mx.Device:
    name = name.strip().lower()
    if name == "cpu":
        return mx.cpu
    if name == "gpu":
        if gpu_backend() is None:
            raise MlxnetError(
                "device 'gpu' requested but MLX sees no Metal or CUDA GPU here; "
                f"available: {', '.join(available_devices())}"
            )
        return mx.gpu
    raise MlxnetError(f"unknown device {name!r}: expected 'cpu' or 'gpu'")


def backend() -> Backend:
    """'metal', 'cuda' or 'cpu' for the device in force right now (never cached)."""
    if mx.default_device().type == mx.DeviceType.gpu:
        return gpu_backend() or "cpu"
    return "cpu"


def current_device() -> DeviceName:
    return "gpu" if mx.default_device().type == mx.DeviceType.gpu else "cpu"


class use_device:
    """Set the process's device: ``mlxnet.use_device("cpu")``, or scoped as a context manager.

    >>> with mlxnet.use_device("cpu"):
    ...     y = model(x)   # runs on the CPU
    """

    def __init__(self, name: DeviceName) -> None:
        self._previous = mx.default_device()
        mx.set_default_device(_to_mx(name))

    def __enter__(self) -> "use_device":
        return self

    def __exit__(self, *exc: object) -> None:
        mx.set_default_device(self._previous)


def _choose_at_import() -> None:
    wanted = os.environ.get("MLXNET_DEVICE", "").strip()
    if wanted:
        mx.set_default_device(_to_mx(wanted))
    else:
        mx.set_default_device(mx.gpu if gpu_backend() else mx.cpu)


def kernels_enabled() -> bool:
    """Whether ops run their fast faces (CPU fast paths, GPU kernels): yes unless
    ``MLXNET_KERNELS=0`` (read at every call) or a :func:`use_kernels` block says otherwise;
    when off, every op runs its definition."""
    if _kernels_override:
        return _kernels_override[-1]
    return os.environ.get("MLXNET_KERNELS", "1").strip().lower() not in ("0", "false", "off", "no")


_kernels_override: list[bool] = []


@contextmanager
def use_kernels(enabled: bool) -> Iterator[None]:
    """Scoped switch: with False every op runs its definition (no CPU fast path, no GPU kernel)."""
    _kernels_override.append(enabled)
    try:
        yield
    finally:
        _kernels_override.pop()
