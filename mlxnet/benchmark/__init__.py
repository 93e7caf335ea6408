"""``mlxnet bench``: each model's default forward timed on this machine, optionally against
PyTorch on the same device, one row per model, batch size and dtype.

A row holds the median and spread of the timed calls (warm-up excluded), images per second,
MLX's peak memory over one forward (weights included; each row measured after earlier rows
were freed) and the primitives one forward runs (about one kernel launch each).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable

import mlxnet

from ..errors import MlxnetError
from . import measure
from .workloads import ALIASES, DEFAULT, entries

COMPARISONS = ("torch", "torch-compile", "eager")


@dataclass
class Row:
    model: str
    batch: int
    dtype: str
    size: str
    ms: float
    spread_ms: float
    images_per_s: float
    peak_mb: float
    launches: int
    torch_ms: float | None = None
    torch_spread_ms: float | None = None
    torch_dtype: str | None = None
    torch_compile_ms: float | None = None
    eager_ms: float | None = None
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolve(ids: Iterable[str]) -> list[str]:
    """Benchmark ids for the names given (a registered model stands for its parts); the
    default set where none is given."""
    known = entries()
    chosen: list[str] = []
    for name in list(ids) or DEFAULT:
        parts = ALIASES.get(name, (name,))
        for part in parts:
            if part not in known:
                raise MlxnetError(f"bench: unknown model {name!r}; expected one of "
                                  f"{', '.join(sorted(set(known) | set(ALIASES)))}")
            if part not in chosen:
                chosen.append(part)
    return chosen


def plan(ids: list[str], batches: list[int], dtypes: list[str]) -> list[tuple[str, int, str]]:
    """(id, batch, dtype) of every row."""
    return [(name, b, d) for name in ids for b in batches for d in dtypes]


def measure_row(name: str, batch: int, dtype: str, device: str, compare: set[str],
                reps: int, warmup: int) -> Row:
    entry = entries()[name]
    work = entry.build(device, batch, dtype)
    runs: dict[str, Callable[[], None]] = {"mlxnet": measure.mlx_runner(work.forward)}
    if "eager" in compare:
        runs["eager"] = measure.mlx_runner(work.forward, compiled=False)
    note, torch_side = work.note, None
    if compare & {"torch", "torch-compile"}:
        if work.torch is None:
            note = "no PyTorch baseline"
        else:
            try:
                torch_side = work.torch()
            except ImportError as e:
                note = f"no PyTorch baseline: {e}"
    if torch_side is not None:
        note = "; ".join(n for n in (work.note, torch_side.note) if n)
        if "torch" in compare:
            runs["torch"] = measure.torch_runner(torch_side.module, torch_side.inputs, device)
        if "torch-compile" in compare:
            import torch

            compiled = torch.compile(torch_side.module, mode="reduce-overhead")
            runs["torch-compile"] = measure.torch_runner(compiled, torch_side.inputs, device)
    pause = 0.25 if device == "cpu" and len(runs) > 1 else 0.0
    # torch.compile compiles on its first calls: more warm-up where it runs.
    times = measure.time_alternating(runs, warmup + 3 * ("torch-compile" in runs), reps, pause)
    ms, spread = measure.summary(times["mlxnet"])
    row = Row(name, batch, dtype, entry.size, ms, spread, batch * 1e3 / ms,
              measure.peak_bytes(runs["mlxnet"]) / 2**20,
              measure.launches(work.forward, mlxnet.compile_enabled()), note=note)
    if "torch" in times:
        row.torch_ms, row.torch_spread_ms = measure.summary(times["torch"])
        row.torch_dtype = torch_side.dtype
    if "torch-compile" in times:
        row.torch_compile_ms = measure.summary(times["torch-compile"])[0]
    if "eager" in times:
        row.eager_ms = measure.summary(times["eager"])[0]
    return row


def run(ids: Iterable[str] = (), batches: Iterable[int] = (1,), dtypes: Iterable[str] = ("float32",),
        *, device: str | None = None, compare: Iterable[str] = (), reps: int | None = None,
        warmup: int = 2, on_start: Callable[[int, int, str, int, str], None] | None = None,
        on_row: Callable[[Row], None] | None = None,
        on_error: Callable[[str, int, str, Exception], None] | None = None) -> list[Row]:
    """Measure every (model, batch, dtype) row on ``device`` (default: the current one).
    ``on_start(i, n, model, batch, dtype)`` runs before a row and ``on_row(row)`` after it. A
    row that fails (out of memory, a baseline that breaks) goes to ``on_error(model, batch,
    dtype, error)`` and the others still run; without ``on_error`` it raises."""
    device = device or str(mlxnet.current_device())
    compare = set(compare)
    unknown = compare - set(COMPARISONS)
    if unknown:
        raise MlxnetError(f"bench: unknown comparison {sorted(unknown)[0]!r}; expected "
                          f"{', '.join(COMPARISONS)}")
    batches, dtypes = list(batches), list(dtypes)
    for b in batches:
        if not isinstance(b, int) or b < 1:
            raise MlxnetError(f"bench: batch sizes must be positive integers, got {b!r}")
    for d in dtypes:
        if d not in ("float32", "float16", "bfloat16"):
            raise MlxnetError(f"bench: dtype must be float32, float16 or bfloat16, got {d!r}")
    rows_planned = plan(resolve(ids), batches, dtypes)
    reps = reps or (20 if device == "gpu" else 5)
    if reps < 1 or warmup < 0:
        raise MlxnetError(f"bench: reps must be >= 1 and warmup >= 0, got reps={reps}, warmup={warmup}")
    rows = []
    with mlxnet.use_device(device):
        mlxnet.native_info(build=device == "cpu")  # build or load the CPU primitives before timing
        for i, (name, batch, dtype) in enumerate(rows_planned):
            if on_start:
                on_start(i, len(rows_planned), name, batch, dtype)
            try:
                row = measure_row(name, batch, dtype, device, compare, reps, warmup)
            except Exception as e:  # noqa: BLE001 - one failing row must not lose the others
                if on_error is None:
                    raise
                on_error(name, batch, dtype, e)
                continue
            finally:
                measure.free()
            rows.append(row)
            if on_row:
                on_row(row)
    return rows
