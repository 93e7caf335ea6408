"""The ``mlxnet`` command line. Errors print one line and exit non-zero; ``--debug`` shows tracebacks."""
from __future__ import annotations

import os
import sys
from typing import Optional

import typer
from rich import box
from rich.console import Console
from rich.table import Table

import mlxnet

from .errors import MlxnetError

app = typer.Typer(
    name="mlxnet", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    help="Neural networks on MLX: every op on every back end.",
)
console = Console()
_options = {"debug": False}


@app.callback()
def main(
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors."),
    device: Optional[str] = typer.Option(
        None, "--device", help="cpu or gpu (default: MLXNET_DEVICE, else the best available)."),
) -> None:
    _options["debug"] = debug
    if os.environ.get("MLXNET_MALLOC", "").strip().lower() != "system":
        mlxnet.tune_cpu()  # this process only: the command owns it
    if device:
        mlxnet.use_device(device)  # type: ignore[arg-type]


@app.command()
def info() -> None:
    """MLX version, back end, device, BLAS and memory."""
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
    console.print(table)


@app.command()
def ops() -> None:
    """The op × back-end matrix: which face of each op runs where (every op has a definition;
    some have a CPU fast path, a GPU kernel or both)."""
    from .device import gpu_backend

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
    console.print(table)
    console.print(f"back end in force: {mlxnet.backend()}; GPU here: {gpu or 'none'}")


@app.command()
def convert(
    src: str = typer.Argument(..., help="PyTorch checkpoint (.pt/.pth/.ckpt, read without running pickled code), "
                              "safetensors file, or a model id to fetch from the Hub."),
    dst: str = typer.Argument(..., help="Output .safetensors file (mlxnet layout)."),
    model: str = typer.Option(..., "--model", help="Weight spec id: the key table and layouts to apply."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="Cast floating tensors: float16, bfloat16 or float32."),
    fold_bn: bool = typer.Option(False, "--fold-bn", help="Fold BatchNorms into the convs the spec pairs them with."),
    force: bool = typer.Option(False, "--force", help="Overwrite DST if it exists."),
) -> None:
    """Convert a PyTorch checkpoint into mlxnet safetensors (SRC is never modified)."""
    from .weights import convert_checkpoint, load_safetensors

    out = convert_checkpoint(src, dst, model, dtype=dtype, fold_bn=fold_bn, force=force)
    weights = load_safetensors(out)
    size = sum(v.nbytes for v in weights.values())
    console.print(f"wrote {out}: {len(weights)} tensors, {size / 2**20:.1f} MiB (model {model})", soft_wrap=True)


def _shorten(text: str, limit: int = 10) -> str:
    """A summary line with at most ``limit`` detail lines (the exception keeps them all)."""
    lines = text.splitlines()
    if len(lines) <= limit + 1:
        return text
    return "\n".join(lines[:limit + 1] + [f"  ... and {len(lines) - limit - 1} more (--debug shows all)"])


def run() -> None:
    """Console-script entry point: one-line errors unless --debug."""
    try:
        code = app(standalone_mode=False)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        print("aborted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 - every error ends as one line
        if hasattr(e, "show") and hasattr(e, "exit_code"):  # usage errors (typer vendors click)
            e.show()
            sys.exit(e.exit_code)
        if _options["debug"]:
            raise
        text = str(e) if isinstance(e, (MlxnetError, FileNotFoundError)) else f"{type(e).__name__}: {e}"
        print(f"error: {_shorten(text)}", file=sys.stderr)
        sys.exit(1)
    if isinstance(code, int) and code:
        sys.exit(code)


# Model commands live in mlxnet/commands/<name>.py; each registers here with one line.
from .commands import check as _check, classify as _classify  # noqa: E402

app.command(name="classify")(_classify.classify)
app.command(name="check")(_check.check)
from .commands import detect as _detect  # noqa: E402

app.command(name="detect")(_detect.detect)
from .commands import inpaint as _inpaint  # noqa: E402

app.command(name="inpaint")(_inpaint.inpaint)
from .commands import segment as _segment  # noqa: E402

app.command(name="segment")(_segment.segment)
