"""One default device for the whole process.

MLX arrays carry no device: every op runs on the default device (or the stream of an
enclosing ``mx.stream``). mlxnet therefore never takes a device argument. The device is
chosen once at import (Apple GPU, else CUDA GPU, else CPU; ``MLXNET_DEVICE`` overrides),
and :func:`backend` reads the device in force *at call time*, so a user who switches MLX's
default device, or wraps code in ``with mx.stream(mx.cpu)``, still gets the right code path.

A ``MLXNET_DEVICE`` that cannot be honoured (an unknown name, or ``gpu`` where MLX has none)
does not fail the import: the CPU stays the default and the problem is raised, as one-line
MlxnetError, by the first :func:`backend`, :func:`current_device` or :func:`kernels_enabled`
call (every op makes one), unless :func:`use_device` has chosen a device explicitly first
(see :mod:`mlxnet.env`).
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import ContextManager, Iterator, Literal

import mlx.core as mx

from . import env
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
    """The MLX device for "cpu" or "gpu", else a one-line MlxnetError saying what exists."""
    wanted = name.strip().lower()
    if wanted == "cpu":
        return mx.cpu
    if wanted == "gpu":
        if gpu_backend() is None:
            raise MlxnetError("device 'gpu' requested but MLX sees no Metal or CUDA GPU here; "
                              f"available: {', '.join(available_devices())}")
        return mx.gpu
    raise MlxnetError(f"unknown device {name.strip()!r}: expected {env.expected(['cpu', 'gpu'])}")


def backend() -> Backend:
    """'metal', 'cuda' or 'cpu' for the device in force right now (never cached)."""
    env.raise_deferred()
    if mx.default_device().type == mx.DeviceType.gpu:
        return gpu_backend() or "cpu"
    return "cpu"


def current_device() -> DeviceName:
    env.raise_deferred()
    return "gpu" if mx.default_device().type == mx.DeviceType.gpu else "cpu"


class use_device:
    """Set the process's device: ``mlxnet.use_device("cpu")``, or scoped as a context manager.

    >>> with mlxnet.use_device("cpu"):
    ...     y = model(x)   # runs on the CPU
    """

    def __init__(self, name: DeviceName) -> None:
        device = _to_mx(name)
        self._previous = mx.default_device()
        # An explicit choice replaces the MLXNET_DEVICE default, and so that default's problem.
        self._previous_problem = env.deferred("MLXNET_DEVICE")
        mx.set_default_device(device)
        env.defer("MLXNET_DEVICE", None)

    def __enter__(self) -> "use_device":
        return self

    def __exit__(self, *exc: object) -> None:
        mx.set_default_device(self._previous)
        env.defer("MLXNET_DEVICE", self._previous_problem)


def _choose_at_import() -> None:
    """Set the default device from MLXNET_DEVICE, else the best there is. Never raises: a
    setting that cannot be honoured leaves the CPU and is deferred to the first use."""
    try:
        wanted = env.switch("MLXNET_DEVICE")
        if wanted == "auto":
            device = mx.gpu if gpu_backend() else mx.cpu
        else:
            try:
                device = _to_mx(wanted)
            except MlxnetError as e:
                raise MlxnetError(f"MLXNET_DEVICE={wanted}: {e}") from None
    except MlxnetError as e:
        env.defer("MLXNET_DEVICE", str(e))
        device = mx.cpu
    mx.set_default_device(device)


def kernels_enabled() -> bool:
    """Whether ops run their fast faces (CPU fast paths, GPU kernels): yes unless
    ``MLXNET_KERNELS`` is off (0/off/false/no, read at every call) or a :func:`use_kernels`
    block says otherwise; when off, every op runs its definition."""
    env.raise_deferred()
    if _kernels_override:
        return _kernels_override[-1]
    return env.switch("MLXNET_KERNELS") == "on"


_kernels_override: list[bool] = []


@contextmanager
def _pushed(stack: list[bool], value: bool) -> Iterator[None]:
    """``value`` on top of a switch's override stack for the block (nested blocks stack)."""
    stack.append(value)
    try:
        yield
    finally:
        stack.pop()


def use_kernels(enabled: bool) -> ContextManager[None]:
    """Scoped switch: with False every op runs its definition (no CPU fast path, no GPU kernel)."""
    return _pushed(_kernels_override, enabled)


def compile_enabled() -> bool:
    """Whether models run their inference forward under ``mx.compile``
    (:func:`mlxnet.nn.compiled_for_inference`): by default on GPU back ends, where it fuses the
    elementwise tails of convs and matmuls into single kernels and builds each forward's graph
    once per input shape; not on the CPU, where the fast paths fuse what matters already and a
    compiled forward measured slower. ``MLXNET_COMPILE`` (auto, on or off, read at every call)
    or a :func:`use_compile` block decides otherwise."""
    if _compile_override:
        return _compile_override[-1]
    setting = env.switch("MLXNET_COMPILE")
    return setting == "on" or (setting == "auto" and backend() != "cpu")


_compile_override: list[bool] = []


def use_compile(enabled: bool) -> ContextManager[None]:
    """Scoped switch: with False models run their forward eagerly, op by op (what a
    layer-by-layer check needs); with True compiled on any back end."""
    return _pushed(_compile_override, enabled)


_tracing: list[bool] = []


def tracing() -> ContextManager[None]:
    """Marks a forward being traced by ``mx.compile``, where nothing may be evaluated."""
    return _pushed(_tracing, True)


def is_tracing() -> bool:
    """Whether an op runs inside a compiled forward's trace (it must not call ``mx.eval``)."""
    return bool(_tracing)


_differentiating: list[bool] = []


def differentiating() -> ContextManager[None]:
    """Marks a graph built to be differentiated (a training step's forward): ops may pick the
    forms whose backward costs less, which inference would not gain from."""
    return _pushed(_differentiating, True)


def is_differentiating() -> bool:
    """Whether the op being called is part of a graph that will be differentiated."""
    return bool(_differentiating)


def trim_cache(keep_bytes: int) -> int:
    """Free MLX's cached buffers if they hold more than ``keep_bytes``; the bytes freed (0 when
    kept).

    MLX keeps freed buffers for reuse, on GPUs up to its memory limit (about the device's), so a
    finished large job (a 12 MP erase) can leave gigabytes cached in an idle process; on a Mac
    that is memory the rest of the system shares. The cache is the process's, so applications
    call this between units of work (``mlxnet app`` after each request); library calls never do.
    """
    cached = mx.get_cache_memory()
    if cached <= keep_bytes:
        return 0
    mx.clear_cache()
    return cached


def memory_first() -> bool:
    """Whether this process runs MLX one kernel per command buffer (``mlxnet.tune_gpu(
    low_memory=True)``, ``MLXNET_GPU_MEMORY=low``, or the user's own ``MLX_MAX_OPS_PER_BUFFER=1``):
    it has chosen a lower peak over speed, so ops skip formulations that are faster only by
    holding large temporaries."""
    return os.environ.get("MLX_MAX_OPS_PER_BUFFER") == "1"
