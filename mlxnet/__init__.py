"""mlxnet: neural networks on Apple's MLX, every op on every back end.

Importing mlxnet points MLX's BLAS calls at an optimised BLAS on Linux, in either import order
(what MLX needs to be usable there; :mod:`mlxnet._blas`), and picks MLX's default device
(:mod:`mlxnet.device`). Nothing else in the process changes: no environment variable (it is
only read, :mod:`mlxnet.env`; the ``mlxnet`` command's own process alone gets MLX's load-time
settings, :mod:`mlxnet._cuda_graphs`), no allocator setting. Its CPU primitives are built on first CPU
use (:mod:`mlxnet._native`); process-wide tuning is opt-in (:func:`tune_cpu`, :func:`tune_gpu`).

The import never fails on an ``MLXNET_*`` setting: one it cannot honour (``MLXNET_DEVICE=gpu``
without a GPU, an unknown value) is raised as a one-line :class:`MlxnetError` by the first use
(:func:`backend`, :func:`current_device`, :func:`kernels_enabled`, so every op), which an
explicit :func:`use_device` before it avoids for ``MLXNET_DEVICE``.
"""
from . import _cuda_graphs

_cuda_graphs.prepare_the_command()  # the mlxnet command's own process only, before MLX loads

from . import _blas, _malloc, _native  # noqa: E402

_blas.bind()

from .device import (  # noqa: E402
    available_devices,
    backend,
    compile_enabled,
    current_device,
    kernels_enabled,
    use_compile,
    use_device,
    use_kernels,
)
from .device import _choose_at_import  # noqa: E402
from .errors import MlxnetError  # noqa: E402

_choose_at_import()

from . import nn, ops  # noqa: E402

__version__ = "0.1.0"
blas_info = _blas.blas_info
malloc_info = _malloc.malloc_info
native_info = _native.native_info
cuda_graphs_info = _cuda_graphs.cuda_graphs_info
cuda_kernels_info = ops.core.cuda_build.info


def tune_cpu() -> None:
    """Opt in to process-wide CPU tuning: glibc keeps freed memory for reuse, so MLX's CPU
    arrays do not page-fault afresh on every op (the process keeps its peak heap). The
    ``mlxnet`` command calls this for its own process unless ``MLXNET_MALLOC=system``
    (``tuned``, the default, or ``system``; see :mod:`mlxnet.env`)."""
    _malloc.configure()


# The memory settings by name (the command's MLXNET_GPU_MEMORY, the benchmarks' options) and the
# tune_gpu arguments each stands for.
GPU_MEMORY_SETTINGS: dict[str, dict] = {"default": {}, "low": {"low_memory": True},
                                        "min": {"low_memory": True, "memory_limit": 0}}


def tune_gpu(low_memory: bool = False, memory_limit: int | None = None, ops_per_buffer: int | None = None) -> None:
    """Opt in to process-wide GPU tuning, before the process's first GPU work: MLX's CUDA
    back end then launches kernels directly instead of recording CUDA graphs, which is faster
    for these models (see :mod:`mlxnet._cuda_graphs`). It sets ``MLX_USE_CUDA_GRAPHS=0`` in
    the environment unless the user set it; Metal and CPU builds ignore it. The ``mlxnet``
    command calls this for its own process. (MLX's convolution-plan cache is sized when its
    library loads, before this can run: start Python with ``MLX_CUDA_CONV_CACHE_SIZE=16384``
    for inputs of many shapes; the command does that for itself.)

    ``low_memory=True`` (the command: ``MLXNET_GPU_MEMORY=low``), on CUDA builds, also has MLX
    run each kernel in a command buffer of its own (``MLX_MAX_OPS_PER_BUFFER=1`` unless the
    user set it), so a forward's intermediates are freed as soon as they are read rather than
    when a batch of a hundred kernels completes: a lower peak, for more host time per kernel
    (docs/performance-notes.md, "Peak memory on CUDA").

    ``memory_limit`` (bytes; every back end, CPU included) sets MLX's memory limit: while more
    than that is in use, MLX waits for the kernels it has queued to finish before it queues the
    next, and a queued kernel is what keeps its inputs alive after their last reader. ``0`` (the
    command: ``MLXNET_GPU_MEMORY=min``, which sets low memory too) waits after every kernel: the
    smallest peak a forward can have, and the same from run to run, for host time per kernel and
    no reuse of MLX's buffer cache. None leaves MLX's limit as it is.

    ``ops_per_buffer`` (CUDA builds; ignored with ``low_memory``): kernels per MLX command buffer,
    between MLX's 100 and low memory's 1 (``mlxnet train detect`` asks for
    :data:`mlxnet.training.detect_loop.OPS_PER_BUFFER`)."""
    if ops_per_buffer is not None and ops_per_buffer < 1:
        raise MlxnetError(f"tune_gpu: ops_per_buffer must be at least 1, got {ops_per_buffer}")
    _cuda_graphs.configure(low_memory, ops_per_buffer=ops_per_buffer)
    if memory_limit is not None:
        if memory_limit < 0:
            raise MlxnetError(f"tune_gpu: memory_limit must be a number of bytes >= 0, got {memory_limit}")
        import mlx.core as mx

        mx.set_memory_limit(int(memory_limit))


__all__ = [
    "GPU_MEMORY_SETTINGS", "MlxnetError", "available_devices", "backend", "blas_info", "compile_enabled",
    "current_device", "cuda_graphs_info", "cuda_kernels_info", "kernels_enabled", "malloc_info", "native_info", "nn", "ops", "tune_cpu",
    "tune_gpu", "use_compile",
    "use_device", "use_kernels", "__version__",
]
