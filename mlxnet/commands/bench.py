"""`mlxnet bench`: time each model's default forward on this machine (optionally against
PyTorch on the same device) and print a table, so any Mac can measure itself."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from mlxnet.commands import grammar
from mlxnet.errors import MlxnetError

DTYPES = ("float32", "float16", "bfloat16")


def _split_values(models: list[str], batch: list[str], dtype: list[str]) -> tuple[list[str], list[int], list[str]]:
    """``--batch 1 8 --dtype float32 float16``: an option takes one value, so the values after
    the first land among the MODEL arguments. No model id is an integer or a dtype name, so they
    go back to their options; commas (``--batch 1,8``) work too."""
    names, batches, dtypes = [], [], []
    for raw in [v for b in batch for v in b.split(",") if v]:
        try:
            batches.append(int(raw))
        except ValueError:
            raise MlxnetError(f"--batch takes positive integers, got {raw!r}") from None
    dtypes = [v for d in dtype for v in d.split(",") if v]
    for token in models:
        if token.isdigit():
            batches.append(int(token))
        elif token in DTYPES:
            dtypes.append(token)
        else:
            names.append(token)
    return names, batches or [1], dtypes or ["float32"]


def bench(
    models: Optional[List[str]] = typer.Argument(
        None, help="Models to time (default: resnet50 yolov8n yolov8s sam-tiny lama); --list shows all.",
        show_default=False),
    batch: List[str] = typer.Option(["1"], "--batch", "-b", metavar="N", help="Batch sizes: --batch 1 8 (or 1,8)."),
    dtype: List[str] = typer.Option(["float32"], "--dtype", metavar="DTYPE",
                                    help="float32, float16, bfloat16: --dtype float32 float16 (each measured as "
                                         "asked, half precision on the CPU included: bench shows its cost)."),
    compare: List[str] = typer.Option([], "--compare",
                                      help="Also time: torch (PyTorch on the same device), torch-compile, "
                                           "eager (mlxnet uncompiled)."),
    reps: Optional[int] = typer.Option(None, "--reps", min=1, help="Timed calls per row (default: 5 on the CPU, 20 on a GPU)."),
    warmup: int = typer.Option(2, "--warmup", min=0, help="Untimed calls before them."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Also write the report (machine, rows) as JSON to this file."),
    markdown: Optional[Path] = typer.Option(None, "--markdown", help="Print a JSON report's table as markdown and exit."),
    list_ids: bool = typer.Option(False, "--list", help="List the benchmark ids and exit."),
    device: Optional[str] = grammar.device(),
) -> None:
    """Time each model's default forward: median ± spread, images/s, peak memory, launches."""
    import mlxnet
    from mlxnet import benchmark
    from mlxnet.benchmark import machine, report
    from mlxnet.benchmark.workloads import ALIASES, entries

    if markdown is not None:
        print(report.markdown(report.read_rows(markdown)))
        return
    if list_ids:
        for name, entry in entries().items():
            print(f"{name:18s} {entry.size}")
        for alias, parts in ALIASES.items():
            print(f"{alias:18s} = {' + '.join(parts)}")
        return
    grammar.apply_device(device)
    names, batches, dtypes = _split_values(models or [], batch, dtype)
    device = str(mlxnet.current_device())
    info = machine.describe(device)
    compare_set = {c for item in compare for c in item.split(",") if c}
    if compare_set & {"torch", "torch-compile"}:
        try:
            import torch

            from mlxnet.benchmark.measure import torch_device

            info["torch"] = f"{torch.__version__} on {torch_device(device)}, {torch.get_num_threads()} threads"
        except ImportError:
            raise MlxnetError("--compare torch needs PyTorch (pip install torch)") from None
    settings = {"models": names, "batch": batches, "dtype": dtypes, "compare": sorted(compare_set),
                "reps": reps, "warmup": warmup}
    for line in machine.summary(info):
        print(line)
    print(report.HEADER)
    rows: list = []
    failures: list[dict] = []

    def start(i: int, n: int, name: str, b: int, d: str) -> None:
        print(f"[{i + 1}/{n}] {name} batch {b} {d} ...", file=sys.stderr, flush=True)

    def done(row) -> None:
        rows.append(row)
        print(report.table_row(row), flush=True)
        if json_path is not None:
            report.write_json(json_path, info, settings, rows, failures)

    def failed(name: str, b: int, d: str, error: Exception) -> None:
        text = str(error).splitlines()[0] if str(error) else type(error).__name__
        failures.append({"model": name, "batch": b, "dtype": d, "error": f"{type(error).__name__}: {text}"})
        print(f"{name[:16]:16s} {b:2d} {d:8s} failed: {type(error).__name__}: {text}"[:200], flush=True)
        if json_path is not None:
            report.write_json(json_path, info, settings, rows, failures)

    benchmark.run(names, batches, dtypes, device=device, compare=compare_set, reps=reps, warmup=warmup,
                  on_start=start, on_row=done, on_error=failed)
    notes = sorted({f"{r.model}: {r.note}" for r in rows if r.note})
    print(report.LEGEND)
    for note in notes:
        print(f"  {note}")
    if failures:
        raise typer.Exit(1)
