"""`mlxnet check`: compare a model on two configurations, layer by layer."""
from __future__ import annotations

import json
from typing import Optional

import typer

from mlxnet.commands import grammar


def check(
    model: str = typer.Argument(..., metavar="ID", help="Model variant (`mlxnet models` lists them)."),
    image: Optional[str] = typer.Option(None, "--image", help="Run on this image (default: random input)."),
    weights: Optional[str] = grammar.weights("random"),
    dtype: str = grammar.dtype("Precision of the tested run: float32, float16 or bfloat16 (it runs in that "
                               "precision on every device: this is what check tests)."),
    against: str = typer.Option("cpu", "--against", help="Baseline: 'cpu' (every op's definition "
                                "on the CPU) or 'definitions' (definitions on this device)."),
    size: int = typer.Option(224, "--size", help="Side of the random input image."),
    show_all: bool = typer.Option(False, "--all", help="List every layer, not only failures."),
    device: Optional[str] = grammar.device(),
    as_json: bool = grammar.json_lines("Print the report as JSON."),
) -> None:
    """Compare MODEL layer by layer with the ops' definitions; exit 1 on a divergence.

    The tested run uses this device's fast faces (CPU fast paths or GPU kernels) in DTYPE; the
    baseline runs every op's definition in float32. The first layer beyond tolerance is named."""
    import mlx.core as mx

    from mlxnet import check as parity, families
    from mlxnet.image import load_image

    grammar.apply_device(device)
    grammar.check_dtype(dtype)
    mx.random.seed(0)
    net, inputs = families.build_for_check(model, weights, load_image(image) if image else None, size)
    report = parity.compare(net, inputs, against=against, dtype=dtype)  # type: ignore[arg-type]
    if as_json:
        print(json.dumps(report.to_dict(), indent=1, default=float))
    else:
        _print(report, show_all)
    if not report.passed:
        raise typer.Exit(1)


def _print(report, show_all: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{report.tested} vs {report.baseline}")
    for col in ("layer", "shape", "max abs", "max rel", "cosine", "flags", ""):
        table.add_column(col)
    rows = report.layers if show_all else [l for l in report.layers if not l.ok] + [report.layers[-1]]
    for l in rows:
        table.add_row(l.path, "×".join(map(str, l.shape)), f"{l.max_abs:.3g}", f"{l.max_rel:.3g}",
                      f"{l.cosine:.6f}", ",".join(l.flags), "ok" if l.ok else "[red]FAIL[/red]")
    console = Console()
    console.print(table)
    if report.passed:
        console.print(f"[green]passed[/green]: {len(report.layers)} layer outputs within {report.dtype} tolerance")
    else:
        bad = sum(not l.ok for l in report.layers)
        console.print(f"[red]failed[/red]: first diverging layer [bold]{report.first_failure}[/bold] "
                      f"({bad} of {len(report.layers)} outputs beyond tolerance)")
