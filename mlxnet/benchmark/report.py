"""Benchmark rows as people read them: an 80-column table, markdown for the benchmark page (docs/benchmarks.md), JSON."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..image import atomic_write_bytes
from . import Row

HEADER = (f"{'model':16s} {'b':>2s} {'dtype':8s} {'ms':>7s} {'±':>5s} {'img/s':>6s} "
          f"{'MB':>6s} {'ops':>5s} {'torch':>7s} {'ratio':>6s}")


def _num(value: float | None, width: int, digits: int = 2) -> str:
    return f"{value:{width}.{digits}f}" if value is not None else f"{'-':>{width}s}"


def table_row(r: Row) -> str:
    """One line of at most 80 columns; ratio = PyTorch ms / mlxnet ms (above 1: mlxnet faster)."""
    ratio = f"{r.torch_ms / r.ms:5.2f}x" if r.torch_ms else f"{'-':>6s}"
    return (f"{r.model[:16]:16s} {r.batch:2d} {r.dtype:8s} {_num(r.ms, 7)} {_num(r.spread_ms, 5)} "
            f"{_num(r.images_per_s, 6, 1)} {_num(r.peak_mb, 6, 0)} {r.launches:5d} "
            f"{_num(r.torch_ms, 7)} {ratio}")


LEGEND = """\
ms: median of the timed calls; ±: half their interquartile range
img/s: images per second
MB: MLX's peak memory over one forward, weights included
ops: primitives per forward (about one kernel launch each)
torch: PyTorch on the same device (--compare torch); ratio: torch ms / mlxnet ms"""


def markdown(rows: list[dict[str, Any]]) -> str:
    """The benchmark page's table of a JSON report's rows."""
    eager = any(r.get("eager_ms") for r in rows)
    compiled = any(r.get("torch_compile_ms") for r in rows)
    head = ["model", "batch", "dtype", "mlxnet ms", "images/s", "peak MB", "launches"]
    head += ["mlxnet eager ms"] if eager else []
    head += ["PyTorch ms"] + (["torch.compile ms"] if compiled else []) + ["PyTorch / mlxnet"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def ms(v: float | None) -> str:
        return f"{v:.2f}" if v else "—"
    for r in rows:
        cells = [r["model"], str(r["batch"]), r["dtype"], f"{r['ms']:.2f} ± {r['spread_ms']:.2f}",
                 f"{r['images_per_s']:.1f}", f"{r['peak_mb']:.0f}", str(r["launches"])]
        cells += [ms(r.get("eager_ms"))] if eager else []
        cells += [ms(r.get("torch_ms"))] + ([ms(r.get("torch_compile_ms"))] if compiled else [])
        cells.append(f"{r['torch_ms'] / r['ms']:.2f}×" if r.get("torch_ms") else "—")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_json(path: Path, machine: dict[str, Any], settings: dict[str, Any], rows: list[Row],
               failures: list[dict[str, Any]]) -> None:
    """The report, replaced atomically (a run cut short keeps the rows it measured)."""
    report = {"machine": machine, "settings": settings, "rows": [r.as_dict() for r in rows],
              "failures": failures}
    atomic_write_bytes(path, (json.dumps(report, indent=1) + "\n").encode())


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON report, checked enough to name the file when it is not one."""
    from ..errors import MlxnetError

    try:
        rows = json.loads(Path(path).read_text())["rows"]
        for r in rows:
            r["model"], r["ms"]  # noqa: B018 - the keys every table needs
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise MlxnetError(f"{path}: not an mlxnet bench report ({type(e).__name__}: {e})") from None
    return rows
