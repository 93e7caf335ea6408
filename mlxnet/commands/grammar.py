"""One grammar for every command: the shared arguments and options, spelled and explained once.

| element | meaning |
|---|---|
| `SOURCE...` | image files, folders (searched recursively), quoted glob patterns or http(s) URLs |
| `-o/--output PATH` | where results go: a folder; with one source, a path with an image extension names the file itself |
| `-m/--model ID` | the model variant (`mlxnet models` lists them) |
| `-w/--weights ID\\|FILE\\|random` | a hub id, a local file, or seeded random weights (offline trials) |
| `--dtype float32\\|float16\\|bfloat16` | compute precision; half precision on the CPU computes in float32, with a note |
| `--device cpu\\|gpu` | before or after the command name |
| `--batch N` | images per forward (or training batch) |
| `--json` | JSON Lines on stdout (one object per image); progress and notes go to stderr |
| `--force` | replace what a command would otherwise refuse to overwrite |

URLs are downloaded with their batch into a private temporary folder removed at exit, at most
`MLXNET_DOWNLOAD_MAX_MB` (default 50) megabytes each, connecting and each wait for data at most
`MLXNET_DOWNLOAD_TIMEOUT` (default 30) seconds (mlxnet/commands/remote.py); a failed download fails
that source alone, and the output is named after the URL's last path segment.

Overwrite rules: no command ever writes over one of its inputs. Image commands (detect, segment,
inpaint) write into `-o` and replace their own earlier results of the same name there; `convert`
refuses an existing file and `train` an existing run unless `--force` (or `--resume` to continue).
"""
from __future__ import annotations

from typing import Any, Optional

import typer

DTYPE_NAMES = ("float32", "float16", "bfloat16")

SOURCES_HELP = ("Image files, folders (searched recursively), quoted glob patterns ('photos/**/*.jpg') "
                "or http(s) URLs (downloaded; limits: MLXNET_DOWNLOAD_MAX_MB, default 50, and "
                "MLXNET_DOWNLOAD_TIMEOUT, default 30 s).")
OUTPUT_HELP = ("Folder for the results (inputs keep their relative paths below it); with one source, "
               "a path with an image extension (.png, .jpg) is the file itself.")


def sources(help: str = SOURCES_HELP, required: bool = True) -> Any:
    """The SOURCE... argument; ``required=False`` where an argument after it (inpaint's MASK)
    would otherwise take a lone value and leave click to call SOURCE missing: the command then
    says what is missing itself."""
    return typer.Argument(... if required else None, metavar="SOURCE...", help=help, show_default=False)


def output(help: str = OUTPUT_HELP, default: Any = ...) -> Any:
    return typer.Option(default, "--output", "-o", metavar="PATH", help=help,
                        show_default=default is not ...)


def model(task_ids: str, default: str) -> Any:
    return typer.Option(None, "--model", "-m", metavar="ID",
                        help=f"{task_ids} (default: what --weights holds, else {default}; `mlxnet models` lists all).")


def weights(default_help: str = "the model's official weights from the hub", default: Optional[str] = None) -> Any:
    return typer.Option(default, "--weights", "-w", metavar="ID|FILE|random",
                        help=f"Weights: a hub id, a local file, or 'random' (seeded, for trying a command "
                             f"offline). Default: {default_help}.", show_default=False)


def dtype(help: str = "Compute precision: float32, float16 or bfloat16 (on the CPU half precision "
                      "computes in float32, with a note).") -> Any:
    return typer.Option("float32", "--dtype", metavar="DTYPE", help=help)


def device() -> Any:
    return typer.Option(None, "--device", metavar="cpu|gpu",
                        help="cpu or gpu (also accepted before the command; default: MLXNET_DEVICE, "
                             "else the best available).", show_default=False)


def batch(default: int, help: str = "Images per forward pass (memory grows with it).") -> Any:
    return typer.Option(default, "--batch", min=1, metavar="N", help=help)


def read_ahead() -> Any:
    """``--batch`` of the commands whose model runs one image at a time (SAM, LaMa)."""
    return batch(1, "Images read at a time (each runs on its own).")


def json_lines(help: str = "Print JSON Lines (one object per image) instead of text.") -> Any:
    return typer.Option(False, "--json", help=help)


def force(help: str) -> Any:
    return typer.Option(False, "--force", help=help)


def apply_device(name: Optional[str], ops_per_buffer: int | None = None) -> None:
    """``--device`` given after the command name: the same as before it. ``ops_per_buffer``: a
    command's own kernels per MLX command buffer on CUDA (:func:`mlxnet.tune_gpu`), before its
    first GPU work."""
    if name:
        import mlxnet

        mlxnet.use_device(name)  # type: ignore[arg-type]
    if name or ops_per_buffer is not None:
        apply_gpu_memory(ops_per_buffer)


_mlx_memory_limit: list[int] = []  # MLX's own limit, from before the command first set one


def apply_gpu_memory(ops_per_buffer: int | None = None) -> None:
    """The command's GPU tuning (:func:`mlxnet.tune_gpu`) with ``MLXNET_GPU_MEMORY`` for the
    device the command runs on, called again when ``--device`` changes it. The memory setting
    is the GPU's: MLX's memory limit (min) would hold for a CPU run too, where waiting for each
    op and giving up MLX's buffer cache cost far more than they save, so a CPU run keeps MLX's
    own limit."""
    import mlx.core as mx

    import mlxnet
    from mlxnet import env

    if not _mlx_memory_limit:
        _mlx_memory_limit.append(mx.get_memory_limit())
    setting = env.switch("MLXNET_GPU_MEMORY") if mlxnet.current_device() == "gpu" else "default"
    mlxnet.tune_gpu(**{"memory_limit": _mlx_memory_limit[0], "ops_per_buffer": ops_per_buffer,
                       **mlxnet.GPU_MEMORY_SETTINGS[setting]})


def check_dtype(name: str) -> str:
    from mlxnet.errors import MlxnetError

    if name not in DTYPE_NAMES:
        raise MlxnetError(f"--dtype: expected float32, float16 or bfloat16, got {name!r}")
    return name


def numbers(text: str, n: int, option: str, what: str) -> list[float]:
    """A prompt option's value (``--point X,Y``, ``--box X1,Y1,X2,Y2``): ``n`` comma-separated
    finite numbers, or a one-line error naming the option and what it expects."""
    import math

    from mlxnet.errors import MlxnetError

    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        values = []
    if len(values) != n or not all(math.isfinite(v) for v in values):
        raise MlxnetError(f"{option}: expected {what} ({n} comma-separated numbers), got {text!r}")
    return values


# --debug (an option of the command line, before the command): per-image errors show their
# traceback too. Set once by the command line's callback, read where an image's error is reported.
_DEBUG = {"on": False}


def set_debug(on: bool) -> None:
    _DEBUG["on"] = on


def debugging() -> bool:
    return _DEBUG["on"]
