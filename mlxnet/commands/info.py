"""`mlxnet info`: versions, back end, device, BLAS, CPU primitives and memory."""
from __future__ import annotations

from typing import Optional

from rich.console import Console
from rich.table import Table

import mlxnet
from mlxnet.commands import grammar


def info(device: Optional[str] = grammar.device()) -> None:
    """MLX version, back end, device, BLAS and memory."""
    grammar.apply_device(device)
    import platform

    import mlx.core as mx

    table = Table(show_header=False, box=None)
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")
    table.add_row("mlxnet", mlxnet.__version__)
    table.add_row("MLX", mx.__version__)
    table.add_row("platform", f"{platform.system()} {platform.machine()}, Python {platform.python_version()}")
    table.add_row("backend", mlxnet.backend())
    table.add_row("device", str(mx.default_device()))
    table.add_row("devices available", ", ".join(mlxnet.available_devices()))
    table.add_row("custom kernels", "on" if mlxnet.kernels_enabled() else "off (MLXNET_KERNELS=0)")
    table.add_row("BLAS (CPU)", mlxnet.blas_info())
    table.add_row("malloc (CPU)", mlxnet.malloc_info())
    limit = mx.get_memory_limit()
    table.add_row("memory limit (MLX)", f"{limit / 2**30:.1f} GiB" if limit else
                  "0: MLX waits for each kernel before queueing the next (MLXNET_GPU_MEMORY=min)")
    if mlxnet.backend() == "cuda":
        table.add_row("GPU dispatch", mlxnet.cuda_graphs_info())
        table.add_row("custom kernels' build", mlxnet.cuda_kernels_info())
    # On the CPU, build or load them now, so the row says what the ops will use.
    table.add_row("CPU primitives", mlxnet.native_info(build=mlxnet.backend() == "cpu"))
    if mlxnet.backend() != "cpu":
        info = mx.device_info()
        mem = info.get("memory_size") or info.get("total_memory")
        table.add_row("device name", str(info.get("device_name", info.get("architecture", "?"))))
        if mem:
            table.add_row("device memory", f"{mem / 2**30:.1f} GiB")
    try:
        import os

        pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        table.add_row("host memory", f"{pages * page / 2**30:.1f} GiB")
    except (ValueError, OSError, AttributeError):
        pass
    Console().print(table)
