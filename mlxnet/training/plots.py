"""``results.png``: each column of ``results.csv`` against the epoch, one small chart a column,
as ultralytics lays out its results plot (the losses in the top row, the metrics below). Drawn
with Pillow, so it needs no plotting library."""
from __future__ import annotations

import io
from typing import Mapping, Sequence

from PIL import Image, ImageDraw

PANELS = ("train/box_loss", "train/cls_loss", "train/dfl_loss", "metrics/precision(B)", "metrics/recall(B)",
          "lr/pg0", "lr/pg2", "metrics/mAP50(B)", "metrics/mAP50-95(B)", "time")
CELL_W, CELL_H, MARGIN = 300, 220, 36
LINE, POINT, AXIS, TEXT = (31, 119, 180), (255, 127, 14), (120, 120, 120), (20, 20, 20)


def _panel(draw: ImageDraw.ImageDraw, x0: int, y0: int, title: str, xs: Sequence[float], ys: Sequence[float]) -> None:
    left, top, right, bottom = x0 + MARGIN + 10, y0 + MARGIN, x0 + CELL_W - 12, y0 + CELL_H - MARGIN
    draw.text((x0 + 10, y0 + 8), title, fill=TEXT)
    draw.rectangle([left, top, right, bottom], outline=AXIS)
    if not ys:
        return
    lo, hi = min(ys), max(ys)
    if hi == lo:
        lo, hi = lo - 0.5 * (abs(lo) or 1), hi + 0.5 * (abs(hi) or 1)
    x_lo, x_hi = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    points = [(left + (x - x_lo) / (x_hi - x_lo) * (right - left), bottom - (y - lo) / (hi - lo) * (bottom - top))
              for x, y in zip(xs, ys)]
    if len(points) > 1:
        draw.line(points, fill=LINE, width=2)
    for px, py in points:
        draw.ellipse([px - 2.5, py - 2.5, px + 2.5, py + 2.5], fill=POINT)
    draw.text((x0 + 4, top - 4), f"{hi:.3g}", fill=AXIS)
    draw.text((x0 + 4, bottom - 10), f"{lo:.3g}", fill=AXIS)
    draw.text((left, bottom + 6), f"{x_lo:g}", fill=AXIS)
    draw.text((right - 24, bottom + 6), f"{x_hi:g}", fill=AXIS)


def plot_results(rows: Sequence[Mapping[str, float]]) -> bytes:
    """PNG bytes of the chart of ``rows`` (one mapping per epoch, ``epoch`` plus the columns)."""
    columns = 5
    image = Image.new("RGB", (CELL_W * columns, CELL_H * 2), "white")
    draw = ImageDraw.Draw(image)
    xs = [float(r["epoch"]) for r in rows]
    for i, name in enumerate(PANELS):
        ys = [float(r[name]) for r in rows if name in r]
        _panel(draw, (i % columns) * CELL_W, (i // columns) * CELL_H, name, xs[:len(ys)], ys)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()
