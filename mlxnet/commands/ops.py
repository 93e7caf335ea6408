"""`mlxnet ops`: which face of each op runs on which back end."""
from __future__ import annotations

from typing import Optional

from rich import box
from rich.console import Console
from rich.table import Table

import mlxnet
from mlxnet.commands import grammar


def ops(device: Optional[str] = grammar.device()) -> None:
    """Which face of each op runs where: definition, CPU fast path or GPU kernel.

    Every op has a definition; some have a CPU fast path, a GPU kernel or both."""
    from mlxnet.device import gpu_backend

    grammar.apply_device(device)
    gpu = gpu_backend()
    # Metal and CUDA run the same path (one portable source), so they share a column; every
    # cell is a single word or file name and never wraps (fits 80 columns).
    table = Table(title="mlxnet ops", box=box.SIMPLE_HEAD, pad_edge=False)
    for heading in ("op", "cpu", "metal / cuda", "kernel source"):
        table.add_column(heading, no_wrap=True)
    off = "" if mlxnet.kernels_enabled() else " (off)"
    for name, op in sorted(mlxnet.ops.REGISTRY.items()):
        # A GPU path without kernel sources is MLX's own fused op, measured to be fastest there.
        gpu_cell = ("kernel" if op.sources else "MLX built-in") + off if op.has_kernel else "definition"
        cpu_cell = "fast path" + off if op.cpu else "definition"
        files = ", ".join(sorted({k.filename for k in op.sources})) or "-"
        table.add_row(name, cpu_cell, gpu_cell, files)
    console = Console()
    console.print(table)
    console.print(f"back end in force: {mlxnet.backend()}; GPU here: {gpu or 'none'}")
