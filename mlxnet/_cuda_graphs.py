"""Let MLX launch its CUDA kernels one by one instead of recording them into CUDA graphs.

MLX's CUDA back end records every kernel into a CUDA graph and launches the graph every
``MLX_MAX_OPS_PER_BUFFER`` ops; each cuDNN convolution is stream-captured into a child graph.
For the convolutional models here that recording costs more host time than the kernels take
on the GPU, so the GPU waits; launching directly (``MLX_USE_CUDA_GRAPHS=0``) is faster for every
model we ship (README "Performance"; ``scripts/bench/bench_dispatch.py`` compares the settings).

MLX reads the variable once per process, at its first GPU operation, and it then holds for
every MLX user in the process. So it is opt-in: :func:`mlxnet.tune_gpu` before the first GPU
work. The ``mlxnet`` command calls it for its own process. A value the user set is kept, so
``MLX_USE_CUDA_GRAPHS=1`` keeps MLX's graphs in the command too.

The same opt-in sizes MLX's cache of cuDNN convolution plans for folders of photos. MLX keeps
128 plans (one per convolution input shape) and, counting every plan it ever built, stops the
process with "Cache thrashing is happening" after 256: a YOLOv8 forward has about 60
convolution shapes per input shape, so a folder of photos of five letterbox shapes (or a server
seeing many sizes) would end there. :data:`CACHE_SETTINGS` keeps more plans and turns the
lifetime count off (a plan built again costs milliseconds, not a wrong result). Values the
user set are kept.
"""
from __future__ import annotations

import os
import re

VARIABLE = "MLX_USE_CUDA_GRAPHS"
CACHE_SETTINGS = {"MLX_CUDA_CONV_CACHE_SIZE": "2048", "MLX_ENABLE_CACHE_THRASHING_CHECK": "0"}


def configure() -> None:
    """Ask MLX for direct launches and a larger convolution-plan cache, unless the user chose
    (Metal and CPU builds ignore both)."""
    os.environ.setdefault(VARIABLE, "0")
    for name, value in CACHE_SETTINGS.items():
        os.environ.setdefault(name, value)


def cuda_graphs_info() -> str:
    """What MLX will use (or uses, once its GPU has started) on CUDA builds."""
    value = os.environ.get(VARIABLE)
    if value is None:
        return "CUDA graphs (MLX's default)"
    return f"{'CUDA graphs' if _mlx_reads(value) else 'direct launches'} ({VARIABLE}={value})"


def _mlx_reads(value: str) -> int:
    """The number MLX reads from the variable: C's atoi (leading digits, else 0), so 'true' or
    'yes' mean 0 to MLX."""
    match = re.match(r"\s*([+-]?\d+)", value)
    return int(match.group(1)) if match else 0
