"""Let MLX launch its CUDA kernels one by one instead of recording them into CUDA graphs.

MLX's CUDA back end records every kernel into a CUDA graph and launches the graph every
``MLX_MAX_OPS_PER_BUFFER`` ops; each cuDNN convolution is stream-captured into a child graph.
For the convolutional models here that recording costs more host time than the kernels take
on the GPU, so the GPU waits; launching directly (``MLX_USE_CUDA_GRAPHS=0``) is faster for every
model we ship (docs/benchmarks.md; ``scripts/bench/bench_dispatch.py`` compares the settings).

MLX reads the variable once per process, at its first GPU operation, and it then holds for
every MLX user in the process. So it is opt-in: :func:`mlxnet.tune_gpu` before the first GPU
work. The ``mlxnet`` command calls it for its own process. A value the user set is kept, so
``MLX_USE_CUDA_GRAPHS=1`` keeps MLX's graphs in the command too.

One setting cannot wait for the first GPU operation: the number of cuDNN convolution plans MLX
keeps (``MLX_CUDA_CONV_CACHE_SIZE``, 128 by default) is read when MLX's library loads, before
any Python code of ours runs. A YOLOv8s forward needs about as many plans as that at one input
shape, so photos of two letterbox shapes taken in turn evict each other's plans and every
forward rebuilds them (about 75 ms instead of 2 on an H200). :data:`LOAD_TIME_SETTINGS` keeps
plans for every letterbox shape of a 640 input. In the ``mlxnet`` command's own process (its
console script, or ``python -m mlxnet``), ``import mlxnet`` sets those the user has not set
before MLX's library loads (:func:`prepare_the_command`); any other process is left as it is. A
library user sets them before starting Python: ``MLX_CUDA_CONV_CACHE_SIZE=16384 python app.py``.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

VARIABLE = "MLX_USE_CUDA_GRAPHS"
# MLX's CUDA back end keeps every buffer a command buffer's kernels read until the whole command
# buffer has run (100 kernels on an H100), so a forward's intermediates pile up where PyTorch's
# allocator frees each one after its last reader (docs/performance-notes.md, "Peak memory on
# CUDA"). One kernel per command buffer frees them as they die, for some host time per kernel:
# the low-memory setting. Metal commits a command buffer every 40-50 ops or 40-50 MB already.
OPS_PER_BUFFER = "MLX_MAX_OPS_PER_BUFFER"
LOAD_TIME_SETTINGS = {"MLX_CUDA_CONV_CACHE_SIZE": "16384"}


def configure(low_memory: bool = False, cuda: bool | None = None, ops_per_buffer: int | None = None) -> None:
    """Ask MLX for direct launches, unless the user chose (Metal and CPU builds ignore it).
    On a CUDA build (``cuda``: whether MLX has one; asked when None), ``low_memory``: one
    kernel per command buffer too (:data:`OPS_PER_BUFFER`); else ``ops_per_buffer``, when given,
    kernels per command buffer (MLX's own default there is 100 on recent GPUs). A value the
    user set is kept."""
    os.environ.setdefault(VARIABLE, "0")
    if not low_memory and ops_per_buffer is None:
        return
    if cuda is None:
        import mlx.core as mx

        cuda = mx.cuda.is_available()
    if cuda:
        os.environ.setdefault(OPS_PER_BUFFER, str(1 if low_memory else int(ops_per_buffer)))


COMMAND = "mlxnet"


def is_the_command() -> bool:
    """Whether this process is the ``mlxnet`` command: its console script (a script named
    ``mlxnet``) or ``python -m mlxnet``, whose package Python imports while ``sys.argv[0]`` is
    still ``-m``."""
    if getattr(sys, "argv", [])[:1] == ["-m"]:  # an embedding interpreter may have no argv
        argv = list(getattr(sys, "orig_argv", ()))
        return "-m" in argv and argv[argv.index("-m") + 1:argv.index("-m") + 2] == [COMMAND]
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None)
    return script is not None and getattr(main, "__spec__", None) is None and Path(script).name == COMMAND


def unset_load_time_settings() -> list[str]:
    """The :data:`LOAD_TIME_SETTINGS` this process's environment does not name: MLX loaded with
    its own defaults for them (unless a value was set after it loaded, which it never read)."""
    return [name for name in LOAD_TIME_SETTINGS if name not in os.environ]


def prepare_the_command() -> None:
    """The load-time settings the user has not set, in the command's own process only: called
    by ``import mlxnet`` before anything loads MLX, so the command needs no second start to
    have them. Metal and CPU builds ignore them."""
    if is_the_command():
        for name, value in LOAD_TIME_SETTINGS.items():
            os.environ.setdefault(name, value)


def missing_load_time_settings(cuda: bool | None = None) -> dict[str, str]:
    """On a CUDA build (``cuda``: whether MLX has one; asked when None), the settings of
    :data:`LOAD_TIME_SETTINGS` that the environment lacks; else none."""
    if cuda is None:
        import mlx.core as mx

        cuda = mx.cuda.is_available()
    return {k: v for k, v in LOAD_TIME_SETTINGS.items() if k not in os.environ} if cuda else {}


def cuda_graphs_info() -> str:
    """What MLX will use (or uses, once its GPU has started) on CUDA builds."""
    value = os.environ.get(VARIABLE)
    plans = os.environ.get("MLX_CUDA_CONV_CACHE_SIZE", "128 (MLX's default)")
    ops = os.environ.get(OPS_PER_BUFFER)
    per_buffer = f"; kernels per command buffer: {ops}" if ops is not None else ""
    if value is None:
        return f"CUDA graphs (MLX's default); convolution plans kept: {plans}{per_buffer}"
    return f"{'CUDA graphs' if _mlx_reads(value) else 'direct launches'} ({VARIABLE}={value}); " \
           f"convolution plans kept: {plans}{per_buffer}"


def _mlx_reads(value: str) -> int:
    """The number MLX reads from the variable: C's atoi (leading digits, else 0), so 'true' or
    'yes' mean 0 to MLX."""
    match = re.match(r"\s*([+-]?\d+)", value)
    return int(match.group(1)) if match else 0
