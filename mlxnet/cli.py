"""The ``mlxnet`` command line. Errors print one line and exit non-zero; ``--debug`` shows tracebacks."""
from __future__ import annotations

import importlib
import os
import sys
import warnings
from typing import Optional

import typer

import mlxnet

from . import env
from .commands.guides import epilog
from .errors import MlxnetError

app = typer.Typer(
    name="mlxnet", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None,
    context_settings={"max_content_width": 120},  # plain help, wrapped to the terminal up to 120 columns
    help="Neural networks on MLX: every op on every back end.",
    epilog=epilog(""),
)
_options = {"debug": False}


def _one_line_notes(ctx: typer.Context) -> None:
    """Warnings (e.g. half precision computed in float32 on the CPU) as one ``note:`` line on
    stderr for this command, as the command's other messages are."""
    previous = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        print(f"note: {message}", file=sys.stderr)
    warnings.showwarning = show
    ctx.call_on_close(lambda: setattr(warnings, "showwarning", previous))


@app.callback()
def main(
    ctx: typer.Context,
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors."),
    device: Optional[str] = typer.Option(
        None, "--device", metavar="cpu|gpu", help="cpu or gpu (default: MLXNET_DEVICE, else the best available).",
        show_default=False),
) -> None:
    _options["debug"] = debug
    from .commands import grammar

    grammar.set_debug(debug)
    _one_line_notes(ctx)
    # Every MLXNET_* value is checked before any work, so a typo is one line naming the
    # variable and what it accepts; --device replaces MLXNET_DEVICE (and a problem with it).
    env.check_all()
    if device:
        mlxnet.use_device(device)  # type: ignore[arg-type]
    env.raise_deferred()  # e.g. MLXNET_DEVICE=gpu where MLX has no GPU
    if env.switch("MLXNET_MALLOC") == "tuned":
        mlxnet.tune_cpu()  # this process only: the command owns it
    # likewise (mlxnet.tune_gpu); MLX_USE_CUDA_GRAPHS (and MLX_MAX_OPS_PER_BUFFER) set by the user win
    grammar.apply_gpu_memory()


def _shorten(text: str, limit: int = 10) -> str:
    """A summary line with at most ``limit`` detail lines (the exception keeps them all)."""
    lines = text.splitlines()
    if len(lines) <= limit + 1:
        return text
    return "\n".join(lines[:limit + 1] + [f"  ... and {len(lines) - limit - 1} more (--debug shows all)"])


def _restart_with_load_time_settings() -> None:
    """On a CUDA build, start this command again with the MLX settings read when MLX's library
    loads (mlxnet._cuda_graphs), where they are still missing: once, as the new process has
    them. ``import mlxnet`` sets them in the command's process before MLX loads, so this
    happens only where something loaded MLX before mlxnet (an embedding of the CLI)."""
    from . import _cuda_graphs

    missing = _cuda_graphs.missing_load_time_settings()
    if missing:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**os.environ, **missing})


def run() -> None:
    """Console-script entry point: one-line errors unless --debug."""
    _restart_with_load_time_settings()
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


# Every command is one module, mlxnet/commands/<name>.py, whose function <name> is the command.
COMMANDS = ("info", "models", "ops", "convert", "check", "classify", "detect", "track", "segment", "inpaint", "erase",
            "bench")
for _name in COMMANDS:
    app.command(name=_name, epilog=epilog(_name))(getattr(importlib.import_module(f"mlxnet.commands.{_name}"), _name))
# `mlxnet app` lives with the web app it serves (mlxnet/app/); the web stack loads when it runs.
app.command(name="app", epilog=epilog("app"))(importlib.import_module("mlxnet.app.command").app)
# Command groups: mlxnet/commands/<name>.py holds a typer app of the same name.
for _name in ("train", "val"):
    app.add_typer(getattr(importlib.import_module(f"mlxnet.commands.{_name}"), _name), name=_name)
